"""The sysfs-like tree built from State: paths -> Dir / File / Link nodes.

Rebuilt whenever State.version changes (VFs, mdevs, bindings); file contents are computed on
every read, so dynamic attributes (creatable_vgpu_types, available_instances) are always current.
Layout as the kernel's: real device directories under devices/pci0000:<bus>/, links from
bus/pci/devices, bus/mdev/devices, class/mdev_bus, kernel/iommu_groups, bus/pci/drivers.
"""

from __future__ import annotations

import json
import posixpath
import stat

from gpusim import layout
from gpusim.models import DRIVERS

RO, RW, WO = 0o444, 0o644, 0o200
GPUSIM_DIR = ".gpusim"


class Node:
    __slots__ = ("kind", "mode", "read", "write", "target", "canon", "holds", "children")

    def __init__(self, kind, mode, read=None, write=None, target=None, canon=None, holds=None):
        self.kind = kind
        self.mode = mode
        self.read = read          # () -> str
        self.write = write        # (str) -> None, raises SimError
        self.target = target      # link target, relative
        self.canon = canon        # path as logged / matched by fail-next
        self.holds = holds        # Device/Mdev whose VFIO node this is (opening it holds the device)
        self.children = [] if kind == "dir" else None

    @property
    def st_mode(self):
        kinds = {"dir": stat.S_IFDIR, "file": stat.S_IFREG, "link": stat.S_IFLNK}
        return kinds[self.kind] | self.mode


def canonical(path):
    """Log spelling of a real path: bus/pci/devices/<BDF>/... or bus/mdev/devices/<uuid>/..."""
    parts = path.strip("/").split("/")
    if len(parts) >= 3 and parts[0] == "devices" and parts[1].startswith("pci"):
        if len(parts) >= 4 and len(parts[3]) == 36 and parts[3].count("-") == 4:
            return "/".join(["bus/mdev/devices"] + parts[3:])
        return "/".join(["bus/pci/devices"] + parts[2:])
    return "/".join(parts)


class Tree:
    def __init__(self, state, fs_ops):
        self.state = state
        self.fs_ops = fs_ops      # the ctl / log / state.json handlers live in fs.py
        self.nodes = {"": Node("dir", 0o755)}

    # ---- primitives ----------------------------------------------------------------------
    def _add(self, path, node):
        parent = posixpath.dirname(path)
        if parent not in self.nodes:
            self._add(parent, Node("dir", 0o755))
        self.nodes[parent].children.append(posixpath.basename(path))
        self.nodes[path] = node
        if node.canon is None:
            node.canon = canonical(path)
        return node

    def dir(self, path):
        if path not in self.nodes:
            self._add(path, Node("dir", 0o755))

    def file(self, path, read=None, write=None, mode=None, holds=None):
        if mode is None:
            mode = RW if (read and write) else (WO if write else RO)
        self._add(path, Node("file", mode, read=read, write=write, holds=holds))

    def value(self, path, text):
        self.file(path, read=lambda: text + "\n")

    def link(self, path, target_path):
        self._add(path, Node("link", 0o777, target=posixpath.relpath(target_path, posixpath.dirname(path))))

    # ---- build -----------------------------------------------------------------------------
    def build(self):
        state = self.state
        with state.lock:
            self._gpusim()
            for name in ["bus/pci/devices", "bus/mdev/devices", "class/mdev_bus", "kernel/iommu_groups"]:
                self.dir(name)
            for name in DRIVERS:
                if state.driver_available(name):
                    self._driver(name)
            if state.nvidia_loaded:
                self.value("module/nvidia/version", state.nvidia_version)
                self.value("module/nvidia/refcnt", "0")
            for pf in state.pfs:
                self._device(pf)
                for vf in pf.vfs:
                    self._device(vf)
        return self

    def _gpusim(self):
        ops = self.fs_ops
        self.file(GPUSIM_DIR + "/ctl", write=ops.control, mode=WO)
        self.file(GPUSIM_DIR + "/log", read=ops.log_text)
        self.file(GPUSIM_DIR + "/state.json", read=lambda: json.dumps(self.state.snapshot(), indent=1) + "\n")
        self.dir(GPUSIM_DIR + "/dev/vfio/devices")

    def _dev_nodes(self, obj):
        base = GPUSIM_DIR + "/dev/vfio/"
        self.file(base + str(obj.group), read=lambda: "", write=lambda text: None, mode=0o600, holds=obj)
        if obj.vfio is not None:
            self.file(base + "devices/vfio%d" % obj.vfio, read=lambda: "", write=lambda text: None,
                      mode=0o600, holds=obj)

    def _driver(self, name):
        state = self.state
        base = "bus/pci/drivers/" + name
        self.file(base + "/bind", write=lambda text: state.store_bind(name, text))
        self.file(base + "/unbind", write=lambda text: state.store_unbind(name, text))
        self.file(base + "/new_id", write=lambda text: state.store_new_id(name, text))
        if name == "nvidia":
            self.link(base + "/module", "module/nvidia")

    def _group(self, group, member, member_path):
        self.link("kernel/iommu_groups/%d/devices/%s" % (group, member), member_path)
        return "kernel/iommu_groups/%d" % group

    def _device(self, dev):
        state = self.state
        model = dev.model
        path = layout.root_dir(dev.gpu.address) + "/" + dev.address
        self.dir(path)
        self.link("bus/pci/devices/" + dev.address, path)
        device_id = model.vf_device if dev.is_vf else model.device
        for name, text in [("vendor", "0x" + model.vendor), ("device", "0x" + device_id),
                           ("subsystem_vendor", "0x" + model.subsystem_vendor),
                           ("subsystem_device", "0x" + model.subsystem_device), ("class", model.pci_class)]:
            self.value(path + "/" + name, text)
        self.file(path + "/uevent", read=lambda: _uevent(dev, device_id))
        self.file(path + "/driver_override", read=lambda: (dev.driver_override or "(null)") + "\n",
                  write=lambda text: state.store_override(dev, text))
        self.link(path + "/iommu_group", self._group(dev.group, dev.address, path))
        if dev.driver:
            self.link(path + "/driver", "bus/pci/drivers/" + dev.driver)
            self.link("bus/pci/drivers/%s/%s" % (dev.driver, dev.address), path)
        if dev.is_vf:
            self.link(path + "/physfn", layout.root_dir(dev.gpu.address) + "/" + dev.pf.address)
            self._dev_nodes(dev)
        elif model.sriov:
            self._sriov(dev, path)
        if dev.vfio is not None:
            self.value(path + "/vfio-dev/vfio%d/dev" % dev.vfio, "511:%d" % dev.vfio)
        if dev.vendor_vfio:
            self._nvidia_dir(dev, path + "/nvidia")
        if dev.mdev_parent:
            self._mdev_parent(dev, path)

    def _sriov(self, pf, path):
        state = self.state
        model = pf.model
        for name, text in [("sriov_totalvfs", str(model.total_vfs)), ("sriov_offset", str(model.vf_offset)),
                           ("sriov_stride", str(model.vf_stride)), ("sriov_vf_device", model.vf_device)]:
            self.value(path + "/" + name, text)
        self.file(path + "/sriov_numvfs", read=lambda: "%d\n" % len(pf.vfs),
                  write=lambda text: state.store_numvfs(pf, text))
        self.file(path + "/sriov_drivers_autoprobe", read=lambda: "%d\n" % pf.autoprobe,
                  write=lambda text: state.store_autoprobe(pf, text))
        for vf in pf.vfs:
            self.link("%s/virtfn%d" % (path, vf.vf_index), layout.root_dir(pf.address) + "/" + vf.address)

    def _nvidia_dir(self, vf, path):
        state = self.state
        self.file(path + "/creatable_vgpu_types", read=lambda: _creatable_text(state.creatable(vf)))
        self.file(path + "/current_vgpu_type", read=lambda: "%d\n" % vf.vgpu_type,
                  write=lambda text: state.store_vgpu_type(vf, text))
        for name in ["vgpu_params", "gpu_instance_id", "placement_id", "warm_update"]:
            self.file("%s/%s" % (path, name), read=_param_reader(state, vf, name),
                      write=_param_writer(state, vf, name))

    def _mdev_parent(self, parent, path):
        state = self.state
        self.link("class/mdev_bus/" + parent.address, path)
        for vgpu_type in parent.model.types:
            type_dir = "%s/mdev_supported_types/nvidia-%d" % (path, vgpu_type.type_id)
            self.value(type_dir + "/name", vgpu_type.name)
            self.value(type_dir + "/device_api", "vfio-pci")
            self.value(type_dir + "/description", _description(vgpu_type))
            self.file(type_dir + "/available_instances",
                      read=_available_reader(state, parent, vgpu_type))
            self.file(type_dir + "/create", write=_creator(state, parent, vgpu_type))
            self.dir(type_dir + "/devices")
        for mdev in parent.mdevs:
            mdev_path = "%s/%s" % (path, mdev.uuid)
            type_dir = "%s/mdev_supported_types/nvidia-%d" % (path, mdev.vgpu_type.type_id)
            self.link(type_dir + "/devices/" + mdev.uuid, mdev_path)
            self.link("bus/mdev/devices/" + mdev.uuid, mdev_path)
            self.link(mdev_path + "/mdev_type", type_dir)
            self.link(mdev_path + "/iommu_group", self._group(mdev.group, mdev.uuid, mdev_path))
            self.file(mdev_path + "/remove", write=_remover(state, mdev))
            self.value(mdev_path + "/uevent", "MDEV_TYPE=nvidia-%d" % mdev.vgpu_type.type_id)
            self.value(mdev_path + "/vfio-dev/vfio%d/dev" % mdev.vfio, "511:%d" % mdev.vfio)
            self._dev_nodes(mdev)

    # ---- lookup ------------------------------------------------------------------------------
    def resolve(self, relpath, follow_last=True, depth=0):
        """Real path of `relpath` following links (like the kernel's lookup); None if missing."""
        parts = [p for p in relpath.strip("/").split("/") if p not in ("", ".")]
        current = ""
        for index, part in enumerate(parts):
            candidate = posixpath.join(current, part) if current else part
            if part == "..":
                candidate = posixpath.dirname(current)
            node = self.nodes.get(candidate)
            if node is None or depth > 40:
                return None
            last = index == len(parts) - 1
            if node.kind == "link" and (follow_last or not last):
                target = posixpath.normpath(posixpath.join(posixpath.dirname(candidate), node.target))
                candidate = self.resolve(target, True, depth + 1)
                if candidate is None:
                    return None
            current = candidate
        return current


def _uevent(dev, device_id):
    model = dev.model
    lines = []
    if dev.driver:
        lines.append("DRIVER=" + dev.driver)
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
def _param_reader(state, vf, name):
    return lambda: state.vf_param(vf, name) + "\n"


def _param_writer(state, vf, name):
    return lambda text: state.store_vf_param(vf, name, text)


def _available_reader(state, parent, vgpu_type):
    return lambda: "%d\n" % state.available_instances(parent, vgpu_type)


def _creator(state, parent, vgpu_type):
    return lambda text: state.store_mdev_create(parent, vgpu_type, text)


def _remover(state, mdev):
    return lambda text: state.store_mdev_remove(mdev, text)

