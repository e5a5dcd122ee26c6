# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""MIG-backed vGPUs placed at claim time (issue 42.2) as DRA devices, and their Prepare / Unprepare steps.

The shape is NVIDIA's DynamicMIG for containers (dra-driver-nvidia-gpu cmd/gpu-kubelet-plugin partitions.go,
docs/guides/gpu-allocation/mig.md), for vGPU; node/engine/claim_time_mig.py reads what the GPU offers. Per MIG claim-time
GPU:
- one counter set `gpu-<address>` (in a counter slice, like every claim-time GPU's) with `memory-slice-<i>` = 1
  for each of the GPU's memory slices, `compute-slices` = the compute slices no foreign GI takes, and
  `gi-profile-<ID>` = the instances left for a GI profile the driver limits below its placement count (`-lgip`
  Total; on Hopper the `+me` profile: one per GPU);
- one device per allowed MIG-backed type and free placement, `<profile>-gpu-<address>-at-<start>` (a DNS label),
  allocated to one claim (no allowMultipleAllocations), consuming `memory-slice-<s>` for each slice of its
  placement, its compute slices and, where limited, one `gi-profile-<ID>`. Two placements that share a memory
  slice can never both be allocated; the compute and instance counters stop combinations the slices alone allow
  but the GPU does not (two 4g, a second 1g+me).
Attributes: those of a profile device (claim_time.ProfileDevice: profile, typeName, typeID, series, framebuffer,
parentGPU, pcieRoot, numaNode, productName, framework, claimTime) plus `migBacked`, `giProfile`,
`placementStart`, `placementSize`; no pciBusID (the VF is chosen at Prepare).

Prepare (driver.py -> claim_time_prepare.py -> MigSteps, under the node lock), each step recorded durably in the
claim's checkpoint record (`mig` of the device record) BEFORE it is taken:
1. PrepareStarted with the VF chosen (an untyped VF of the GPU no other claim has) and `mig` {gpu, giProfile,
   start, size};
2. `before` = the GI IDs that exist now, then `nvidia-smi mig -i <PF> -cgi <ID>:<start> [-C]`, then `gi` = the new
   GI (found at that profile and start, not in `before`);
3. the type written to the VF (node/engine/vgpu_writer.py, the one writer) and read back;
4. `nvidia/gpu_instance_id` of the VF must be our GI (the driver picks the GI itself: a free GI of the same
   profile that is not ours could take the vGPU): otherwise the type is cleared and the claim fails;
5. CDI, metadata, PrepareCompleted (driver.py).
Unprepare / a failed Prepare / a stale record: clear the VF's type when nothing but the claim holds it, then
destroy the recorded GI (compute instance first) when it is still ours (node/engine/claim_time_mig.is_ours); a GI the
claim did not create is never destroyed. A VF that keeps its type (held) keeps its GI.
"""

from __future__ import annotations

from dataclasses import dataclass

from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import claim_time
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import devices as dra_devices
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.claims import ClaimError
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import claim_time_mig, mig
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw import vgpu_types
from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout.vgpu_layout import LayoutError

MEMORY_SLICE, COMPUTE, LIMITED = "memory-slice-%d", "compute-slices", "gi-profile-%d"


def device_name(profile, address, start):
    return dra_devices.device_name(profile, "gpu-%s-at-%d" % (address, start))


@dataclass(frozen=True)
class MigCounterSet(claim_time.CounterSet):
    """One MIG claim-time GPU's counters (a `spec.sharedCounters[]` entry); a CounterSet, so whatever knows a
    claim-time GPU by its counter set (claim_time.gpus_of, agent_plugin._still_used) knows this one."""

    memory_slices: int = mig.MEMORY_SLICES
    compute_slices: int = mig.COMPUTE_SLICES
    limits: tuple = ()              # ((GI profile ID, instances), ...)

    def counters(self):
        found = {MEMORY_SLICE % index: 1 for index in range(self.memory_slices)}
        found[COMPUTE] = self.compute_slices
        found.update((LIMITED % profile, count) for profile, count in self.limits)
        return found

    def to_api(self):
        return {"name": self.name, "counters": {name: {"value": str(value)} for name, value in self.counters().items()}}


@dataclass(frozen=True)
class PlacementDevice(claim_time.ProfileDevice):
    """One MIG-backed type at one placement of one GPU: one claim, what the placement takes."""

    gi_profile: int = 0
    start: int = 0
    size: int = 1
    compute: int = 1
    limited: bool = False           # consumes one `gi-profile-<ID>`

    def consumption(self):
        found = {MEMORY_SLICE % index: 1 for index in range(self.start, self.start + self.size)}
        found[COMPUTE] = self.compute
        if self.limited:
            found[LIMITED % self.gi_profile] = 1
        return found

    def attributes(self):
        attrs = super().attributes()
        attrs.update({"migBacked": {"bool": True}, "giProfile": {"int": self.gi_profile},
                      "placementStart": {"int": self.start}, "placementSize": {"int": self.size}})
        return attrs

    def to_api(self):
        entry = {"name": self.name, "attributes": self.attributes(),
                 "consumesCounters": [{"counterSet": self.counter_set, "counters": {
                     name: {"value": str(value)} for name, value in self.consumption().items()}}]}
        if self.withdrawn:
            entry["taints"] = [dict(claim_time.WITHDRAWN_TAINT)]
        return entry

    def record(self):
        """The static part of the claim's `mig` record (node/engine/claim_time_mig.py)."""
        return {"gpu": self.gpu, "giProfile": self.gi_profile, "start": self.start, "size": self.size}


def offers(sysfs, gpu):
    """[MigCounterSet, PlacementDevice, ...] of one entry of the apply result's `claim_time` that has `mig`."""
    address, facts = gpu["address"], gpu["mig"]
    limits = {int(profile): count for profile, count in (facts.get("limits") or {}).items()}
    root, numa = dra_devices.pcie_root(sysfs, address), dra_devices.numa_node(sysfs, address)
    found = [MigCounterSet(claim_time.counter_set_name(address), address, memory_slices=facts["memory_slices"],
                           compute_slices=facts["compute_slices"], limits=tuple(sorted(limits.items())))]
    for offer in gpu.get("profiles") or ():
        for start in offer["starts"]:
            found.append(PlacementDevice(
                device_name(offer["profile"], address, start), address, offer["profile"], offer["type_name"],
                offer["type_id"], offer["size_mib"], 1, root, numa, gpu.get("model"), gi_profile=offer["gi_profile"],
                start=start, size=offer["size"], compute=offer["compute"], limited=offer["gi_profile"] in limits))
    return found


class MigSteps:
    """The GI steps of one MIG-backed claim-time device (module docstring). `runner`: the engine's command runner
    (nvidia-smi); `compute_instances`: create a compute instance with the GI (mig.MigOptions, as the layout)."""

    def __init__(self, sysfs, runner, compute_instances=True):
        self.sysfs, self.smi, self.compute_instances = sysfs, mig.Smi(runner), compute_instances

    @staticmethod
    def choose(sysfs, vfs, taken, earlier=None, type_id=None):
        """An untyped VF no one else took (the type appears in its creatable list only once the GI exists); the
        earlier prepare's VF again when it is untyped or has the type (a crash after the write)."""
        if earlier and earlier in vfs and earlier not in taken and vgpu_types.read_current(sysfs, earlier) in (0, type_id):
            return earlier
        return next((vf for vf in vfs if vf not in taken and vgpu_types.read_current(sysfs, vf) == 0), None)

    def create(self, ref, record, note):
        try:
            return claim_time_mig.create(self.smi, record["gpu"], record, self.compute_instances, note)
        except LayoutError as exc:
            raise ClaimError("%s: %s" % (ref, exc)) from None

    def check_landed(self, ref, device, record):
        """ClaimError unless the VF's vGPU sits on the claim's GI (the caller clears the type)."""
        landed = claim_time_mig.landed_on(self.sysfs, device.address)
        if landed != record.get("gi"):
            raise ClaimError("%s: VF %s of GPU %s: its %s vGPU landed on GPU instance %s, not on GPU instance %s "
                             "this claim created at %d:%d" % (
                                 ref, device.address, device.parent_gpu, device.profile, landed, record.get("gi"),
                                 record["start"], record["size"]))

    def destroy(self, record):
        """None when the claim's GI is gone or destroyed, else why it stays (never another GI)."""
        try:
            return claim_time_mig.destroy(self.smi, record["gpu"], record)
        except LayoutError as exc:
            return str(exc)
