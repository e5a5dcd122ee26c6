# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Notice a vGPU-manager restart between reconciles, with one sysfs read per GPU per probe.

A restart of the vGPU manager (its pod: `sriov-manage -d ALL`, modules reloaded, `sriov-manage -e ALL`,
domain brief 6; or a driver reload) leaves every GPU without its vGPU types: the VFs come back with
`current_vgpu_type` 0, or are gone for a while; mdevs are gone. The agent would otherwise notice only at
its next resync (RESYNC_INTERVAL, 300 s by default) while VMs cannot start and the node says `success`.

After each successful apply the agent arms the probe from the apply's result: per GPU that has vGPUs,
one sentinel, the GPU's last vGPU (a VF: its `nvidia/current_vgpu_type` must still read the type ID the
apply set; an mdev: its directory under `bus/mdev/devices` must still exist). Every `interval` seconds
(MANAGER_PROBE_INTERVAL, 5 s: two reads per GPU per 10 s) `check()` reads each sentinel once and returns
the GPUs whose sentinel changed, or is gone; the agent then re-applies at once and reports it. GPUs
without vGPUs cost nothing: there is nothing a restart could take from them.
"""

from __future__ import annotations

import time
from collections import OrderedDict

from ansible_collections.accelops.vgpu.plugins.module_utils.node.sysfs import SysfsError

VFIO_TYPE = "bus/pci/devices/%s/nvidia/current_vgpu_type"
MDEV_DIR = "bus/mdev/devices/%s"


class ManagerProbe:
    """Sentinels of the last applied layout; `check()` says which GPUs lost their vGPUs."""

    def __init__(self, sysfs, interval, clock=time.monotonic):
        self.sysfs, self.interval, self.clock = sysfs, float(interval), clock
        self.sentinels = OrderedDict()    # GPU address -> (path, expected text or None for "exists")
        self.next_due = None
        self.reads = 0                    # sysfs reads the probe made

    def arm(self, result):
        """Sentinels from an apply result (vgpu_apply.summarize: `gpus[].vgpus[]` with address, uuid, type_id)."""
        self.sentinels.clear()
        for gpu in result.get("gpus") or []:
            vgpus = [v for v in gpu.get("vgpus") or [] if v.get("after")]
            if not vgpus:
                continue
            last = vgpus[-1]
            if last.get("uuid"):
                self.sentinels[gpu["address"]] = (MDEV_DIR % last["uuid"], None)
            elif last.get("type_id"):
                self.sentinels[gpu["address"]] = (VFIO_TYPE % last["address"], str(last["type_id"]))
        self.next_due = self.clock() + self.interval if self.sentinels else None

    def disarm(self):
        self.sentinels.clear()
        self.next_due = None

    def seconds_left(self):
        """Seconds until the next check is due; None when disarmed."""
        return None if self.next_due is None else max(0.0, self.next_due - self.clock())

    def check(self):
        """[GPU address] that lost their vGPUs, when a check is due (one read per armed GPU); else []."""
        if self.next_due is None or self.clock() < self.next_due:
            return []
        self.next_due = self.clock() + self.interval
        return [gpu for gpu, (path, expected) in self.sentinels.items() if not self._holds(path, expected)]

    def _holds(self, path, expected):
        self.reads += 1
        if expected is None:
            return self.sysfs.isdir(path)
        try:
            return self.sysfs.read(path).strip() == expected
        except SysfsError:
            return False   # the VF is gone (VFs disabled) or unreadable: re-apply, which says why if it fails
