# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Is the vGPU stack in use? The question asked before the vGPU manager is stopped or its driver swapped.

Stopping nvidia-vgpu-mgr, disabling VFs or unloading nvidia/nvidia_vgpu_vfio takes the vGPU backend
away from every running VM (docs/design.md "Driver upgrades and manager restarts"). Two signals, both
"in use" when they say so:
- a VF or mdev of an NVIDIA GPU some process holds, or a DRA claim prepared on the node uses (the pod's VM
  may start any moment; `sources`, node/holders/claim_holders.py): the one in-use answer, `inuse.held_devices()`
  (no second scan here); non-NVIDIA devices (a NIC VF) are no concern of the vGPU manager, nor is a GPU
  passed through whole (a PF bound to vfio-pci: its VM does not use nvidia, node/holders/pf_driver.py);
- `nvidia_vgpu_vfio` has users: the use count `<proc_root>/modules` shows (third column, what lsmod
  prints), which the kernel raises for every open vGPU VFIO device.

API: `users(sysfs, dev_root, proc_root, sources) -> [one-line description]`, empty when nothing is in use;
raises inuse.InUseError (one line) when it cannot tell (callers treat that as in use).
"""

from __future__ import annotations

import os

from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import inuse, pf_driver
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.pci import PCI_DEVICES, PciDevice
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import SysfsError

NVIDIA_VENDOR = "0x10de"
VFIO_MODULE = "nvidia_vgpu_vfio"


def module_use_count(proc_root, name):
    """The use count of a loaded module from `<proc_root>/modules`, None when it is not loaded."""
    try:
        with open(os.path.join(proc_root, "modules"), encoding="utf-8") as handle:
            for line in handle:
                fields = line.split()
                if len(fields) >= 3 and fields[0] == name:
                    return int(fields[2]) if fields[2].isdigit() else 0
    except OSError:
        return None
    return None


def _maybe_nvidia(sysfs, function):
    """False only when the function's vendor reads as another vendor's: a vendor that cannot be read (EACCES,
    EIO, ENODEV, a function gone) is unknown, and an unknown holder of a held device counts (unknown is held)."""
    try:
        return sysfs.read("%s/%s/vendor" % (PCI_DEVICES, function)) == NVIDIA_VENDOR
    except SysfsError:
        return True


def _passed_through(sysfs, address):
    """A GPU passed through whole: a PF whose driver link names a passthrough stub (vfio-pci...). Its VM does not
    use the vGPU stack (node/holders/pf_driver.py). Only what is read counts: an unreadable link is not passed through."""
    dev = PciDevice(sysfs, address)
    return dev.driver in pf_driver.STUB_DRIVERS and not dev.is_vf


def users(sysfs, dev_root="/dev", proc_root="/proc", sources=()):
    """One line per NVIDIA VF/mdev a process (or a `sources` holder) holds, plus one when nvidia_vgpu_vfio has
    users."""
    found = []
    held = inuse.held_devices(sysfs, dev_root, proc_root, sources=sources)
    parents = inuse.mdev_parents(sysfs) if held else {}
    for name in sorted(held):
        function = parents.get(name, name)
        if not _maybe_nvidia(sysfs, function):
            continue
        if name not in parents and _passed_through(sysfs, name):
            continue
        kind = "mdev %s on %s" % (name, function) if name in parents else name
        found.append("%s held by %s" % (kind, inuse.describe(held[name])))
    count = module_use_count(proc_root, VFIO_MODULE)
    if count:
        found.append("module %s has %d user(s)" % (VFIO_MODULE, count))
    return found
