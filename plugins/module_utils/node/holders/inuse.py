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

    Holders(sysfs, dev_root, proc_root, sources)    # one apply: .held(scope, reuse), .recheck(names), .counts

held_devices() is one Holders' held(). An apply keeps one Holders: each device's group and identity read
once, /proc walked once, and right before each write `recheck()` asks the kernel about that device's own
group (O(1), no walk); see the class doc and docs/design.md "In use".

Every task's fd table is read (`/proc/PID/task/TID/fd`: a thread after unshare(CLONE_FILES), the live
threads of a group whose leader exited); a task sharing a table already read is skipped (kcmp(2), where
the pids are ours). A procfs mounted hidepid (it does not list what its reader may not ptrace) makes the
walk incomplete, like a process whose fds we may not read.

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
(no NVIDIA document names an errno for it).

Other API: `device_nodes(sysfs, base) -> ["<group>", "devices/vfioN"]` (node names, for CDI specs);
`mdev_parents(sysfs) -> {uuid: parent PCI address}`; `holders(held, address, parents)`
-> a PCI function's holders including its mdevs'; `describe(holders) -> "pid 1, 2; ..."`.
"""

from __future__ import annotations

import errno
import os
import platform
import re
import stat

from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.pci import PCI_DEVICES
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import SysfsError

MDEV_DEVICES = "bus/mdev/devices"
VFIO_CLASS = "class/vfio"           # one entry per VFIO group cdev, with its `dev` (MAJOR:MINOR)
_GONE = (errno.ENOENT, errno.ESRCH)  # the process or fd went away: not a holder
_DENIED = (errno.EACCES, errno.EPERM)  # we may not look: unknown, never "not a holder"
_SHOWN_PIDS = 5


class InUseError(EngineError):
    """The process table could not be scanned, so nothing can be said about held devices."""


class ProcessScan:
    """One pass over every task's fd table below `<proc_root>`: open files by identity (and by link path),
    the processes whose fds could not be read, and why the listing itself may be incomplete (`hidden`)."""

    def __init__(self, proc_root, path_prefixes=()):
        self.by_identity, self.by_path, self.uninspectable = {}, {}, {}
        self.majors = set()     # majors of the character devices open anywhere
        self.tables = 0         # fd tables read (a task sharing one already read is skipped)
        if not os.path.isdir(proc_root):
            raise InUseError("proc_root %s is not a directory; cannot tell which devices VMs hold" % proc_root)
        pids = [entry for entry in _entries(proc_root) if entry.isdigit()]
        if not pids:
            # procfs always lists at least the process reading it (or its namespace's init)
            raise InUseError("proc_root %s shows no processes (is the host's /proc mounted there?); cannot tell "
                             "which devices VMs hold" % proc_root)
        self.hidden = procfs_filter(proc_root)
        same = _kcmp is not None and _own_pid_namespace(proc_root)
        for pid in pids:
            self._process(proc_root, int(pid), path_prefixes, same)

    @property
    def incomplete(self):
        """Some holder may be missing from this scan: a process it may not read, or a filtered listing."""
        return bool(self.uninspectable or self.hidden)

    def _process(self, proc_root, pid, path_prefixes, same_namespace):
        """Every fd table of the process: the leader's, and each task's own (a thread after
        unshare(CLONE_FILES), or the live threads of a group whose leader exited and has no table)."""
        task_dir = os.path.join(proc_root, str(pid), "task")
        try:
            tids = [int(t) for t in os.listdir(task_dir) if t.isdigit()]
        except OSError as exc:
            if not (exc.errno == errno.ENOENT and os.path.isdir(os.path.join(proc_root, str(pid)))):
                self._failed(pid, task_dir, exc, errno.ENOTDIR)
                return
            tids = []           # a process directory without tasks (not procfs): its own fd table only
        if self._table(pid, os.path.join(proc_root, str(pid), "fd"), path_prefixes) is False:
            return
        read = [pid]
        for tid in sorted(set(tids) - {pid}):
            # a task sharing a table already read (CLONE_FILES, every ordinary thread) adds nothing: kcmp(2)
            # says so without listing it, where the pids are ours (proc_root of our own pid namespace)
            if same_namespace and any(_kcmp(other, tid) == 0 for other in read):
                continue
            if self._table(pid, os.path.join(task_dir, str(tid), "fd"), path_prefixes) is False:
                return
            read.append(tid)

    def _table(self, pid, fd_dir, path_prefixes):
        """Read one fd table; False when the process must be given up (recorded as uninspectable)."""
        try:
            fds = os.listdir(fd_dir)
        except OSError as exc:
            return None if self._failed(pid, fd_dir, exc, errno.ENOTDIR) else False
        self.tables += 1
        for fd in fds:
            path = os.path.join(fd_dir, fd)
            try:
                target = os.readlink(path)
                if not target.startswith("/"):
                    continue            # socket:[..], pipe:[..], anon_inode:..: never a device node
                info = os.stat(path)    # the open file itself, whatever namespace it was opened in
            except OSError as exc:
                if self._failed(pid, path, exc, errno.EINVAL) is False:
                    return False
                continue
            if stat.S_ISDIR(info.st_mode):
                continue                # never a VFIO node (the engine's own walk_cache directories, a cwd...)
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


HIDING = ("1", "2", "4", "noaccess", "invisible", "ptraceable")   # procfs hidepid= values that hide or lock pids


def procfs_filter(proc_root):
    """Why the process listing of `proc_root` may leave processes out, or None when it shows them all.

    A procfs mounted with hidepid=1/2/4 (noaccess, invisible, ptraceable; fs/proc/root.c) hides other
    users' processes or their fds from whoever may not ptrace them; with hidepid=2 they are not even listed,
    so a scan that reads every listed process looks complete. The mount options are those of the mount
    holding proc_root in our mount namespace (/proc/self/mountinfo, else <proc_root>/self/mountinfo); a
    mount table that cannot be read is itself a reason (unknown is held)."""
    target = os.path.realpath(proc_root)
    for path in ("/proc/self/mountinfo", os.path.join(proc_root, "self", "mountinfo")):
        try:
            with open(path, encoding="utf-8", errors="surrogateescape") as handle:
                text = handle.read()
        except OSError:
            continue
        found = _mount_of(text, target)
        if found is None:
            continue
        mount_point, fstype, options = found
        hide = [o.partition("=")[2] for o in options.split(",") if o.startswith("hidepid=")]
        if fstype == "proc" and hide and hide[-1] in HIDING:
            return "procfs %s is mounted hidepid=%s: processes this scan may not see are not listed" % (
                mount_point, hide[-1])
        return None
    return "cannot read the mount table to tell whether procfs %s hides processes (hidepid)" % proc_root


def _mount_of(text, target):
    """(mount point, fstype, super options) of the last-mounted entry holding `target`, from mountinfo text."""
    best = None
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3:
            continue
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best[0])):
            best = (point, tail[0], tail[2])
    return best


def _own_pid_namespace(proc_root):
    """Whether the pids below proc_root are ours (kcmp(2) takes pids of the caller's namespace): its
    `self` names this process."""
    try:
        return int(os.readlink(os.path.join(proc_root, "self"))) == os.getpid()
    except (OSError, ValueError):
        return False


def _kcmp_function():
    """kcmp(pid1, pid2, KCMP_FILES) -> 0 when both tasks share one fd table; None where unknown."""
    number = {"x86_64": 312, "aarch64": 272, "riscv64": 272, "ppc64le": 354, "s390x": 343}.get(platform.machine())
    try:
        # absent from some minimal Pythons: no dedupe then
        import ctypes     # pylint: disable=import-outside-toplevel
        syscall = ctypes.CDLL(None, use_errno=True).syscall
    except (ImportError, OSError, AttributeError):
        return None
    if number is None:
        return None

    def kcmp(first, second):
        return syscall(number, ctypes.c_long(first), ctypes.c_long(second), ctypes.c_long(KCMP_FILES), 0, 0)
    return kcmp


KCMP_FILES = 2
_kcmp = _kcmp_function()


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
        self.keys, self.nodes, self.unknown = set(), [], None
        self.group, cdevs = _vfio_links(sysfs, base, self)
        if self.group:
            # no-IOMMU groups are named noiommu-<N> (drivers/vfio/group.c vfio_group_alloc)
            for name in (self.group, "noiommu-" + self.group):
                listed = name in groups
                devt, exists = devts.read("group", "%s/%s/dev" % (VFIO_CLASS, name)) if listed else (None, False)
                self._add(devt, exists, dev_roots, name, listed or name == self.group)
        for name in cdevs:
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


def _vfio_links(sysfs, base, device):
    """(IOMMU group name or None, [vfio-dev cdev names]) of a device. A link or listing that cannot be
    read (EACCES, EIO ...) sets `device.unknown`: what the device's VFIO interfaces are is then unknown,
    and a device whose holders cannot be told is held (an absent link, ENOENT, is no group)."""
    group, cdevs = None, []
    try:
        group = sysfs.link_name(base + "/iommu_group")
        cdevs = [n for n in sysfs.listdir(base + "/vfio-dev") if n.startswith("vfio")]
    except SysfsError as err:
        device.unknown = "unknown: %s" % err
    return group, cdevs


def probe_group(dev_root, group, vfio_fd=None):
    """The kernel's answer for a VFIO group: "busy", "free", or "cannot tell (<why>)".

    Opens `<dev_root>/vfio/<group>` and closes it at once: a VFIO group can be open only once
    (drivers/vfio/group.c vfio_group_fops_open: EBUSY when already open, or when a device of it is
    bound through its iommufd cdev). A VM opening it in that instant gets EBUSY and fails to start
    (KubeVirt retries); it is never written under. A regular file stands for a simulated node (gpusim
    answers the same EBUSY); production nodes are character devices. `vfio_fd`: an open descriptor of
    `<dev_root>/vfio` (Sysfs.cached_dir) to look the group up in, one path component instead of the whole path.
    """
    for name in (group, "noiommu-" + group):
        path = os.path.join(dev_root, "vfio", name)
        try:
            # opened first, its type checked on the open file (one lookup less than a stat before the open)
            handle = os.open(name if vfio_fd is not None else path,
                             os.O_RDWR | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0), dir_fd=vfio_fd)
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                continue
            if exc.errno == errno.EBUSY:
                return "busy"
            return "cannot tell (open %s: %s)" % (path, errno.errorcode.get(exc.errno, exc.errno))
        try:
            mode = os.fstat(handle).st_mode
        finally:
            os.close(handle)
        if not (stat.S_ISCHR(mode) or stat.S_ISREG(mode)):
            return "cannot tell (%s is not a device node)" % path
        return "free"
    if vfio_fd is not None:     # devtmpfs removes an empty /dev/vfio: the open one may be gone, ask by path
        return probe_group(dev_root, group)
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
    return Holders(sysfs, dev_root, proc_root, sources).held(scope)


class Facts:
    """What a device's in-use answer needs when the kernel is asked (read once per Holders): its IOMMU group,
    whether the group has a node to probe, whether it has any VFIO interface, or why that is unknown."""

    def __init__(self, group=None, probeable=False, vfio=False, unknown=None):
        self.group, self.probeable, self.vfio, self.unknown = group, probeable, vfio, unknown


class Holders:
    """The in-use answers of one apply (or one module or CLI run). What cannot change during it is read once
    (the devices, each one's IOMMU group and VFIO identity, the mdev parents); who holds a group is asked
    again every time:

    - held(scope=None, reuse=False) -> {device: [holder]}: the /proc walk (a "scan"), then the kernel probe
      of the in-scope groups where the walk is incomplete, then the sources. `reuse`: the process part of
      the last walk stands (VFs were just enabled: the devices are new, the processes the same); the
      probes and the sources are asked again.
    - recheck(names, sources=True) -> {device: [holder]}: right before a write, O(1) per device and no walk:
      each device's own group asked of the kernel (EBUSY while any fd has it open or a device of it is bound
      through its iommufd cdev, in any namespace), and the sources read again. A device with a VFIO cdev
      but no group node to ask falls back to a walk, and so does a group found busy (on that failure path
      only, to name the holder's pid).
    - forget(): VFs were enabled or disabled: the device facts are read again.
    - counts: {"scans", "probes", "sources"}: what this object asked (the bench reports them).
    """

    def __init__(self, sysfs, dev_root="/dev", proc_root="/proc", sources=()):
        self.sysfs, self.dev_root, self.proc_root, self.sources = sysfs, dev_root, proc_root, tuple(sources)
        self.roots = _dev_roots(dev_root)
        self.counts = {"scans": 0, "probes": 0, "sources": 0}
        self._scan = None
        self.forget()

    def forget(self):
        self._names, self._listed, self._parents = None, None, None
        self._facts, self._identities, self._devts, self._majors = {}, {}, None, None

    # --- what cannot change during an apply, read once ---------------------------------------------------

    def names(self):
        """[(sysfs dir, name)] of every PCI function and mdev."""
        if self._names is None:
            self._names = [("%s/%s" % (root, name), name)
                           for root in (PCI_DEVICES, MDEV_DEVICES) for name in self.sysfs.listdir(root)]
        return self._names

    def listed(self):
        """The VFIO group cdevs the kernel has (`class/vfio`), listed once."""
        if self._listed is None:
            self._listed = set(self.sysfs.listdir(VFIO_CLASS))
        return self._listed

    def parents(self):
        if self._parents is None:
            self._parents = mdev_parents(self.sysfs)
        return self._parents

    def facts(self, name, base=None):
        found = self._facts.get(name)
        if found is None:
            device = self._identities.get(name)
            found = self._facts[name] = (self._from_identity(device) if device is not None
                                         else self._read_facts(base or self._base(name)))
        return found

    def _base(self, name):
        return "%s/%s" % (MDEV_DEVICES if name in self.parents() else PCI_DEVICES, name)

    @staticmethod
    def _from_identity(device):
        group = device.group
        probeable = bool(group) and (group in device.nodes or "noiommu-" + group in device.nodes)
        return Facts(group, probeable, device.has_vfio, device.unknown)

    def _read_facts(self, base):
        """The group link; the group's node (listed in class/vfio or under dev_root); only without one the
        vfio-dev cdevs (a device of an iommufd-only kernel). A read that fails is unknown (held)."""
        facts = Facts()
        try:
            facts.group = self.sysfs.link_name(base + "/iommu_group")
            if facts.group:
                listed = self.listed()
                facts.probeable = facts.vfio = any(
                    name in listed or any(_node_identity(os.path.join(r, "vfio", name)) for r in self.roots)
                    for name in (facts.group, "noiommu-" + facts.group))
            if not facts.vfio:
                for cdev in (n for n in self.sysfs.listdir(base + "/vfio-dev") if n.startswith("vfio")):
                    if _sysfs_devt(self.sysfs, "%s/vfio-dev/%s/dev" % (base, cdev)) or any(
                            _node_identity(os.path.join(r, "vfio", "devices", cdev)) for r in self.roots):
                        facts.vfio = True
        except SysfsError as err:
            return Facts(facts.group, unknown="unknown: %s" % err)
        return facts

    def _identity(self, base, name, majors):
        """VfioDevice of a device (its nodes' identities), read once unless a new major opened since."""
        if self._devts is None or (self._devts.unseen and not majors <= self._devts.majors):
            self._identities, self._devts = {}, DevtReader(self.sysfs, set(majors))
        device = self._identities.get(name)
        if device is None:
            device = self._identities[name] = VfioDevice(self.sysfs, self.roots, base, self.listed(), self._devts)
        return device

    def vfio_majors(self):
        """The character majors of VFIO group and device cdevs: /proc/devices names them ("vfio", "vfio-dev";
        drivers/vfio/group.c and device_cdev.c alloc_chrdev_region), with the nodes under dev_root and the
        first group's sysfs `dev`; None when the kernel's list cannot be read (then any open char device counts)."""
        if self._majors is None:
            self._majors = _registered_majors(self.proc_root, ("vfio", "vfio-dev"))
            if self._majors is not None:
                for root in self.roots:
                    for rel in ("vfio", "vfio/devices"):
                        self._majors.update(_char_majors(os.path.join(root, rel)))
                for name in sorted(self.listed())[:1]:
                    devt = _sysfs_devt(self.sysfs, "%s/%s/dev" % (VFIO_CLASS, name))
                    if devt:
                        self._majors.add(os.major(devt[1]))
        return self._majors

    def _candidates(self, scan):
        """Whether any open fd may be a VFIO node: one opened through a path below dev_root/vfio, a file on
        the filesystem of dev_root's vfio nodes (a simulated node; a bind mount keeps st_dev), a character
        device of a VFIO major. When none is, no process holds any device and no device is read."""
        if scan.by_path:
            return True
        devs = set()
        for root in self.roots:
            for rel in ("vfio", "vfio/devices"):
                try:
                    devs.add(os.stat(os.path.join(root, rel)).st_dev)
                except OSError:
                    pass
        majors = self.vfio_majors()
        for key in scan.by_identity:
            if key[0] == "inode" and key[1] in devs:
                return True
            if key[0] == "rdev" and (majors is None or os.major(key[1]) in majors):
                return True
        return False

    # --- who holds what, asked every time ----------------------------------------------------------------

    def held(self, scope=None, reuse=False):
        if not (reuse and self._scan is not None):
            self.counts["scans"] += 1
            self._scan = ProcessScan(self.proc_root, tuple(os.path.join(root, "vfio", "") for root in self.roots))
        scan, held = self._scan, {}
        if self._candidates(scan):
            for base, name in self.names():
                device = self._identity(base, name, scan.majors)
                found = sorted(scan.holders_of(device.keys, device.paths(self.roots)))
                if found or device.unknown:
                    held[name] = found or [device.unknown]
        if scan.incomplete:
            in_scope, probed = self._scope(scope), {}
            for base, name in self.names():
                if name in held:
                    continue
                facts = self.facts(name, base)
                if facts.unknown:
                    held[name] = [facts.unknown]
                    continue
                if not facts.vfio:
                    continue
                if not in_scope(name):
                    answer = "was not asked (out of scope)"
                elif not facts.probeable:
                    answer = "cannot tell (no VFIO group node %s below %s/vfio)" % (facts.group, self.roots[0])
                elif facts.group in probed:
                    answer = probed[facts.group]
                else:
                    answer = probed[facts.group] = self._probe(facts.group)
                found = _probe_holder(facts.group, answer, scan)
                if found:
                    held[name] = found
        self._merge(held, None)
        return dict((name, found) for name, found in held.items() if found)

    def recheck(self, names, sources=True, watched=None, name_holders=True):
        """{device: [holder]} of `names` now (see the class doc): their groups' probes, then what the sources
        say of them (or of `watched`, a set of names, where given). `name_holders=False`: a busy group is
        reported as such, without the walk that names its process (a caller looking for a free device)."""
        held = {}
        for name in names:
            facts = self.facts(name)
            if facts.unknown:
                held[name] = [facts.unknown]
            elif facts.probeable:
                answer = self._probe(facts.group)
                if answer == "busy":
                    held[name] = ["VFIO group %s is open (the kernel answers EBUSY right before the write)"
                                  % facts.group]
                elif answer != "free":
                    held[name] = ["unknown: the kernel's VFIO group %s %s" % (facts.group, answer)]
            elif facts.vfio:       # an iommufd cdev only: nothing to ask the kernel, look at the processes
                self._scan = None
                found = self.held([name]).get(name)
                if found:
                    held[name] = found
        busy = [name for name, found in held.items() if found[0].startswith("VFIO group")] if name_holders else []
        if busy:
            # a VM opened one since the plan: one walk, on this failure path only, to name its process
            self._scan = None
            walked = self.held(busy)
            for name in busy:
                pids = [h for h in walked.get(name, ()) if isinstance(h, int)]
                held[name] = pids or held[name]
        if sources:
            self._merge(held, set(names) if watched is None else set(watched) | set(names))
        return held

    def _probe(self, group):
        self.counts["probes"] += 1
        return probe_group(self.roots[0], group, self.sysfs.cached_dir(os.path.join(self.roots[0], "vfio")))

    def _merge(self, held, names):
        for source in self.sources:
            self.counts["sources"] += 1
            for name, extra in (source() or {}).items():
                if names is not None and name not in names:
                    continue
                found = held.setdefault(name, [])
                found.extend(h for h in extra if h not in found)

    def _scope(self, scope):
        """name -> whether the kernel may be asked about it: in scope itself, or its PF / mdev parent is."""
        if scope is None:
            return lambda name: True
        scope = set(scope)

        def pf_of(name):
            return self.sysfs.link_name("%s/%s/physfn" % (PCI_DEVICES, name)) if name else None

        def in_scope(name):
            if name in scope:
                return True
            parent = self.parents().get(name)
            return bool({parent, pf_of(name), pf_of(parent)} & scope)
        return in_scope


def _registered_majors(proc_root, names):
    """Character majors of the named drivers from `<proc_root>/devices`; None when it cannot be read."""
    try:
        with open(os.path.join(proc_root, "devices"), encoding="utf-8") as handle:
            text = handle.read()
    except OSError:
        return None
    if "Character devices:" not in text:
        return None
    chars = text.split("Character devices:", 1)[1].split("Block devices:", 1)[0]
    majors = set()
    for line in chars.splitlines():
        number, dummy, name = line.strip().partition(" ")
        if number.isdigit() and name.strip() in names:
            majors.add(int(number))
    return majors


def _char_majors(directory):
    """The major of the first node in a directory of VFIO nodes (all of a kind share one major; the
    container node /dev/vfio/vfio, misc 10, and the devices/ directory are no group): one stat."""
    try:
        entries = sorted(n for n in os.listdir(directory) if n not in ("vfio", "devices"))
        info = os.stat(os.path.join(directory, entries[0])) if entries else None
    except OSError:
        return set()
    return {os.major(info.st_rdev)} if info is not None and stat.S_ISCHR(info.st_mode) else set()


def _probe_holder(group, answer, scan):
    if answer == "free":
        return []
    pids = sorted(scan.uninspectable)
    shown = ", ".join(str(p) for p in pids[:_SHOWN_PIDS]) + (" ..." if len(pids) > _SHOWN_PIDS else "")
    unseen = "pid %s could not be inspected" % shown if pids else scan.hidden
    if answer == "busy":
        return ["VFIO group %s is open in a process this scan may not inspect (the kernel answers EBUSY; %s)"
                % (group, "uninspectable pid %s" % shown if pids else scan.hidden)]
    return ["unknown: %s and the kernel's VFIO group %s %s" % (unseen, group, answer)]


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
