"""A node laid out in tmp_path for engine unit tests: sysfs (as the kernel links it), /dev, /proc.

Plain files, no FUSE: `KernelSysfs` adds the kernel's sriov_numvfs rules on top of `Sysfs.write`
(ERANGE, EBUSY, ENOENT, VFs appearing) so the SR-IOV engine can be exercised without gpusim.
"""

import errno
import itertools
import os
import shutil
import threading
import time

from ansible_collections.accelops.vgpu.plugins.module_utils.runner import CommandRunner
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import Sysfs, SysfsError

L40S_TYPES = "ID    : vGPU Name\n1145  : NVIDIA L40S-1B\n1155  : NVIDIA L40S-24Q\n1156  : NVIDIA L40S-48Q\n"


def vf_address(pf, index, first_function=4):
    """VF addresses after the PF's function, eight functions per device (0000:41:00.4, ...)."""
    domain_bus, dummy, dev_fn = pf.rpartition(":")
    slot = int(dev_fn.split(".")[0], 16) * 8 + first_function + index
    return "%s:%02x.%d" % (domain_bus, slot // 8, slot % 8)


class FakeNode:
    """Builds devices under `root/sys`, device nodes under `root/dev`, processes under `root/proc`."""

    def __init__(self, root):
        self.sys = root / "sys"
        self.dev = root / "dev"
        self.proc = root / "proc"
        for path in (self.sys / "bus/pci/devices", self.sys / "bus/mdev/devices", self.dev / "vfio", self.proc):
            path.mkdir(parents=True, exist_ok=True)
        (self.proc / "1" / "fd").mkdir(parents=True, exist_ok=True)   # procfs always shows a process
        self._groups = itertools.count(10)
        self._pids = itertools.count(4000)
        self.vf_style = {}   # PF address -> "vendor-vfio" | "mdev" | "plain": what its VFs look like

    def dir(self, addr):
        return self.sys / "devices/pci0000:00" / addr

    def device(self, addr, vendor="0x10de", device="0x26b9", cls="0x030200", driver="nvidia", physfn=None):
        path = self.dir(addr)
        path.mkdir(parents=True)
        (path / "vendor").write_text(vendor + "\n")
        (path / "device").write_text(device + "\n")
        (path / "class").write_text(cls + "\n")
        if driver:
            os.symlink("../../../bus/pci/drivers/" + driver, path / "driver")
        os.symlink("../../../kernel/iommu_groups/%d" % next(self._groups), path / "iommu_group")
        os.symlink("../../../devices/pci0000:00/" + addr, self.sys / "bus/pci/devices" / addr)
        if physfn:
            os.symlink("../" + physfn, path / "physfn")
        return path

    def pf(self, addr, total=32, vf_style="vendor-vfio", **kwargs):
        path = self.device(addr, **kwargs)
        (path / "sriov_totalvfs").write_text("%d\n" % total)
        (path / "sriov_numvfs").write_text("0\n")
        self.vf_style[addr] = vf_style
        return path

    def mdev_gpu(self, addr, total=4):
        """An A2/A16-like GPU with all its VFs enabled, each VF an mdev parent."""
        self.pf(addr, total=total, vf_style="mdev", device="0x25b6")
        return self.set_numvfs(addr, total)

    def nic(self, addr, total=8):
        return self.pf(addr, total=total, vf_style="plain", vendor="0x8086", device="0x1572",
                       cls="0x020000", driver="i40e")

    def remove_mdev(self, uuid):
        link = self.sys / "bus/mdev/devices" / uuid
        shutil.rmtree(os.path.realpath(link))
        os.unlink(link)

    def set_numvfs(self, pf, count):
        """What the kernel does on a successful sriov_numvfs store: VFs appear or vanish."""
        pf_dir = self.dir(pf)
        for uuid in os.listdir(self.sys / "bus/mdev/devices"):
            if not os.path.exists(self.sys / "bus/mdev/devices" / uuid):
                continue
            parent = os.path.basename(os.path.dirname(os.readlink(self.sys / "bus/mdev/devices" / uuid)))
            if os.path.islink(self.dir(parent) / "physfn") and os.readlink(self.dir(parent) / "physfn") == "../" + pf:
                self.remove_mdev(uuid)
        for name in os.listdir(pf_dir):
            if name.startswith("virtfn"):
                vf = os.path.basename(os.readlink(pf_dir / name))
                os.unlink(pf_dir / name)
                os.unlink(self.sys / "bus/pci/devices" / vf)
                shutil.rmtree(self.dir(vf))
        (pf_dir / "sriov_numvfs").write_text("%d\n" % count)
        kind = self.vf_style.get(pf, "plain")
        vendor, device = (pf_dir / "vendor").read_text().strip(), (pf_dir / "device").read_text().strip()
        cls = (pf_dir / "class").read_text().strip()
        for index in range(count):
            vf = vf_address(pf, index)
            path = self.device(vf, vendor=vendor, device=device, cls=cls,
                               driver="nvidia" if kind != "plain" else "iavf", physfn=pf)
            os.symlink("../" + vf, pf_dir / ("virtfn%d" % index))
            if kind == "vendor-vfio":
                (path / "nvidia").mkdir()
                (path / "nvidia/current_vgpu_type").write_text("0\n")
                (path / "nvidia/creatable_vgpu_types").write_text(L40S_TYPES)
                (path / ("vfio-dev/vfio%d" % (index + 1))).mkdir(parents=True)
            elif kind == "mdev":
                self.mdev_type(vf, "nvidia-742", "NVIDIA A2-1B", 1)
        return [vf_address(pf, index) for index in range(count)]

    def mdev_type(self, parent, type_id, name, available):
        tdir = self.dir(parent) / "mdev_supported_types" / type_id
        tdir.mkdir(parents=True)
        (tdir / "name").write_text(name + "\n")
        (tdir / "available_instances").write_text("%d\n" % available)
        (tdir / "device_api").write_text("vfio-pci\n")
        bus = self.sys / "class/mdev_bus"
        bus.mkdir(parents=True, exist_ok=True)
        if not (bus / parent).is_symlink():
            os.symlink("../../devices/pci0000:00/" + parent, bus / parent)

    def mdev(self, uuid, parent, type_id="nvidia-742"):
        path = self.dir(parent) / uuid
        path.mkdir()
        (path / "remove").write_text("")
        os.symlink("../mdev_supported_types/" + type_id, path / "mdev_type")
        os.symlink("../../../../kernel/iommu_groups/%d" % next(self._groups), path / "iommu_group")
        os.symlink("../../../devices/pci0000:00/%s/%s" % (parent, uuid), self.sys / "bus/mdev/devices" / uuid)
        return path

    def set_type(self, vf, type_id):
        (self.dir(vf) / "nvidia/current_vgpu_type").write_text("%d\n" % type_id)

    def hold(self, node, pid=None):
        """A process with an fd on `<dev>/vfio/<node>` (an IOMMU group or devices/vfioN)."""
        pid = pid or next(self._pids)
        fd_dir = self.proc / str(pid) / "fd"
        fd_dir.mkdir(parents=True, exist_ok=True)
        fds = len(os.listdir(fd_dir))
        target = self.dev / "vfio" / node
        if not target.exists():                     # the device node the process opened
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text("")
        os.symlink(str(target), fd_dir / str(fds + 3))
        return pid

    def group_of(self, name, root="bus/pci/devices"):
        return os.path.basename(os.readlink(self.sys / root / name / "iommu_group"))

    def numvfs(self, pf):
        return int((self.dir(pf) / "sriov_numvfs").read_text())


class KernelSysfs(Sysfs):
    """Sysfs whose sriov_numvfs writes follow drivers/pci/iov.c (sriov_numvfs_store)."""

    def __init__(self, node, no_sriov_configure=(), latency=0.0):
        super().__init__(str(node.sys))
        self.node = node
        self.no_sriov_configure = set(no_sriov_configure)
        self.latency = latency

    def write(self, rel, value):
        parts = rel.split("/")
        if parts[-1] == "remove" and parts[:3] == ["bus", "mdev", "devices"]:
            super().write(rel, value)
            self.node.remove_mdev(parts[3])
            return
        if parts[-1] == "sriov_numvfs":
            pf, want = parts[-2], int(value)
            current, total = self.node.numvfs(pf), self.read_int(rel.replace("sriov_numvfs", "sriov_totalvfs"))
            if want > total:
                raise SysfsError(rel, errno.ERANGE, "write %r to" % value)
            if want != current and pf in self.no_sriov_configure:
                raise SysfsError(rel, errno.ENOENT, "write %r to" % value)
            if want and current and want != current:
                raise SysfsError(rel, errno.EBUSY, "write %r to" % value)
            super().write(rel, value)
            time.sleep(self.latency)
            self.node.set_numvfs(pf, want)
            return
        if parts[-1] == "current_vgpu_type":    # the store replaces the value: "0" over "155" reads "0"
            os.truncate(self.path(rel), 0)
        super().write(rel, value)


class FakeSriovManage(CommandRunner):
    """sriov-manage -e|-d <PF> acting on a FakeNode; `noop_calls` first calls exit 0 doing nothing."""

    PATH = "/usr/lib/nvidia/sriov-manage"

    def __init__(self, node, installed=True, noop_calls=0, latency=0.0):
        super().__init__()
        self.node, self.installed, self.noop_calls, self.latency = node, installed, noop_calls, latency

    def which(self, name, extra_paths=()):
        return self.PATH if self.installed and name == "sriov-manage" else None

    def _execute(self, argv):
        tool, flag, pf = argv
        assert tool == self.PATH and flag in ("-e", "-d")
        if self.noop_calls:
            self.noop_calls -= 1
            return 0, "Enabling VFs on %s\n" % pf, ""
        time.sleep(self.latency)
        if flag == "-e" and self.node.numvfs(pf):
            return 0, "GPU at %s already has VFs enabled.\n" % pf, ""
        total = int((self.node.dir(pf) / "sriov_totalvfs").read_text())
        self.node.set_numvfs(pf, total if flag == "-e" else 0)
        return 0, "", ""


class Rendezvous:
    """Enables that wait for each other: each returns only once `parties` enables are in flight at the
    same time. PFs applied one after another never get there: the barrier breaks after `timeout`
    (a bound that only catches a hang, not a speed) and the enable fails."""

    def __init__(self, parties, timeout=10.0):
        self.barrier = threading.Barrier(parties, timeout=timeout)
        self.lock, self.in_flight, self.most_in_flight = threading.Lock(), 0, 0

    def enable(self):
        with self.lock:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            self.barrier.wait()
        finally:
            with self.lock:
                self.in_flight -= 1


class RecordingSysfs(Sysfs):
    """Plain Sysfs recording what it reads: `reads` (attribute paths) and `links` (link paths), in order."""

    def __init__(self, root):
        super().__init__(root)
        self.reads, self.links = [], []

    def read(self, rel):
        self.reads.append(rel)
        return super().read(rel)

    def readlink(self, rel):
        self.links.append(rel)
        return super().readlink(rel)
