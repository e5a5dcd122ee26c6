# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""PCI addresses, ID filters and the PCI devices seen through sysfs.

Facts (kernel drivers/pci/pci-sysfs.c, drivers/pci/iov.c): devices live in bus/pci/devices/<BDF>
(links into devices/...); a PF links its VFs as virtfn<N>, a VF links its PF as physfn; `driver` and
`iommu_group` are links whose last element names the driver / group. The VFs are those the kernel
linked (the PF's `virtfn<N>` entries); their addresses come from the kernel's own routing-ID arithmetic
(drivers/pci/iov.c pci_iov_virtfn_bus/devfn: PF routing ID + sriov_offset + N * sriov_stride, the values
the kernel used when it added them), read from the PF's `sriov_offset`/`sriov_stride`, so no link per VF
is read: one readlink, of the highest `virtfn<N>`, checks the result. Without those attributes, or when that
link disagrees (or cannot be read), each link is read. Never a model's assumed offset (L40S VFs start at
function 4, RTX PRO 6000 at .2).
"""

from __future__ import annotations

import re

from ansible_collections.accelops.vgpu.plugins.module_utils.gpu_models import NVIDIA_VENDOR  # noqa: F401 pylint: disable=unused-import
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import SysfsError

PCI_DEVICES = "bus/pci/devices"
_FULL_BDF = re.compile(r"^([0-9a-f]{4}):([0-9a-f]{2}):([0-1][0-9a-f])\.([0-7])$")
_SHORT_BDF = re.compile(r"^([0-9a-f]{2}):([0-1][0-9a-f])\.([0-7])$")
_HEX4 = re.compile(r"^(?:0x)?([0-9a-f]{4})$")


class PciAddressError(ValueError):
    """An input that is not a PCI address or ID filter; the message names the input."""


def parse_address(text):
    """Normalise `0000:41:00.0` / `41:00.0` (any case) to `0000:41:00.0`; reject anything else."""
    value = str(text).strip().lower()
    match = _FULL_BDF.match(value)
    if match:
        return value
    match = _SHORT_BDF.match(value)
    if match:
        return "0000:" + value
    raise PciAddressError("%r is not a PCI address (expected DDDD:BB:DD.F, e.g. 0000:41:00.0)" % str(text)[:64])


def parse_id_filter(text):
    """A vendor/device filter -> (vendor, device) as 4-digit lower-case hex strings.

    Accepts vgpu-device-manager's `0x<device><vendor>` form (`0x26B910DE` = L40S) and the
    lspci / KubeVirt form `10de:26b9`.
    """
    value = str(text).strip().lower()
    if ":" in value:
        vendor, dummy, device = value.partition(":")
        vm, dm = _HEX4.match(vendor), _HEX4.match(device)
        if vm and dm:
            return vm.group(1), dm.group(1)
    else:
        hexpart = value[2:] if value.startswith("0x") else value
        if re.match(r"^[0-9a-f]{8}$", hexpart):
            return hexpart[4:], hexpart[:4]
    raise PciAddressError("%r is not a PCI ID filter (expected 0xDDDDVVVV like 0x26B910DE, or vvvv:dddd)" % str(text)[:64])


def vendor_selector(vendor, device):
    """KubeVirt's pciVendorSelector form: upper-case `10DE:26B9`."""
    return ("%s:%s" % (vendor, device)).upper()


class PciDevice:
    """One PCI function as sysfs shows it. Attributes are read lazily and cached per instance."""

    def __init__(self, sysfs, address):
        self.sysfs = sysfs
        self.address = address
        self.base = "%s/%s" % (PCI_DEVICES, address)
        self._cache = {}

    def __repr__(self):
        return "PciDevice(%s)" % self.address

    def attr(self, name):
        return "%s/%s" % (self.base, name)

    def _hex_id(self, name):
        if name not in self._cache:
            value = self.sysfs.read_int(self.attr(name))
            self._cache[name] = None if value is None else "%04x" % value
        return self._cache[name]

    @property
    def exists(self):
        return self.sysfs.isdir(self.base)

    @property
    def vendor(self):
        return self._hex_id("vendor")

    @property
    def device(self):
        return self._hex_id("device")

    @property
    def class_code(self):
        if "class" not in self._cache:
            self._cache["class"] = self.sysfs.read_int(self.attr("class"), 0)
        return self._cache["class"]

    @property
    def is_display(self):
        """PCI base class 0x03 (VGA 0x0300, 3D controller 0x0302): a GPU."""
        return (self.class_code >> 16) == 0x03

    @property
    def driver(self):
        return self.sysfs.link_name(self.attr("driver"))

    @property
    def iommu_group(self):
        return self.sysfs.link_name(self.attr("iommu_group"))

    @property
    def physfn(self):
        return self.sysfs.link_name(self.attr("physfn"))

    @property
    def is_vf(self):
        return self.physfn is not None

    @property
    def sriov_capable(self):
        return self.sysfs.exists(self.attr("sriov_totalvfs"))

    @property
    def sriov_totalvfs(self):
        return self.sysfs.read_int(self.attr("sriov_totalvfs"), 0)

    @property
    def sriov_numvfs(self):
        return self.sysfs.read_int(self.attr("sriov_numvfs"), 0)

    def virtfns(self):
        """VF addresses in virtfn order (virtfn0, virtfn1, ... numerically, not lexically): one per `virtfn<N>`
        entry the kernel made, its address by the kernel's arithmetic (module doc) when the highest link agrees,
        else by its link."""
        names = virtfn_names(self.sysfs.listdir(self.base))
        if not names:
            return []
        computed = self.vf_addresses([int(name[6:]) for name in names])
        if computed is not None and self._link_agrees(names[-1], computed[-1]):
            return computed
        targets = (self.sysfs.link_name(self.attr(name)) for name in names)
        return [target for target in targets if target]

    def _link_agrees(self, name, address):
        """Whether the link `name` (the highest virtfn: the one the arithmetic is likeliest to get wrong, its
        routing ID the farthest from the PF's) points to `address`: one readlink per PF checks the computed list;
        a mismatch or any error reads every link instead."""
        try:
            return self.sysfs.link_name(self.attr(name)) == address
        except (SysfsError, OSError):
            return False

    def vf_addresses(self, indices):
        """[address of VF N for N in indices] from sriov_offset/sriov_stride, or None where the kernel does not
        show them (or they make no sense: a stride of 0 for several VFs, a routing ID past the domain's buses)."""
        offset = self.sysfs.read_int(self.attr("sriov_offset"))
        stride = self.sysfs.read_int(self.attr("sriov_stride"))
        if offset is None or stride is None or offset < 1 or stride < 0 or (stride == 0 and len(indices) > 1):
            return None
        domain, bus, rest = self.address.split(":")
        slot, function = rest.split(".")
        routing_id = (int(bus, 16) << 8) | (int(slot, 16) << 3) | int(function, 16)
        found = []
        for index in indices:
            vf_id = routing_id + offset + stride * index
            if vf_id > 0xffff:
                return None
            found.append("%s:%02x:%02x.%x" % (domain, vf_id >> 8, (vf_id >> 3) & 0x1f, vf_id & 0x7))
        return found

    @property
    def id_pair(self):
        return (self.vendor, self.device)


def virtfn_names(entries):
    """The `virtfn<N>` names among a PF directory's `entries`, in N order (numerically, not lexically)."""
    return sorted((name for name in entries if name.startswith("virtfn") and name[6:].isdigit()),
                  key=lambda name: int(name[6:]))


def list_addresses(sysfs):
    """Every PCI address below bus/pci/devices, sorted."""
    found = []
    for name in sysfs.listdir(PCI_DEVICES):
        try:
            found.append(parse_address(name))
        except PciAddressError:
            continue
    return sorted(found)


def get_device(sysfs, address):
    """A PciDevice for a validated address that exists, else a one-line error naming it."""
    addr = parse_address(address)
    dev = PciDevice(sysfs, addr)
    if not dev.exists:
        raise SysfsError("%s/%s" % (PCI_DEVICES, addr), 2, "find", "no PCI device %s" % addr)
    return dev
