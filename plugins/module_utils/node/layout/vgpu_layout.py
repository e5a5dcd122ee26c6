# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The desired vGPU layout: which profiles, how many, on which GPUs.

Two input forms, one result: a list of `LayoutEntry` (origin label, GPU selection, profile counts),
resolved against the node's GPUs into `{PF address: [LayoutEntry, ...]}` (every entry that selects
that GPU, in input order; the backend picks the last one whose profiles the GPU knows).

1. NVIDIA vgpu-device-manager config (NVIDIA/vgpu-device-manager `api/spec/v1/spec.go`), kept verbatim so
   files stay portable to the GPU Operator: `version: v1`, `vgpu-configs: {name: [entry, ...]}`,
   entry = `devices` (`all` or GPU indices), optional `device-filter` (`0x<device><vendor>` string
   or list, optionally `:0x<subdevice><subvendor>`), `vgpu-devices` ({profile: count}); unknown
   fields are rejected. GPU indices count NVIDIA GPUs (PFs, never VFs) in PCI address order; an
   index the node lacks selects nothing, as in VDM, so one file serves nodes of different sizes.
   VDM applies matching entries one after another; its `default` config therefore lists A16-8Q and
   A2-8Q for the shared ID 0x25B6. Here an entry whose profiles a GPU does not know is skipped for
   that GPU, and among the rest the last entry wins (VDM's outcome, without the failure).
2. The simple `layout` list: `[{devices: all | [PCI address or index], device_filter: ...,
   profiles: {L40S-24Q: 2}}]`. Explicit: a listed address or index that does not exist is an error.
"""

from __future__ import annotations

import json
import sys
from collections import OrderedDict, namedtuple

from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw import pci
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import pf_driver
from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout import device_selection
from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError, shown
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.vgpu_types import VgpuTypeError, parse_profile

VDM_TOP_KEYS = ("version", "vgpu-configs", "claim-time")   # claim-time: node/engine/claim_time_layout.py
VDM_ENTRY_KEYS = ("devices", "device-filter", "vgpu-devices")
LAYOUT_ENTRY_KEYS = ("devices", "device_filter", "profiles")


class LayoutError(EngineError):
    """A layout that cannot be applied; the message names the config, entry, GPU or profile."""


class Gpu(namedtuple("Gpu", "index address vendor device subsystem")):
    """An NVIDIA GPU (PF) with its VDM index (position in PCI address order)."""

    __slots__ = ()


class DeviceFilter(namedtuple("DeviceFilter", "vendor device subsystem")):
    """`0x26B910DE` -> vendor 10de, device 26b9; subsystem `(subvendor, subdevice)` or None."""

    __slots__ = ()

    def matches(self, gpu):
        if (self.vendor, self.device) != (gpu.vendor, gpu.device):
            return False
        return self.subsystem is None or self.subsystem == gpu.subsystem


class LayoutEntry(namedtuple("LayoutEntry", "origin devices filters profiles strict")):
    """One entry: `devices` is None (all) or a tuple of indices/addresses; `profiles` an OrderedDict."""

    __slots__ = ()

    def selects(self, gpu):
        if self.filters and not any(f.matches(gpu) for f in self.filters):
            return False
        return self.devices is None or gpu.index in self.devices or gpu.address in self.devices


def nvidia_gpus(sysfs, virtfns=None):
    """The node's NVIDIA GPUs (display-class PFs, VFs excluded) in PCI address order, indexed.

    Every sysfs read is a round trip (FUSE, or a slow driver attribute), and a node has far more VFs
    than PFs: a GPU's VFs are taken from its virtfn links (which a PF lists before its VFs come up in
    address order) and skipped without reading them; any other function costs its vendor first.
    `virtfns`, a dict, receives {PF address: [VF address, ...]} so callers need not read them again.
    """
    found, vfs_seen = [], set()
    virtfns = {} if virtfns is None else virtfns
    for address in pci.list_addresses(sysfs):
        if address in vfs_seen:
            continue
        dev = pci.PciDevice(sysfs, address)
        if dev.vendor != pci.NVIDIA_VENDOR or not dev.is_display or dev.is_vf:
            continue
        virtfns[address] = dev.virtfns()
        vfs_seen.update(virtfns[address])
        subvendor = sysfs.read_int(dev.attr("subsystem_vendor"))
        subdevice = sysfs.read_int(dev.attr("subsystem_device"))
        subsystem = ("%04x" % subvendor, "%04x" % subdevice) if subvendor is not None and subdevice is not None else None
        found.append(Gpu(len(found), address, dev.vendor, dev.device, subsystem))
    return found


def _parse_filter(text, origin):
    value = str(text).strip()
    main, sep, sub = value.partition(":")
    try:
        if sep and main.lower().startswith("0x") and sub.lower().startswith("0x"):
            vendor, device = pci.parse_id_filter(main)
            return DeviceFilter(vendor, device, pci.parse_id_filter(sub))
        vendor, device = pci.parse_id_filter(value)
    except pci.PciAddressError as exc:
        raise LayoutError("%s: device filter %s" % (origin, exc)) from None
    return DeviceFilter(vendor, device, None)


def _filters(value, origin):
    if value is None:
        return ()
    items = value if isinstance(value, list) else [value]
    if not items or not all(isinstance(i, str) for i in items):
        raise LayoutError("%s: device filter must be a string or a list of strings like 0x26B910DE" % origin)
    return tuple(_parse_filter(i, origin) for i in items)


def _profiles(value, origin, field):
    if not isinstance(value, dict):
        raise LayoutError("%s: %s must be a mapping of profile name to count" % (origin, field))
    result = OrderedDict()
    for name, count in value.items():
        label = "%s: profile %s" % (origin, shown(name))
        try:
            parse_profile(name)
        except VgpuTypeError as exc:
            raise LayoutError("%s: %s" % (origin, exc)) from None
        if isinstance(count, str) and count.strip().isdigit():
            count = int(count)  # templated values arrive as strings
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise LayoutError("%s: count %r must be a non-negative integer" % (label, count))
        result[str(name).strip()] = count
    return result


def _unknown_keys(entry, allowed, origin):
    if not isinstance(entry, dict):
        raise LayoutError("%s must be a mapping, not %s" % (origin, type(entry).__name__))
    unknown = sorted((k for k in entry if k not in allowed), key=str)
    if unknown:
        raise LayoutError("%s: unknown field(s) %s (allowed: %s)"
                          % (origin, ", ".join(repr(k) for k in unknown), ", ".join(allowed)))


def _vdm_devices(value, origin):
    if value == "all":
        return None
    items = value if isinstance(value, list) else [value]
    if not items or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in items):
        raise LayoutError("%s: devices must be 'all' or a list of GPU indices (0, 1, ...), not %r" % (origin, value))
    return _once_each(items, items, origin)


def _layout_devices(value, origin):
    if value is None or value == "all":
        return None
    items = value if isinstance(value, list) else [value]
    devices = []
    for item in items:
        if isinstance(item, int) and not isinstance(item, bool) and item >= 0:
            devices.append(item)
        elif isinstance(item, str) and item.isdigit():
            devices.append(int(item))
        else:
            try:
                devices.append(pci.parse_address(item))
            except pci.PciAddressError as exc:
                raise LayoutError("%s: devices: %s" % (origin, exc)) from None
    if not devices:
        raise LayoutError("%s: devices must be 'all' or a non-empty list of PCI addresses or GPU indices" % origin)
    return _once_each(devices, items, origin)


def _once_each(devices, items, origin):
    """The normalised devices as a tuple; two spellings of one device are an error (device_selection)."""
    selection = device_selection.Selection()
    try:
        for device, item in zip(devices, items):
            selection.spelling(device, item)
    except device_selection.SelectionError as err:
        raise LayoutError("%s: %s" % (origin, err)) from None
    return tuple(devices)


def from_vdm_config(config, selected=None):
    """A vgpu-device-manager config (parsed YAML/JSON) + config name -> [LayoutEntry]."""
    _unknown_keys(config, VDM_TOP_KEYS, "vGPU config")
    if config.get("version") != "v1":
        raise LayoutError("vGPU config: version must be 'v1', not %r" % (config.get("version"),))
    configs = config.get("vgpu-configs")
    if not isinstance(configs, dict) or not configs:
        raise LayoutError("vGPU config: vgpu-configs must be a non-empty mapping of config name to entries")
    if not selected:
        if len(configs) != 1:
            raise LayoutError("vGPU config: select one of %s (several configs, none selected)"
                              % ", ".join(shown(c) for c in sorted(configs, key=str)))
        selected = next(iter(configs))
    if selected not in configs:
        raise LayoutError("vGPU config: selected config %r not present (configs: %s)"
                          % (selected, ", ".join(shown(c) for c in sorted(configs, key=str))))
    parsed = {}
    for name, entries in configs.items():
        if not isinstance(entries, list) or not entries:
            raise LayoutError("vgpu-configs.%s must be a non-empty list of entries" % shown(name))
        parsed[name] = [_vdm_entry(entry, "vgpu-configs.%s[%d]" % (shown(name), pos)) for pos, entry in enumerate(entries)]
    return parsed[selected]


def _vdm_entry(entry, origin):
    _unknown_keys(entry, VDM_ENTRY_KEYS, origin)
    for required in ("devices", "vgpu-devices"):
        if required not in entry:
            raise LayoutError("%s: %s is required" % (origin, required))
    return LayoutEntry(origin, _vdm_devices(entry["devices"], origin), _filters(entry.get("device-filter"), origin),
                       _profiles(entry["vgpu-devices"], origin, "vgpu-devices"), False)


def from_layout(layout):
    """The simple layout list -> [LayoutEntry]."""
    if not isinstance(layout, list) or not layout:
        raise LayoutError("layout must be a non-empty list of entries")
    entries = []
    for pos, entry in enumerate(layout):
        origin = "layout[%d]" % pos
        _unknown_keys(entry, LAYOUT_ENTRY_KEYS, origin)
        if "profiles" not in entry:
            raise LayoutError("%s: profiles is required" % origin)
        entries.append(LayoutEntry(origin, _layout_devices(entry.get("devices"), origin),
                                   _filters(entry.get("device_filter"), origin),
                                   _profiles(entry["profiles"], origin, "profiles"), True))
    return entries


def entries(config=None, selected=None, layout=None):
    """[LayoutEntry] from whichever input form was given (the module's and the CLI's options)."""
    if config is not None and layout is not None:
        raise LayoutError("give either a vGPU config or a layout, not both")
    if config is not None:
        return from_vdm_config(config, selected)
    if layout is not None:
        if selected:
            raise LayoutError("selected names a config of a vGPU config; a layout has none")
        return from_layout(layout)
    raise LayoutError("no layout given: pass a vGPU config (and the selected config name) or a layout")


def from_document(document, selected=None, source="the file"):
    """A parsed file: a VDM config (has `vgpu-configs`), a layout list, or `{layout: [...]}`.

    `source` (the path or a label) starts every error, so a message always names the file.
    """
    try:
        if isinstance(document, dict) and "vgpu-configs" in document:
            return entries(config=document, selected=selected)
        if isinstance(document, dict) and "layout" in document and set(document) <= {"layout", "claim_time"}:
            return entries(layout=document["layout"], selected=selected)
        if isinstance(document, list):
            return entries(layout=document, selected=selected)
    except LayoutError as exc:
        raise LayoutError("%s: %s" % (source, exc)) from None
    raise LayoutError("%s is neither a vGPU config (version/vgpu-configs) nor a layout list (it parses as %s)"
                      % (source, type(document).__name__))


def from_file(path, selected=None):
    """[LayoutEntry] from a config or layout file (`-` = standard input); errors name the file."""
    return from_document(load_file(path), selected, "standard input" if path == "-" else path)


def load_file(path):
    """Read and parse a config or layout file (`-` = standard input)."""
    try:
        if path == "-":
            return load_document(sys.stdin.read(), "standard input")
        with open(path) as handle:
            return load_document(handle.read(), path)
    except OSError as exc:
        raise LayoutError("cannot read %s: %s" % (path, exc.strerror)) from None


def load_document(text, source):
    """JSON always; YAML when PyYAML happens to be importable (node-side code is stdlib-only)."""
    try:
        return json.loads(text)
    except ValueError as json_error:
        try:
            import yaml  # pylint: disable=import-outside-toplevel
        except ImportError:
            raise LayoutError("%s: not JSON (%s), and PyYAML is not installed to read YAML" % (source, json_error)) from None
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise LayoutError("%s: not valid YAML: %s" % (source, " ".join(str(exc).split())[:200])) from None


def resolve(entries, gpus, sysfs=None):
    """{PF address: [LayoutEntry selecting it, in order]} for every GPU some entry selects.

    Explicit devices of the simple layout must exist and be NVIDIA GPUs, each selected once per
    entry (by address or index); with `sysfs` an address that is no GPU is explained the way
    sriov_vfs explains it (no such device, a VF of <PF>).
    """
    for entry in entries:
        if entry.strict and entry.devices:
            _check_listed(entry, gpus, sysfs)
    selected = OrderedDict()
    for gpu in gpus:
        matching = [e for e in entries if e.selects(gpu)]
        if matching:
            selected[gpu.address] = matching
    return selected


def drop_reserved(selection, gpus, sysfs, take_over=(), whole=None):
    """`selection` without the GPUs passed through or held whole by a DRA claim (`whole`: claim_holders.held_whole;
    node/holders/pf_driver.py): [pf_driver.Skipped] of those `devices: all` or a filter selected; a GPU an entry
    names (address or index) is a LayoutError."""
    by_address = dict((g.address, g) for g in gpus)
    skipped = []
    for address in list(selection):
        why = pf_driver.reserved(sysfs, pci.PciDevice(sysfs, address), take_over, whole)
        if why is None:
            continue
        entry, named = naming_entry(selection[address], by_address[address])
        if entry is not None:
            raise LayoutError("%s: %s" % (entry.origin, pf_driver.named_error(named, why, whole=whole)))
        skipped.append(pf_driver.Skipped(address, pci.PciDevice(sysfs, address).driver, why))
        del selection[address]
    return skipped


def naming_entry(entries, gpu):
    """(the first of `entries` whose `devices` names `gpu` by address or index, how it names it), else (None, None):
    a GPU an entry names is refused with an error where `devices: all` or a filter would skip it."""
    for entry in entries:
        if entry.devices is not None and (gpu.index in entry.devices or gpu.address in entry.devices):
            named = "GPU index %d (%s)" % (gpu.index, gpu.address)
            return entry, (gpu.address if gpu.address in entry.devices else named)
    return None, None


def _check_listed(entry, gpus, sysfs):
    by_index = dict((g.index, g) for g in gpus)
    by_address = dict((g.address, g) for g in gpus)
    names = ", ".join(g.address for g in gpus) or "none"
    selection = device_selection.Selection()
    try:
        for device in entry.devices:
            gpu = by_index.get(device) if isinstance(device, int) else by_address.get(device)
            if gpu is None and isinstance(device, int):
                raise LayoutError("%s: GPU index %d does not exist on this node (NVIDIA GPUs: %s)"
                                  % (entry.origin, device, names))
            if gpu is None:
                if sysfs is not None:
                    device_selection.physical_function(sysfs, device)
                raise LayoutError("%s: devices: %s is not an NVIDIA GPU on this node (NVIDIA GPUs: %s)"
                                  % (entry.origin, device, names))
            selection.choose(gpu.address, device)
    except device_selection.SelectionError as err:
        raise LayoutError("%s: %s" % (entry.origin, err)) from None


def export_layout(gpu_profiles):
    """{PF address: {profile: count}} -> the simple layout list (what `export` prints)."""
    return [{"devices": [address], "profiles": dict(profiles)} for address, profiles in gpu_profiles.items()]


# Per-GPU targets and plans, shared by both backends (vgpu_vfio, vgpu_mdev).

def type_size_gb(vgpu_type):
    """Framebuffer size in GB from a type's profile name, or None for names that do not parse."""
    try:
        return parse_profile(vgpu_type.name).size_gb
    except VgpuTypeError:
        return None


def gpu_model(types, fallback=None):
    """The profile model (`L40S`, `A16`) the GPU's type names share, else `fallback`."""
    models = []
    for vgpu_type in types:
        try:
            models.append(parse_profile(vgpu_type.name).model)
        except VgpuTypeError:
            continue
    return max(set(models), key=models.count) if models else fallback


def choose_profiles(address, model, entries, find):
    """Pick the entry for one GPU and resolve its profiles: {driver type: count}.

    `find(profile)` returns the driver's type for a user's profile name or None. Entries with a
    profile the GPU does not know are skipped; the last remaining entry wins (VDM applies entries in
    order). When none remains, the first unknown profile is the error.
    """
    chosen, first_miss = None, None
    for entry in entries:
        resolved, miss = OrderedDict(), None
        for profile, count in entry.profiles.items():
            found = find(profile)
            if found is None:
                miss = miss or profile
            else:
                resolved[found] = resolved.get(found, 0) + count
        if miss is None:
            chosen = (entry, resolved)
        elif first_miss is None:
            first_miss = (entry, miss)
    if chosen is not None:
        return chosen
    entry, profile = first_miss
    raise LayoutError("GPU %s (%s): profile %s (%s) %s" % (address, model or "unknown model", profile, entry.origin,
                                                           _why_unknown(profile, model)))


def _why_unknown(profile, model):
    try:
        wanted_model = parse_profile(profile).model
    except VgpuTypeError:
        wanted_model = None
    if model and wanted_model and wanted_model.lower() != model.lower():
        return "is a profile of %s GPUs, not of this %s" % (wanted_model, model)
    return "is not a vGPU type this GPU offers"


def check_sizes(address, after_types, mixed_size, total_gb=None, slots=None):
    """Fail before any write when the wanted vGPUs cannot coexist on one GPU.

    `after_types` lists the driver type of every vGPU the GPU would have. Different framebuffer
    sizes need mixed-size mode (NVIDIA vGPU user guide, "putting-gpu-into-mixed-size-mode"); the sizes must fit
    `total_gb` when known and the count must fit `slots` (VFs or mdev instances).
    """
    sizes = OrderedDict()
    for vgpu_type in after_types:
        sizes.setdefault(type_size_gb(vgpu_type), []).append(vgpu_type.short)
    known = [s for s in sizes if s is not None]
    if len(known) > 1 and not mixed_size:
        names = sorted(set(sizes[known[0]][:1] + sizes[known[1]][:1]))
        raise LayoutError("GPU %s: profiles %s have different framebuffer sizes; set mixed_size to allow that"
                          % (address, " and ".join(names)))
    if slots is not None and len(after_types) > slots:
        raise LayoutError("GPU %s: %d vGPUs requested (%s) but the GPU has only %d slots"
                          % (address, len(after_types), _summary(after_types), slots))
    used = sum(type_size_gb(t) or 0 for t in after_types)
    if total_gb and used > total_gb:
        raise LayoutError("GPU %s: %s need %d GB of framebuffer, the GPU has %d GB"
                          % (address, _summary(after_types), used, total_gb))


def _summary(types):
    counts = OrderedDict()
    for vgpu_type in types:
        counts[vgpu_type.short] = counts.get(vgpu_type.short, 0) + 1
    return ", ".join("%d x %s" % (n, name) for name, n in counts.items())


class VgpuChange:
    """One vGPU slot of a plan: a VF (vendor-VFIO) or an mdev (uuid on a parent address)."""

    def __init__(self, address, before, after, uuid=None, held=None):
        self.address, self.before, self.after, self.uuid = address, before, after, uuid
        self.held = held or []

    @property
    def changed(self):
        return _name(self.before) != _name(self.after)

    def to_dict(self):
        data = OrderedDict([("address", self.address)])
        if self.uuid:
            data["uuid"] = self.uuid
        data["before"] = _name(self.before)
        data["after"] = _name(self.after)
        data["type_id"] = _type_id(self.after)
        if self.held:
            data["held_by"] = list(self.held)
        return data


def _name(vgpu_type):
    return vgpu_type.short if vgpu_type is not None else None


def _type_id(vgpu_type):
    if vgpu_type is None:
        return None
    return getattr(vgpu_type, "type_id", None) or getattr(vgpu_type, "dirname", None)


class GpuPlan:
    """What one GPU has and will have; `steps` are the writes in order, data only."""

    def __init__(self, address, framework, model, pci_id, origin=None):
        self.address, self.framework, self.model, self.pci_id = address, framework, model, pci_id
        self.origin = origin
        self.vgpus = []
        self.steps = []
        self.mixed_size = False
        self.switch_mode = False  # put the GPU into mixed-size mode between clears and creations
        self.pending = None  # {profile: count} a GPU whose VFs are not enabled yet is to get
        self.mig = None  # mig.MigPlan of a GPU with MIG-backed vGPUs (MIG mode, GPU instances)
        self.warnings = []

    @property
    def changed(self):
        return bool(self.steps)

    def after_types(self):
        return [v.after for v in self.vgpus if v.after is not None]

    def to_result(self):
        return OrderedDict([("address", self.address), ("model", self.model), ("framework", self.framework),
                            ("pci_id", self.pci_id), ("vgpus", [v.to_dict() for v in self.vgpus])])
