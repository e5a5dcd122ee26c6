# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which PCI functions and mdevs a VM holds: the one answer to "what holds these devices".

Public entry point (everything else in this file serves it; docs/design.md "In use"):

    held_devices(sysfs, dev_root="/dev", proc_root="/proc", scope=None, sources=())
        -> {PCI address or mdev uuid: [holder, ...]}

- holder: an int (the pid of a process with the device's VFIO node open) or a str (a holder that is
  not a process we could name: "VFIO group 101 is open ...", "cannot tell ...", or what a source says,
  e.g. a DRA claim). Any entry means held: never write to it. `describe(holders)` renders one list.
- `scope`: PCI addresses the caller will write to (a VF counts when its PF is listed, an mdev when
  its parent is); only these are probed (below); None = every device. Outside the scope an
  incomplete scan reports "unknown": held. The /proc scan always covers every device and process.
- `sources`: callables returning {device: [holder description, ...]}, merged in (a DRA claim that is
  prepared, a manager pod ...). An exception from one propagates: a source that cannot answer is no
  "nothing held".
- Raises InUseError (one line) when it cannot answer at all (proc_root missing or showing no process).

How (namespace-proof): a device is held when some process has an fd whose *file* is the device's
VFIO node, compared by what the kernel says the file is, never by the path the fd link shows (that
path is the one in the holder's mount namespace: QEMU in a virt-launcher pod opened /dev/vfio/12 in
its own /dev while the agent sees the host's /dev at /host/dev). `os.stat(/proc/PID/fd/N)` gives the
open file: for a character device its device number (st_rdev), compared with the device numbers of
the VFIO group cdev (`class/vfio/<group>/dev` in sysfs, and the node `<dev_root>/vfio/<group>`) and
of the iommufd VFIO cdev (`<device>/vfio-dev/vfioN/dev`, node `<dev_root>/vfio/devices/vfioN`); any
other file (a simulator's node, gpusim) by (st_dev, st_ino), which a bind mount preserves. The link
path is compared only for a device that has no identity at all (no sysfs `dev`, no node under
dev_root), because then nothing else is possible.

Fail closed: only ENOENT/ESRCH mean "that process (or fd) is gone". A process whose fds we may not
read (EACCES/EPERM: another uid without CAP_SYS_PTRACE, Yama, an LSM, hidepid) makes the scan
incomplete; then every in-scope device the scan did not find held is asked of the kernel itself: a
VFIO group can be open only once and its open fails with EBUSY while another fd has it open or a
device of it is bound through the iommufd cdev (drivers/vfio/group.c vfio_group_fops_open), in any
namespace. The probe opens the group node and closes it at once. EBUSY = held; opened = free; any
other answer (no node under dev_root, EACCES, ...) = "cannot tell" = held. kernel/hypeman PR #364
checks the same before reusing a VF: the driver gives no reliable error when a held VF is cleared
(domain brief 1.4).

Other API: `device_nodes(sysfs, base) -> ["<group>", "devices/vfioN"]` (node names, for CDI specs);
`mdev_parents(sysfs) -> {uuid: parent PCI address}`; `holders(held, address, parents)`
-> a PCI function's holders including its mdevs'; `describe(holders) -> "pid 1, 2; ..."`.
"""

from __future__ import annotations

import errno
import os
import stat

from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError
from ansible_collections.accelops.vgpu.plugins.module_utils.node.pci import PCI_DEVICES

MDEV_DEVICES = "bus/mdev/devices"
VFIO_CLASS = "class/vfio"           # one entry per VFIO group cdev, with its `dev` (MAJOR:MINOR)
_GONE = (errno.ENOENT, errno.ESRCH)  # the process or fd went away: not a holder
_DENIED = (errno.EACCES, errno.EPERM)  # we may not look: unknown, never "not a holder"
_SHOWN_PIDS = 5


class InUseError(EngineError):
    """The process table could not be scanned, so nothing can be said about held devices."""


class ProcessScan:
    """One pass over `<proc_root>/*/fd`: open files by identity (and by link path), and the processes
    whose fds could not be read."""

    def __init__(self, proc_root, path_prefixes=()):
        self.by_identity, self.by_path, self.uninspectable = {}, {}, {}
        self.majors = set()     # majors of the character devices open anywhere
        if not os.path.isdir(proc_root):
            raise InUseError("proc_root %s is not a directory; cannot tell which devices VMs hold" % proc_root)
        pids = [entry for entry in _entries(proc_root) if entry.isdigit()]
        if not pids:
            # procfs always lists at least the process reading it (or its namespace's init)
            raise InUseError("proc_root %s shows no processes (is the host's /proc mounted there?); cannot tell "
                             "which devices VMs hold" % proc_root)
        for pid in pids:
            self._process(proc_root, int(pid), path_prefixes)

    def _process(self, proc_root, pid, path_prefixes):
        fd_dir = os.path.join(proc_root, str(pid), "fd")
        try:
            fds = os.listdir(fd_dir)
        except OSError as exc:
            return self._failed(pid, fd_dir, exc, errno.ENOTDIR)
        for fd in fds:
            path = os.path.join(fd_dir, fd)
            try:
                target = os.readlink(path)
                if not target.startswith("/"):
                    continue            # socket:[..], pipe:[..], anon_inode:..: never a device node
                info = os.stat(path)    # the open file itself, whatever namespace it was opened in
            except OSError as exc:
                if self._failed(pid, path, exc, errno.EINVAL) is False:
                    return None
                continue
            key = identity(info)
            self.by_identity.setdefault(key, set()).add(pid)
            if key[0] == "rdev":
                self.majors.add(os.major(key[1]))
            if target.startswith(path_prefixes):
                self.by_path.setdefault(target, set()).add(pid)
        return None

    def _failed(self, pid, path, exc, skip):
        """True: skip this entry; False: stop reading this process (recorded as uninspectable)."""
        if exc.errno in _GONE or exc.errno == skip:
            return True
        # EACCES/EPERM, or any other error (EIO, ESTALE...): this process's fds are unknown
        self.uninspectable[pid] = "%s: %s" % (path, errno.errorcode.get(exc.errno, exc.errno))
        return False

    def holders_of(self, keys, paths):
        pids = set()
        for key in keys:
            pids.update(self.by_identity.get(key, ()))
        for path in paths:
            pids.update(self.by_path.get(path, ()))
        return pids


def identity(info):
    """What the kernel says a file is: ("rdev", n) for a character device, else ("inode", dev, ino)."""
    if stat.S_ISCHR(info.st_mode):
        return ("rdev", info.st_rdev)
    return ("inode", info.st_dev, info.st_ino)


def _entries(path):
    try:
        return os.listdir(path)
    except OSError as exc:
        raise InUseError("cannot list %s: %s" % (path, os.strerror(exc.errno))) from None


def _sysfs_devt(sysfs, rel):
    """("rdev", n) from a sysfs `dev` attribute (MAJOR:MINOR), or None."""
    text = sysfs.read_optional(rel)
    major, sep, minor = (text or "").partition(":")
    if not sep or not major.isdigit() or not minor.isdigit():
        return None
    return ("rdev", os.makedev(int(major), int(minor)))


class DevtReader:
    """Reads `dev` attributes, one kind ("group", "cdev") at a time. All nodes of a kind share one
    major (drivers/vfio: one alloc_chrdev_region for the groups, one for the cdevs), so once that
    major is known not to be open anywhere, no fd can match a node of that kind and the attributes
    of the others need not be read (each is a FUSE round trip on gpusim). `read()` -> (key, exists)."""

    def __init__(self, sysfs, majors):
        self.sysfs, self.majors, self.unseen = sysfs, majors, set()

    def read(self, kind, rel):
        if kind in self.unseen:
            return None, True
        devt = _sysfs_devt(self.sysfs, rel)
        if devt and os.major(devt[1]) not in self.majors:
            self.unseen.add(kind)
            return None, True
        return devt, bool(devt)


def _node_identity(path):
    try:
        info = os.stat(path)
    except OSError:
        return None
    return identity(info) if stat.S_ISCHR(info.st_mode) or stat.S_ISREG(info.st_mode) else None


class VfioDevice:
    """A PCI function's or mdev's VFIO interfaces: its group node and iommufd cdevs, by identity.
    `groups`: the names listed in sysfs `class/vfio` (read once per scan)."""

    def __init__(self, sysfs, dev_roots, base, groups, devts):
        self.group = sysfs.link_name(base + "/iommu_group")
        self.keys, self.nodes = set(), []
        if self.group:
            # no-IOMMU groups are named noiommu-<N> (drivers/vfio/group.c vfio_group_alloc)
            for name in (self.group, "noiommu-" + self.group):
                listed = name in groups
                devt, exists = devts.read("group", "%s/%s/dev" % (VFIO_CLASS, name)) if listed else (None, False)
                self._add(devt, exists, dev_roots, name, listed or name == self.group)
        for name in sysfs.listdir(base + "/vfio-dev"):
            if name.startswith("vfio"):
                devt, exists = devts.read("cdev", "%s/vfio-dev/%s/dev" % (base, name))
                self._add(devt, exists, dev_roots, "devices/" + name)

    def _add(self, devt, exists, dev_roots, node, look=True):
        found = False
        if devt:
            self.keys.add(devt)
        for root in dev_roots if look else ():
            key = _node_identity(os.path.join(root, "vfio", node))
            if key:
                self.keys.add(key)
                found = True
        if exists or found:
            self.nodes.append(node)

    @property
    def has_vfio(self):
        """The kernel (sysfs) or dev_root shows a VFIO node for it: only then can a VM open it."""
        return bool(self.keys or self.nodes)

    def paths(self, dev_roots):
        """Link paths to compare, only when nothing identifies the device (see the module doc)."""
        if self.keys or self.nodes or not self.group:
            return []
        return [os.path.join(root, "vfio", self.group) for root in dev_roots]


def probe_group(dev_root, group):
    """The kernel's answer for a VFIO group: "busy", "free", or "cannot tell (<why>)".

    Opens `<dev_root>/vfio/<group>` and closes it at once: a VFIO group can be open only once
    (drivers/vfio/group.c vfio_group_fops_open: EBUSY when already open, or when a device of it is
    bound through its iommufd cdev). A VM opening it in that instant gets EBUSY and fails to start
    (KubeVirt retries); it is never written under. A regular file stands for a simulated node (gpusim
    answers the same EBUSY); production nodes are character devices.
    """
    for name in (group, "noiommu-" + group):
        path = os.path.join(dev_root, "vfio", name)
        try:
            info = os.stat(path)
            if not (stat.S_ISCHR(info.st_mode) or stat.S_ISREG(info.st_mode)):
                return "cannot tell (%s is not a device node)" % path
            handle = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                continue
            if exc.errno == errno.EBUSY:
                return "busy"
            return "cannot tell (open %s: %s)" % (path, errno.errorcode.get(exc.errno, exc.errno))
        os.close(handle)
        return "free"
    return "cannot tell (no VFIO group node %s below %s/vfio)" % (group, dev_root)


def device_nodes(sysfs, base):
    """The VFIO node names (relative to `<dev_root>/vfio/`) a device is reachable through: its group,
    then its iommufd cdevs (what a VM is given; the DRA driver's CDI spec lists them)."""
    nodes = []
    group = sysfs.link_name(base + "/iommu_group")
    if group:
        nodes.append(group)
    for name in sysfs.listdir(base + "/vfio-dev"):
        if name.startswith("vfio"):
            nodes.append("devices/" + name)
    return nodes


def _dev_roots(dev_root):
    return sorted({os.path.abspath(dev_root), os.path.realpath(dev_root)})


def held_devices(sysfs, dev_root="/dev", proc_root="/proc", scope=None, sources=()):
    """{PCI address or mdev uuid: [holder, ...]} for every device something holds (module doc)."""
    roots = _dev_roots(dev_root)
    scan = ProcessScan(proc_root, tuple(os.path.join(root, "vfio", "") for root in roots))
    in_scope = _scope(sysfs, scope) if scan.uninspectable else None
    probed, held = {}, {}
    groups, devts = set(sysfs.listdir(VFIO_CLASS)), DevtReader(sysfs, scan.majors)
    for root in (PCI_DEVICES, MDEV_DEVICES):
        for name in sysfs.listdir(root):
            device = VfioDevice(sysfs, roots, "%s/%s" % (root, name), groups, devts)
            found = sorted(scan.holders_of(device.keys, device.paths(roots)))
            if not found and scan.uninspectable and device.has_vfio and device.group:
                if not in_scope(name):
                    answer = "was not asked (out of scope)"
                elif device.group in probed:
                    answer = probed[device.group]
                else:
                    answer = probed[device.group] = probe_group(roots[0], device.group)
                found = _probe_holder(device.group, answer, scan.uninspectable)
            if found:
                held[name] = found
    for source in sources:
        for name, extra in (source() or {}).items():
            found = held.setdefault(name, [])
            found.extend(h for h in extra if h not in found)
    return dict((name, found) for name, found in held.items() if found)


def _scope(sysfs, scope):
    """name -> whether the kernel may be asked about it: in scope itself, or its PF / mdev parent is."""
    if scope is None:
        return lambda name: True
    scope, parents = set(scope), mdev_parents(sysfs)

    def pf_of(name):
        return sysfs.link_name("%s/%s/physfn" % (PCI_DEVICES, name)) if name else None

    def in_scope(name):
        parent = parents.get(name)
        return bool({name, parent, pf_of(name), pf_of(parent)} & scope)
    return in_scope


def _probe_holder(group, answer, uninspectable):
    if answer == "free":
        return []
    pids = sorted(uninspectable)
    shown = ", ".join(str(p) for p in pids[:_SHOWN_PIDS]) + (" ..." if len(pids) > _SHOWN_PIDS else "")
    if answer == "busy":
        return ["VFIO group %s is open in a process this scan may not inspect (the kernel answers EBUSY; "
                "uninspectable pid %s)" % (group, shown)]
    return ["unknown: pid %s could not be inspected and the kernel's VFIO group %s %s" % (shown, group, answer)]


def describe(found):
    """One phrase for a holder list: 'pid 4242, 4243' and/or the other holders' descriptions."""
    pids = [str(h) for h in found if isinstance(h, int)]
    parts = (["pid " + ", ".join(pids)] if pids else []) + [str(h) for h in found if not isinstance(h, int)]
    return "; ".join(parts)


def mdev_parents(sysfs):
    """{mdev uuid: parent PCI address}; an mdev's sysfs directory sits inside its parent's."""
    parents = {}
    for uuid in sysfs.listdir(MDEV_DEVICES):
        target = sysfs.readlink("%s/%s" % (MDEV_DEVICES, uuid))
        if target:
            parents[uuid] = os.path.basename(os.path.dirname(target.rstrip("/")))
    return parents


def holders(held, address, parents=None):
    """Holders of a PCI function, directly or through an mdev created on it (pids first)."""
    found = list(held.get(address, ()))
    for uuid, parent in sorted((parents or {}).items()):
        if parent == address:
            found.extend(h for h in held.get(uuid, ()) if h not in found)
    return sorted(found, key=lambda h: (not isinstance(h, int), h if isinstance(h, int) else 0, str(h)))
