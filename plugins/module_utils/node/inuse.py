# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which PCI functions and mdevs a VM holds: open file descriptors on their VFIO device nodes.

A device is held when some process has an fd whose link target is `<dev_root>/vfio/<iommu group>`
(legacy group API) or `<dev_root>/vfio/devices/vfio<N>` where `vfio<N>` is the entry below the
device's `vfio-dev/` (iommufd cdev). kernel/hypeman PR #364 checks the same before reusing a VF:
the driver gives no reliable error when a held VF is cleared (domain brief 1.4).

`held_devices()` reads `<proc_root>/*/fd` once per call and only then looks at sysfs, so a host
with thousands of processes costs one pass. Processes exit during the scan: their vanished or
unreadable fd directories are skipped.

API:
- `held_devices(sysfs, dev_root="/dev", proc_root="/proc") -> {address or mdev uuid: [pid, ...]}`
- `mdev_parents(sysfs) -> {uuid: parent PCI address}`
- `holders(held, address, parents) -> [pid, ...]` for a PCI function, including its mdevs' holders
"""

from __future__ import annotations

import errno
import os

from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError
from ansible_collections.accelops.vgpu.plugins.module_utils.node.pci import PCI_DEVICES

MDEV_DEVICES = "bus/mdev/devices"
# A process that exits, or one we may not inspect, is skipped rather than failing the scan.
_VANISHED = (errno.ENOENT, errno.ESRCH, errno.EACCES, errno.EPERM, errno.ENOTDIR)


class InUseError(EngineError):
    """The process table could not be scanned, so nothing can be said about held devices."""


def _entries(path):
    try:
        return os.listdir(path)
    except OSError as exc:
        if exc.errno in _VANISHED:
            return []
        raise InUseError("cannot list %s: %s" % (path, os.strerror(exc.errno))) from None


def _fd_target(path):
    try:
        return os.readlink(path)
    except OSError as exc:
        if exc.errno in _VANISHED or exc.errno == errno.EINVAL:
            return None
        raise InUseError("cannot read %s: %s" % (path, os.strerror(exc.errno))) from None


def open_vfio_nodes(dev_root="/dev", proc_root="/proc"):
    """{node: {pid, ...}} for every fd open below `<dev_root>/vfio/`; node is relative to it."""
    if not os.path.isdir(proc_root):
        raise InUseError("proc_root %s is not a directory; cannot tell which devices VMs hold" % proc_root)
    # fd links show resolved paths; accept both spellings of dev_root.
    prefixes = {os.path.join(os.path.abspath(dev_root), "vfio", ""),
                os.path.join(os.path.realpath(dev_root), "vfio", "")}
    found = {}
    for pid in _entries(proc_root):
        if not pid.isdigit():
            continue
        fd_dir = os.path.join(proc_root, pid, "fd")
        for fd in _entries(fd_dir):
            target = _fd_target(os.path.join(fd_dir, fd))
            if not target:
                continue
            for prefix in prefixes:
                if target.startswith(prefix):
                    found.setdefault(target[len(prefix):], set()).add(int(pid))
                    break
    return found


def device_nodes(sysfs, base):
    """The VFIO node names (relative to `<dev_root>/vfio/`) a device is reachable through."""
    nodes = []
    group = sysfs.link_name(base + "/iommu_group")
    if group:
        nodes.append(group)
    for name in sysfs.listdir(base + "/vfio-dev"):
        if name.startswith("vfio"):
            nodes.append("devices/" + name)
    return nodes


def held_devices(sysfs, dev_root="/dev", proc_root="/proc"):
    """{PCI address or mdev uuid: sorted pids} for every device some process holds open."""
    open_nodes = open_vfio_nodes(dev_root, proc_root)
    if not open_nodes:
        return {}
    held = {}
    for root in (PCI_DEVICES, MDEV_DEVICES):
        for name in sysfs.listdir(root):
            pids = set()
            for node in device_nodes(sysfs, "%s/%s" % (root, name)):
                pids.update(open_nodes.get(node, ()))
            if pids:
                held[name] = sorted(pids)
    return held


def mdev_parents(sysfs):
    """{mdev uuid: parent PCI address}; an mdev's sysfs directory sits inside its parent's."""
    parents = {}
    for uuid in sysfs.listdir(MDEV_DEVICES):
        target = sysfs.readlink("%s/%s" % (MDEV_DEVICES, uuid))
        if target:
            parents[uuid] = os.path.basename(os.path.dirname(target.rstrip("/")))
    return parents


def holders(held, address, parents=None):
    """Sorted pids holding a PCI function directly or through an mdev created on it."""
    pids = set(held.get(address, ()))
    for uuid, parent in (parents or {}).items():
        if parent == address:
            pids.update(held.get(uuid, ()))
    return sorted(pids)
