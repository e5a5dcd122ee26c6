# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Notice a vGPU-manager restart between reconciles, with one sysfs read per GPU per probe.

A restart of the vGPU manager (its pod: `sriov-manage -d ALL`, modules reloaded, `sriov-manage -e ALL`,
NVIDIA/gpu-driver-container `vgpu-manager/<os>/nvidia-driver`; or a driver reload) leaves every GPU without its
vGPU types: the VFs come back with `current_vgpu_type` 0, or are gone for a while; mdevs are gone. The agent would
otherwise notice only at its next resync (RESYNC_INTERVAL, 300 s by default) while VMs cannot start and the node
says `success`.

After each successful apply the agent arms the probe from the apply's result: per GPU that has vGPUs,
one sentinel, the GPU's last vGPU (a VF: its `nvidia/current_vgpu_type` must still read the type ID the
apply set; an mdev: its directory under `bus/mdev/devices` must still exist). Every `interval` seconds
(MANAGER_PROBE_INTERVAL, 5 s: two reads per GPU per 10 s) `check()` reads each sentinel once and returns
the GPUs whose sentinel changed, or is gone; the agent then re-applies at once and reports it. GPUs
without vGPUs cost nothing: there is nothing a restart could take from them.
Claim-time GPUs (node/engine/claim_time_layout.py) get no vGPU from the apply; their VFs are typed by the DRA
driver's Prepare between reconciles. `claimed()` (a constructor argument: the DRA plugin's `claim_time_vfs`) names,
per claim-time GPU, the VFs of prepared claims and the types they were prepared with, asked at every check (claims
come and go between reconciles). One of them per GPU is its sentinel, one read per check; `arm` reads each once and
passes over those without their type after the apply (a restart's reset the re-apply could not undo: a process holds
the VF), until the next apply.
"""

from __future__ import annotations

import time
from collections import OrderedDict

from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import SysfsError

VFIO_TYPE = "bus/pci/devices/%s/nvidia/current_vgpu_type"
MDEV_DIR = "bus/mdev/devices/%s"


class ManagerProbe:
    """Sentinels of the last applied layout; `check()` says which GPUs lost their vGPUs."""

    def __init__(self, sysfs, interval, clock=time.monotonic, claimed=None):
        self.sysfs, self.interval, self.clock = sysfs, float(interval), clock
        self.sentinels = OrderedDict()    # GPU address -> (path, expected text or None for "exists")
        self.next_due = None
        self.reads = 0                    # sysfs reads the probe made
        self.claimed = claimed            # () -> {GPU address: [(VF, type ID)]} of prepared claim-time claims
        self.passed = set()               # claim-time (VF, type ID) without their type after the last apply

    def arm(self, result):
        """Sentinels from an apply result (vgpu_apply.summarize: `gpus[].vgpus[]` with address, uuid, type_id)."""
        self.sentinels.clear()
        # claim-time VFs the apply left without their type (a process holds them): not watched until the next apply
        self.passed = {pair for pairs in (self.claimed() if self.claimed is not None else {}).values() for pair in pairs
                       if not self._holds(VFIO_TYPE % pair[0], str(pair[1]))}
        for gpu in result.get("gpus") or []:
            vgpus = [v for v in gpu.get("vgpus") or [] if v.get("after")]
            if not vgpus:
                continue
            last = vgpus[-1]
            if last.get("uuid"):
                self.sentinels[gpu["address"]] = (MDEV_DIR % last["uuid"], None)
            elif last.get("type_id"):
                self.sentinels[gpu["address"]] = (VFIO_TYPE % last["address"], str(last["type_id"]))
        self.next_due = self.clock() + self.interval if self.sentinels or self.claimed is not None else None

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
        lost = [gpu for gpu, (path, expected) in self.sentinels.items() if not self._holds(path, expected)]
        return lost + self._claimed_lost(set(self.sentinels))

    def _claimed_lost(self, watched):
        """The claim-time GPUs whose sentinel VF lost the type its claim was prepared with."""
        lost = []
        for gpu, pairs in sorted((self.claimed() if self.claimed is not None else {}).items()):
            pick = next((pair for pair in sorted(pairs) if pair not in self.passed), None)
            if gpu not in watched and pick is not None and not self._holds(VFIO_TYPE % pick[0], str(pick[1])):
                lost.append(gpu)
        return lost

    def _holds(self, path, expected):
        self.reads += 1
        if expected is None:
            return self.sysfs.isdir(path)
        try:
            return self.sysfs.read(path).strip() == expected
        except SysfsError:
            return False   # the VF is gone (VFs disabled) or unreadable: re-apply, which says why if it fails
