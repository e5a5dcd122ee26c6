"""The sysfs-like tree over State: lazily computed directories of File / Link / Dir nodes.

A directory computes its entries when first looked up after a structural change (State.version:
VFs, mdevs, bindings) and caches them until the next one, so a change costs only the directories
visited afterwards. File contents are computed on every read, so dynamic attributes
(creatable_vgpu_types, available_instances) are always current.
Layout as the kernel's: device directories under devices/pci0000:<bus>/, links to them from
bus/pci/devices, bus/mdev/devices, class/mdev_bus, kernel/iommu_groups/N/devices, bus/pci/drivers.
"""

from __future__ import annotations

import json
import posixpath
import stat

from gpusim import layout
from gpusim.models import DRIVERS

RO, RW, WO = 0o444, 0o644, 0o200
GPUSIM_DIR = ".gpusim"
_KINDS = {"dir": stat.S_IFDIR, "file": stat.S_IFREG, "link": stat.S_IFLNK}


class Node:
    __slots__ = ("kind", "mode", "read", "write", "target", "holds", "path", "make", "cache", "owner", "exclusive")

    def __init__(self, kind, mode, read=None, write=None, target=None, holds=None, path=None, make=None):
        self.kind = kind
        self.mode = mode
        self.read = read          # () -> str
        self.write = write        # (str) -> None, raises SimError
        self.target = target      # link target, relative to the link's directory
        self.holds = holds        # Device/Mdev whose VFIO node this is (opening it holds the device)
        self.path = path          # directories: their path relative to ROOT
        self.make = make          # directories: (path) -> {name: Node}
        self.cache = (-1, None)
        self.owner = None         # files: the Device/Mdev they belong to (gone -> ENODEV, as kernfs)
        self.exclusive = False    # VFIO group nodes: one open at a time (EBUSY), see _vfio_nodes

    @property
    def st_mode(self):
        return _KINDS[self.kind] | self.mode


def directory(path, make):
    return Node("dir", 0o755, path=path, make=make)


def static_dir(path, entries):
    return directory(path, lambda dummy: entries)


def file(read=None, write=None, mode=None, holds=None, exclusive=False):
    if mode is None:
        mode = RW if (read and write) else (WO if write else RO)
    node = Node("file", mode, read=read, write=write, holds=holds)
    node.exclusive = exclusive
    return node


def value(text):
    return file(read=lambda: text + "\n")


def link(from_dir, target_path):
    return Node("link", 0o777, target=posixpath.relpath(target_path, from_dir))


def _own(entries, owner):
    """Mark the files of a device directory as the device's, so stale handles get ENODEV."""
    for node in entries.values():
        if node.kind == "file":
            node.owner = owner
    return entries


def canonical(path):
    """Log spelling of a real path: bus/pci/devices/<BDF>/... or bus/mdev/devices/<uuid>/..."""
    parts = path.strip("/").split("/")
    if len(parts) >= 3 and parts[0] == "devices" and parts[1].startswith("pci"):
        if len(parts) >= 4 and len(parts[3]) == 36 and parts[3].count("-") == 4:
            return "/".join(["bus/mdev/devices"] + parts[3:])
        return "/".join(["bus/pci/devices"] + parts[2:])
    return "/".join(parts)


def device_dir(dev):
    """Real directory of a PCI device (VFs sit next to their PF)."""
    return layout.root_dir(dev.gpu.address) + "/" + dev.address


class Tree:
    def __init__(self, state, fs_ops):
        self.state = state
        self.fs_ops = fs_ops      # the ctl / log handlers live in fs.py
        self.root = directory("", self._root)

    # ---- lookup --------------------------------------------------------------------------------
    def entries(self, node):
        state = self.state
        with state.lock:
            version, cached = node.cache
            if version != state.version:
                cached = node.make(node.path)
                node.cache = (state.version, cached)
            return cached

    def lookup(self, path):
        node = self.root
        for part in path.strip("/").split("/"):
            if not part:
                continue
            if node.kind != "dir":
                return None
            node = self.entries(node).get(part)
            if node is None:
                return None
        return node

    def resolve(self, relpath, depth=0):
        """Real path of `relpath`, following links as the kernel's lookup does; None if missing."""
        current = ""
        for part in [p for p in relpath.strip("/").split("/") if p not in ("", ".")]:
            if part == "..":
                current = posixpath.dirname(current)
                continue
            candidate = posixpath.join(current, part) if current else part
            node = self.lookup(candidate)
            if node is None or depth > 40:
                return None
            if node.kind == "link":
                candidate = self.resolve(posixpath.join(current, node.target), depth + 1)
                if candidate is None:
                    return None
            current = candidate
        return current

    # ---- top level -------------------------------------------------------------------------------
    def _root(self, path):
        entries = {
            GPUSIM_DIR: directory(GPUSIM_DIR, self._gpusim),
            "bus": static_dir("bus", {
                "pci": static_dir("bus/pci", {
                    "devices": directory("bus/pci/devices", self._pci_links),
                    "drivers": directory("bus/pci/drivers", self._drivers)}),
                "mdev": static_dir("bus/mdev", {"devices": directory("bus/mdev/devices", self._mdev_links)})}),
            "class": static_dir("class", {"mdev_bus": directory("class/mdev_bus", self._mdev_bus),
                                          "vfio": directory("class/vfio", self._vfio_class)}),
            "devices": directory("devices", self._roots),
            "kernel": static_dir("kernel", {"iommu_groups": directory("kernel/iommu_groups", self._groups)}),
            "module": directory("module", self._modules),
        }
        return entries

    def _gpusim(self, path):
        ops = self.fs_ops
        return {"ctl": file(write=ops.control, mode=WO),
                "log": file(read=ops.log_text),
                "reads": file(read=lambda: json.dumps(self.state.read_counts(), sort_keys=True) + "\n"),
                "state.json": file(read=lambda: json.dumps(self.state.snapshot(), indent=1) + "\n"),
                "dev": static_dir(path + "/dev", {"vfio": directory(path + "/dev/vfio", self._vfio_nodes)})}

    def _holdables(self):
        state = self.state
        # VFs and mdevs, and a PF bound to vfio-pci (whole-GPU passthrough: its group is a VFIO group)
        return [dev for dev in state.devices.values() if dev.is_vf or dev.driver == "vfio-pci"] + \
            list(state.mdevs.values())

    def _vfio_nodes(self, path):
        # A VFIO group opens once at a time: a second open, or one while a device of the group is
        # bound through its iommufd cdev (here: its cdev is open), fails with EBUSY (kernel
        # drivers/vfio/group.c vfio_group_fops_open: group->opened_file, cdev_device_open_cnt).
        # The cdev itself opens any number of times (drivers/vfio/device_cdev.c; only the bind is exclusive).
        entries = {}
        cdevs = {}
        for obj in self._holdables():
            entries[str(obj.group)] = file(read=str, write=_ignore, mode=0o600, holds=obj, exclusive=True)
            if obj.vfio is not None:
                cdevs["vfio%d" % obj.vfio] = file(read=str, write=_ignore, mode=0o600, holds=obj)
        entries["devices"] = static_dir(path + "/devices", cdevs)
        return entries

    def _vfio_class(self, path):
        """class/vfio/<group>/dev: the group cdev's MAJOR:MINOR (drivers/vfio/group.c registers one
        device of class "vfio" per group, devnode vfio/<group>). The major is dynamic on a real host
        (alloc_chrdev_region); 510 and minor = group number here (ASSUMPTION: real minors come from an
        IDA). The iommufd cdevs' vfio-dev/vfio<N>/dev use 511 (see _vfio_dev)."""
        return {str(obj.group): static_dir("%s/%d" % (path, obj.group), {"dev": value("510:%d" % obj.group)})
                for obj in self._holdables()}

    def _pci_links(self, path):
        return {addr: link(path, device_dir(dev)) for addr, dev in sorted(self.state.devices.items())}

    def _mdev_links(self, path):
        return {uuid: link(path, device_dir(mdev.parent) + "/" + uuid)
                for uuid, mdev in sorted(self.state.mdevs.items())}

    def _mdev_bus(self, path):
        return {addr: link(path, device_dir(dev))
                for addr, dev in sorted(self.state.devices.items()) if dev.mdev_parent}

    def _drivers(self, path):
        return {name: directory(path + "/" + name, self._driver) for name in DRIVERS
                if self.state.driver_available(name)}

    def _driver(self, path):
        state = self.state
        name = posixpath.basename(path)
        entries = {"bind": file(write=lambda text: state.store_bind(name, text)),
                   "unbind": file(write=lambda text: state.store_unbind(name, text)),
                   "new_id": file(write=lambda text: state.store_new_id(name, text))}
        if name == "nvidia":
            entries["module"] = link(path, "module/nvidia")
        for addr, dev in sorted(state.devices.items()):
            if dev.driver == name:
                entries[addr] = link(path, device_dir(dev))
        return entries

    def _modules(self, path):
        state = self.state
        if not state.nvidia_loaded:
            return {}
        attributes = {"version": value(state.nvidia_version), "refcnt": value("0")}
        return {"nvidia": static_dir(path + "/nvidia", attributes)}

    def _groups(self, path):
        entries = {}
        members = [(dev.group, dev.address, device_dir(dev)) for dev in self.state.devices.values()]
        members += [(m.group, m.uuid, device_dir(m.parent) + "/" + m.uuid) for m in self.state.mdevs.values()]
        for group, name, target in sorted(members):
            group_path = "%s/%d" % (path, group)
            entries[str(group)] = static_dir(group_path, {"devices": static_dir(
                group_path + "/devices", {name: link(group_path + "/devices", target)})})
        return entries

    def _roots(self, path):
        return {posixpath.basename(layout.root_dir(pf.address)):
                directory(layout.root_dir(pf.address), self._root_bridge) for pf in self.state.pfs}

    def _root_bridge(self, path):
        entries = {}
        for pf in self.state.pfs:
            if layout.root_dir(pf.address) == path:
                for dev in [pf] + list(pf.vfs):
                    entries[dev.address] = directory(device_dir(dev), _device_maker(self, dev))
        return entries

    # ---- one PCI device --------------------------------------------------------------------------
    def device(self, dev, path):
        state = self.state
        model = dev.model
        device_id = model.vf_device if dev.is_vf else model.device
        entries = {name: value(text) for name, text in [
            ("vendor", "0x" + model.vendor), ("device", "0x" + device_id),
            ("subsystem_vendor", "0x" + model.subsystem_vendor),
            ("subsystem_device", "0x" + model.subsystem_device), ("class", model.pci_class)]}
        entries["uevent"] = file(read=lambda: _uevent(dev, device_id))
        entries["driver_override"] = file(read=lambda: (dev.driver_override or "(null)") + "\n",
                                          write=lambda text: state.store_override(dev, text))
        entries["iommu_group"] = link(path, "kernel/iommu_groups/%d" % dev.group)
        entries["numa_node"] = value("%d" % layout.numa_node(dev.gpu.pf_index, len(state.pfs)))
        if dev.driver:
            entries["driver"] = link(path, "bus/pci/drivers/" + dev.driver)
        if dev.is_vf:
            entries["physfn"] = link(path, device_dir(dev.pf))
        elif model.sriov:
            entries.update(self._sriov(dev, path))
        if dev.vfio is not None:
            entries["vfio-dev"] = _vfio_dev(path, dev.vfio)
        if dev.vendor_vfio:
            entries["nvidia"] = static_dir(path + "/nvidia", _own(_nvidia_entries(state, dev), dev))
        if dev.mdev_parent:
            entries["mdev_supported_types"] = directory(path + "/mdev_supported_types", _types_maker(self, dev))
            for mdev in dev.mdevs:
                entries[mdev.uuid] = directory(path + "/" + mdev.uuid, _mdev_maker(self, mdev))
        return _own(entries, dev)

    def _sriov(self, pf, path):
        state = self.state
        model = pf.model
        entries = {name: value(text) for name, text in [
            ("sriov_totalvfs", str(model.total_vfs)), ("sriov_offset", str(model.vf_offset)),
            ("sriov_stride", str(model.vf_stride)), ("sriov_vf_device", model.vf_device)]}
        entries["sriov_numvfs"] = file(read=lambda: "%d\n" % len(pf.vfs),
                                       write=lambda text: state.store_numvfs(pf, text))
        entries["sriov_drivers_autoprobe"] = file(read=lambda: "%d\n" % pf.autoprobe,
                                                  write=lambda text: state.store_autoprobe(pf, text))
        for vf in pf.vfs:
            entries["virtfn%d" % vf.vf_index] = link(path, device_dir(vf))
        return entries

    def mdev_types(self, parent, path):
        state = self.state
        entries = {}
        for vgpu_type in parent.model.types:
            type_path = "%s/nvidia-%d" % (path, vgpu_type.type_id)
            devices = {m.uuid: link(type_path + "/devices", device_dir(parent) + "/" + m.uuid)
                       for m in parent.mdevs if m.vgpu_type is vgpu_type}
            entries["nvidia-%d" % vgpu_type.type_id] = static_dir(type_path, _own({
                "name": value(vgpu_type.name),
                "device_api": value("vfio-pci"),
                "description": value(_description(vgpu_type)),
                "available_instances": file(read=_available_reader(state, parent, vgpu_type)),
                "create": file(write=_creator(state, parent, vgpu_type)),
                "devices": static_dir(type_path + "/devices", devices)}, parent))
        return entries

    def mdev(self, mdev, path):
        state = self.state
        type_dir = "%s/mdev_supported_types/nvidia-%d" % (device_dir(mdev.parent), mdev.vgpu_type.type_id)
        return _own({"mdev_type": link(path, type_dir),
                     "iommu_group": link(path, "kernel/iommu_groups/%d" % mdev.group),
                     "remove": file(write=lambda text: state.store_mdev_remove(mdev, text)),
                     "uevent": value("MDEV_TYPE=nvidia-%d" % mdev.vgpu_type.type_id),
                     "vfio-dev": _vfio_dev(path, mdev.vfio)}, mdev)


def _ignore(text):
    return None


def _vfio_dev(path, number):
    name = "vfio%d" % number
    return static_dir(path + "/vfio-dev", {name: static_dir(path + "/vfio-dev/" + name,
                                                            {"dev": value("511:%d" % number)})})


def _nvidia_entries(state, vf):
    entries = {"creatable_vgpu_types": file(read=lambda: _creatable_text(state.creatable(vf))),
               "current_vgpu_type": file(read=lambda: "%d\n" % vf.vgpu_type,
                                         write=lambda text: state.store_vgpu_type(vf, text))}
    for name in ["vgpu_params", "gpu_instance_id", "placement_id", "warm_update"]:
        entries[name] = file(read=_param_reader(state, vf, name), write=_param_writer(state, vf, name))
    return entries


def _uevent(dev, device_id):
    model = dev.model
    lines = ["DRIVER=" + dev.driver] if dev.driver else []
    lines += ["PCI_CLASS=%X" % int(model.pci_class, 16),
              "PCI_ID=%s:%s" % (model.vendor.upper(), device_id.upper()),
              "PCI_SUBSYS_ID=%s:%s" % (model.subsystem_vendor.upper(), model.subsystem_device.upper()),
              "PCI_SLOT_NAME=" + dev.address]
    return "\n".join(lines) + "\n"


def _creatable_text(types):
    """HPD fixture format (brief §1.3): header, then '<id>  : <name>'."""
    lines = ["ID    : vGPU Name"] + ["%-5d : %s" % (t.type_id, t.name) for t in types]
    return "\n".join(lines) + "\n"


def _description(vgpu_type):
    """HPD A2 fixture format (brief §2); heads/frl/resolution ASSUMED per series."""
    return ("num_heads=4, frl_config=45, framebuffer=%dM, max_resolution=5120x2880, max_instance=%d"
            % (vgpu_type.framebuffer_gib * 1024, vgpu_type.max_instances))


# Closures built by small factories so each captures its own loop variables.
def _device_maker(tree, dev):
    return lambda path: tree.device(dev, path)


def _types_maker(tree, parent):
    return lambda path: tree.mdev_types(parent, path)


def _mdev_maker(tree, mdev):
    return lambda path: tree.mdev(mdev, path)


def _param_reader(state, vf, name):
    return lambda: state.vf_param(vf, name) + "\n"


def _param_writer(state, vf, name):
    return lambda text: state.store_vf_param(vf, name, text)


def _available_reader(state, parent, vgpu_type):
    return lambda: "%d\n" % state.available_instances(parent, vgpu_type)


def _creator(state, parent, vgpu_type):
    return lambda text: state.store_mdev_create(parent, vgpu_type, text)
