# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""vGPU types: the driver's type lists, profile names and the names the cluster sees.

Formats (harvester/pcidevices `pkg/util/gpuhelper/gpuhelper.go` and its sysfs fixture, `pkg/util/common/common.go`;
NVIDIA/go-nvlib `pkg/nvmdev/nvmdev.go` parseMdevTypeName; NVIDIA/vgpu-device-manager `api/spec/v1/spec.go`):
- vendor-specific VFIO: `<VF>/nvidia/creatable_vgpu_types` lists `ID : full name` lines, with an
  optional `ID    : vGPU Name` header (Harvester fixture) or without it (H200 README);
  `<VF>/nvidia/current_vgpu_type` holds `0` or the numeric ID of the type set on the VF.
- mdev: `<parent>/mdev_supported_types/nvidia-<N>/{name,available_instances,description}`.
- Short name = last whitespace-separated token of the full name (VDM go-nvlib parseMdevTypeName):
  `NVIDIA RTX Pro 6000 Blackwell DC-48C` -> `DC-48C`, `GRID T4-1Q` -> `T4-1Q`.
- Profile names: `<model>-<GB><series>` or MIG-backed `<model>-<slices>-<GB><series>`, optionally
  with a VDM suffix ME/NOME/MEALL/GFX that VDM strips when the driver's name lacks it.
- Resource names follow Harvester: `nvidia.com/` + full name, whitespace, `/` and `.` -> `_`.
"""

from __future__ import annotations

import re
from collections import namedtuple

from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError

PCI_DEVICES = "bus/pci/devices"
MDEV_BUS = "class/mdev_bus"
MDEV_DEVICES = "bus/mdev/devices"
VDM_SUFFIXES = ("MEALL", "NOME", "ME", "GFX")
_PROFILE = re.compile(
    r"^(?P<model>.+?)-(?:(?P<slices>\d+)-)?(?P<size>\d+)(?P<series>[A-Z])(?P<suffix>MEALL|NOME|ME|GFX)?\Z")
_HEADER_KEYS = ("id", "vgpu name")


class VgpuTypeError(EngineError):
    """A type list or profile name that cannot be understood; the message names it."""


class VgpuType(namedtuple("VgpuType", "type_id name")):
    """One vGPU type as the driver lists it: numeric ID and full name (`NVIDIA L40S-24Q`)."""

    __slots__ = ()

    @property
    def short(self):
        return short_name(self.name)


class ProfileName(namedtuple("ProfileName", "model slices size_gb series suffix")):
    """A parsed profile: `H200X-1-18C` -> model H200X, 1 MIG slice, 18 GB, series C."""

    __slots__ = ()

    @property
    def mig_backed(self):
        return self.slices is not None


class MdevType(namedtuple("MdevType", "parent dirname name available_instances description")):
    """One `mdev_supported_types/nvidia-<N>` entry of an mdev parent."""

    __slots__ = ()

    @property
    def short(self):
        return short_name(self.name)

    @property
    def type_path(self):
        return "%s/%s/mdev_supported_types/%s" % (MDEV_BUS, self.parent, self.dirname)


def short_name(full_name):
    """`NVIDIA L40S-24Q` -> `L40S-24Q`; a name without spaces is returned trimmed."""
    parts = str(full_name).split()
    return parts[-1] if parts else ""


def parse_creatable(text):
    """`creatable_vgpu_types` text -> [VgpuType] in file order.

    Splits each line on the first `:`; skips blank lines and the `ID : vGPU Name` header; tolerates
    any whitespace around the parts. A line whose ID is not a decimal number is an error naming it.
    """
    found = []
    for raw in str(text or "").splitlines():
        line = raw.strip()
        if not line:
            continue
        key, sep, value = line.partition(":")
        key, value = key.strip(), " ".join(value.split())
        if key.lower() in _HEADER_KEYS or value.lower() in _HEADER_KEYS:
            continue
        if not sep or not key.isdigit() or not value:
            raise VgpuTypeError("creatable_vgpu_types line %r is not 'ID : name'" % line[:80])
        found.append(VgpuType(int(key), value))
    return found


def parse_profile(name):
    """A short profile name -> ProfileName; a full name is reduced to its short name first."""
    short = short_name(name)
    match = _PROFILE.match(short)
    if not match:
        raise VgpuTypeError("%r is not a vGPU profile name (expected e.g. L40S-24Q or H200X-1-18C)"
                            % str(name)[:64])
    slices = match.group("slices")
    return ProfileName(match.group("model"), int(slices) if slices else None, int(match.group("size")),
                       match.group("series"), match.group("suffix"))


def mig_backed(name):
    """True for a MIG-backed profile or type name (`H100-1-20C`, `NVIDIA H200X-1-18CME`)."""
    try:
        return parse_profile(name).mig_backed
    except VgpuTypeError:
        return False


def _strip_suffix(short):
    for suffix in VDM_SUFFIXES:
        if short.endswith(suffix) and _PROFILE.match(short[:-len(suffix)]):
            return short[:-len(suffix)]
    return short


def find_type(wanted, types):
    """The entry of `types` (VgpuType or MdevType) that the user's profile name means, or None.

    Users may give the short name (`L40S-24Q`) or the full name (`NVIDIA L40S-24Q`), any case.
    Like VDM, a MIG suffix (`ME`, `NOME`, `MEALL`, `GFX`) the driver's names lack is ignored.
    """
    text = " ".join(str(wanted).split()).lower()
    by_full = dict((t.name.lower(), t) for t in types)
    if text in by_full:
        return by_full[text]
    by_short = dict((t.short.lower(), t) for t in types)
    short = short_name(text)
    if short in by_short:
        return by_short[short]
    stripped = _strip_suffix(short.upper()).lower()
    return by_short.get(stripped)


def resource_name(full_name):
    """KubeVirt resource name for a type, Harvester's rule: `nvidia.com/NVIDIA_L40S-24Q`."""
    return "nvidia.com/" + re.sub(r"[\s/.]", "_", str(full_name).strip())


def parse_description(text):
    """mdev `description` (`num_heads=4, frl_config=45, framebuffer=1024M, ...`) -> dict of str."""
    fields = {}
    for part in str(text or "").split(","):
        key, sep, value = part.partition("=")
        if sep:
            fields[key.strip()] = value.strip()
    return fields


def framebuffer_mib(description):
    """Framebuffer in MiB from an mdev description (`1024M`, `24G`), or None."""
    value = parse_description(description).get("framebuffer", "")
    match = re.match(r"^(\d+)\s*([MG]?)", value, re.IGNORECASE)
    if not match:
        return None
    return int(match.group(1)) * (1024 if match.group(2).upper() == "G" else 1)


def vfio_dir(vf_address):
    return "%s/%s/nvidia" % (PCI_DEVICES, vf_address)


def read_creatable(sysfs, vf_address):
    """Types creatable on a VF right now (the list shrinks as siblings get types)."""
    return parse_creatable(sysfs.read_optional(vfio_dir(vf_address) + "/creatable_vgpu_types", ""))


def read_current(sysfs, vf_address):
    """Numeric ID of the type set on a VF; 0 = none, None = the VF has no vendor-VFIO directory."""
    return sysfs.read_int(vfio_dir(vf_address) + "/current_vgpu_type")


def has_vfio_types(sysfs, vf_address):
    return sysfs.exists(vfio_dir(vf_address) + "/current_vgpu_type")


def read_mdev_types(sysfs, parent):
    """[MdevType] of an mdev parent (PF on Turing, VF on Ampere SR-IOV), sorted by type number."""
    base = "%s/%s/mdev_supported_types" % (MDEV_BUS, parent)
    found = []
    for dirname in sysfs.listdir(base):
        name = sysfs.read_optional("%s/%s/name" % (base, dirname))
        if name is None:
            continue
        found.append(MdevType(parent, dirname, " ".join(name.split()),
                              sysfs.read_int("%s/%s/available_instances" % (base, dirname), 0),
                              sysfs.read_optional("%s/%s/description" % (base, dirname), "")))
    return sorted(found, key=lambda t: _natural_key(t.dirname))


def _natural_key(text):
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text)]


def mdev_parents(sysfs):
    """Addresses below class/mdev_bus (empty on vendor-VFIO hosts)."""
    return sysfs.listdir(MDEV_BUS)


def parse_smi_supported(text):
    """`nvidia-smi vgpu -s -v` output -> [VgpuType]: pairs of `vGPU Type ID : 0x..` and `Name : ..`.

    Used only to name type IDs that no creatable list shows any more (consumed types); tolerant of
    indentation, decimal or hex IDs, and unrelated lines.
    """
    found, pending = [], None
    for raw in str(text or "").splitlines():
        key, sep, value = raw.partition(":")
        if not sep:
            continue
        key, value = " ".join(key.split()).lower(), value.strip()
        if key == "vgpu type id":
            try:
                pending = int(value, 0)
            except ValueError:
                pending = None
        elif key == "name" and pending is not None and value:
            found.append(VgpuType(pending, " ".join(value.split())))
            pending = None
    return found
