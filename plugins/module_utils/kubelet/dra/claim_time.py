# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Claim-time GPUs as DRA devices: what the node offers, so that the scheduler picks the profile.

Beta APIs only (Kubernetes 1.36.2+: DRAPartitionableDevices and DRAConsumableCapacity on by default, the
counter fix of kubernetes #139040/#139211 in). docs/design.md "Profiles chosen at claim time" has the reasoning;
in short, per claim-time GPU (node/engine/claim_time_layout.py says which, and what each offers):

- one counter set `gpu-<address>` with one counter `gpu: 1` (the GPU's equal-size mode: one profile at a time),
  published in counter slices of their own (a slice carries devices or sharedCounters since 1.35; at most 8
  counter sets per slice, so a 9th GPU opens a second counter slice);
- one device per GPU and offered profile, `<profile>-gpu-<address>`, with `allowMultipleAllocations: true`,
  `consumesCounters: [{counterSet: gpu-<address>, counters: {gpu: 1}}]` and the capacity `instances`
  (value: the profile's maximum on this GPU, the driver's `Max Instances` capped by the VFs) with
  `requestPolicy {default: 1, validValues: [1]}`: every allocation takes one instance.
  The scheduler charges a multi-allocatable device's counters once, while it has any allocation: the first
  claim of a profile takes the GPU's whole `gpu` counter, so no other profile's device of that GPU fits until
  the last claim of that profile is released; further claims of the same profile cost no counter, only an
  instance, and `instances` stops them at the maximum. A whole-GPU profile (48Q) has one instance.
- a profile device no longer offered (an allow-list narrowed, a profile the driver stopped listing) while claims
  may still use it stays published, `withdrawn`, with the device taint WITHDRAWN_TAINT (effect NoSchedule, KEP-5055:
  allocated claims keep it, no new claim gets it): kube-scheduler charges a counter only for allocated devices it
  still finds in the slices (kubernetes#140806), so withdrawing it would let another profile of its GPU be
  allocated next to it (agent_plugin.py decides how long it stays);
- attributes for CEL: `profile`, `typeName`, `typeID`, `series`, `framebuffer` (MiB, int), `parentGPU`,
  `resource.kubernetes.io/pcieRoot`, `numaNode`, `productName`, `framework`, `claimTime: true`. No
  `resource.kubernetes.io/pciBusID`: no VF is chosen before NodePrepareResources (claim_time_prepare.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import devices as dra_devices
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import whole_gpu

COUNTER = "gpu"                     # the one counter of a GPU's counter set
INSTANCES = "instances"             # the consumable capacity of a profile device
FRAMEWORK = "vendor-vfio"
WITHDRAWN_TAINT = dra_devices.WITHDRAWN_TAINT    # a withdrawn profile device's (devices.py says why)


def counter_set_name(address):
    return dra_devices.device_name("gpu", address)


def device_name(profile, address):
    return dra_devices.device_name(profile, "gpu-" + address)


@dataclass(frozen=True)
class CounterSet:
    """One GPU's shared counters (a `spec.sharedCounters[]` entry)."""

    name: str
    gpu: str
    value: int = 1

    shared_counters = True          # slices.py puts these in counter slices

    def counters(self):
        return {COUNTER: self.value}

    def to_api(self):
        return {"name": self.name, "counters": {COUNTER: {"value": str(self.value)}}}


@dataclass(frozen=True)
class ProfileDevice:
    """One profile of one claim-time GPU: multi-allocatable, `instances` of it at most."""

    name: str
    gpu: str
    profile: str
    type_name: str
    type_id: int
    size_mib: int
    max_instances: int
    pcie_root: str | None = None
    numa_node: int | None = None
    product: str | None = None
    withdrawn: bool = False         # no longer offered, published while claims may use it: tainted NoSchedule

    consumes_counters = True        # slices.py: at most 64 such devices per slice

    @property
    def counter_set(self):
        return counter_set_name(self.gpu)

    @property
    def series(self):
        return self.profile[-1:]

    def attributes(self):
        attrs = {"profile": {"string": self.profile}, "typeName": {"string": self.type_name[:dra_devices.MAX_STRING]},
                 "typeID": {"int": self.type_id}, "series": {"string": self.series},
                 "framebuffer": {"int": self.size_mib}, "framework": {"string": FRAMEWORK},
                 "parentGPU": {"string": self.gpu}, "claimTime": {"bool": True}}
        return dra_devices.placed(attrs, self.pcie_root, self.numa_node, self.product)

    def consumption(self):
        return {COUNTER: 1}

    def counter_set_for(self, kept, current):
        """The counter set of this device's GPU while `kept` (withdrawn devices of that GPU, this one among them) stay
        published: `current` (what the GPU offers now) when it has the same shape, else the shape they consume."""
        # a MigCounterSet is a CounterSet too, but not this shape
        same = type(current) is CounterSet      # pylint: disable=unidiomatic-typecheck
        return current if same else CounterSet(self.counter_set, self.gpu)

    def to_api(self):
        entry = {"name": self.name, "attributes": self.attributes(), "allowMultipleAllocations": True,
                 "capacity": {INSTANCES: {"value": str(self.max_instances),
                                          "requestPolicy": {"default": "1", "validValues": ["1"]}}},
                 "consumesCounters": [{"counterSet": self.counter_set, "counters": {COUNTER: {"value": "1"}}}]}
        if self.withdrawn:
            entry["taints"] = [dict(WITHDRAWN_TAINT)]
        return entry

    def withdraw(self):
        return replace(self, withdrawn=True)


def offers(sysfs, claim_time_result):
    """[CounterSet, ..., ProfileDevice and WholeGpuDevice, ...] for the apply result's `claim_time` list
    (node/engine/claim_time_layout Modes.result); a GPU that offers no profile (no VFs yet) publishes nothing."""
    from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import claim_time_mig  # pylint: disable=import-outside-toplevel
    sets, found = [], []
    for gpu in claim_time_result or ():
        if not gpu.get("profiles") and not gpu.get("held_whole"):   # a GPU given whole keeps its counter published
            continue
        if gpu.get("mig"):      # MIG-backed, placed at Prepare (claim_time_mig.py)
            mig_items = claim_time_mig.offers(sysfs, gpu)
            sets.append(mig_items[0])
            found.extend(mig_items[1:])
            continue
        address = gpu["address"]
        root, numa = dra_devices.pcie_root(sysfs, address), dra_devices.numa_node(sysfs, address)
        sets.append(CounterSet(counter_set_name(address), address))
        if gpu.get("whole_gpu"):    # the whole GPU beside its profiles, drawing all of its counters (whole_gpu.py)
            found.append(whole_gpu.device_for(sets[-1], gpu, root, numa))
        for offer in gpu["profiles"]:
            found.append(ProfileDevice(device_name(offer["profile"], address), address, offer["profile"],
                                       offer["type_name"], offer["type_id"], offer["size_mib"],
                                       offer["max_instances"], root, numa, gpu.get("model")))
    return sets + sorted(found, key=lambda device: device.name)


def with_withdrawn(offers, kept):
    """`offers` (offers()) and `kept` (devices no longer offered that stay published while claims may use them) as one
    list in which every device's counter set has the counters it consumes: a kept device keeps its consumption, and
    its GPU the counter shape it was published with (the allocator charges a device's consumption against its counter
    set by counter name: structured/internal/incubating allocator_incubating.go checkAvailableCounters). The shape
    the GPU offers now waits while kept devices of another shape remain: a MIG-backed placement withdrawn from a GPU
    that left claim-time or MIG mode keeps its memory slices, a `+me` placement its instance counter
    (claim_time_mig.PlacementDevice), and offered devices those sets cannot serve are not published yet."""
    sets = {item.name: item for item in offers if isinstance(item, CounterSet)}
    by_set = {}
    for item in kept:
        by_set.setdefault(item.counter_set, []).append(item)
    for name, items in by_set.items():
        sets[name] = items[0].counter_set_for(items, sets.get(name))
    offered = [item for item in offers if not isinstance(item, CounterSet)       # profiles, placements, whole GPUs
               and set(item.consumption()) <= set(sets[item.counter_set].counters())]
    return [sets[name] for name in sorted(sets)] + sorted(offered + list(kept), key=lambda device: device.name)


def from_slices(items):
    """[CounterSet, ..., ProfileDevice, ...] of the profile devices (attribute `claimTime`) that ResourceSlices
    (`items`, API objects) publish, as to_api wrote them: what a restarted agent published before it."""
    from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import claim_time_mig  # pylint: disable=import-outside-toplevel
    found = []
    for item in items or ():
        for entry in (item.get("spec") or {}).get("devices") or ():
            attrs = entry.get("attributes") or {}
            if not (_attribute(attrs, "claimTime", "bool") and _attribute(attrs, "parentGPU")
                    and _attribute(attrs, "profile")):
                continue
            try:
                if _attribute(attrs, "migBacked", "bool"):     # one placement, one claim (claim_time_mig.py)
                    found.append(claim_time_mig.from_entry(entry, _attribute))
                    continue
                found.append(ProfileDevice(
                    entry["name"], _attribute(attrs, "parentGPU"), _attribute(attrs, "profile"),
                    _attribute(attrs, "typeName"), _attribute(attrs, "typeID", "int"),
                    _attribute(attrs, "framebuffer", "int"),
                    int(((entry.get("capacity") or {}).get(INSTANCES) or {}).get("value")),
                    _attribute(attrs, dra_devices.PCIE_ROOT), _attribute(attrs, "numaNode", "int"),
                    _attribute(attrs, "productName"), bool(entry.get("taints"))))
            except (KeyError, TypeError, ValueError):
                continue    # not one of ours as we write them: nothing to keep
    found += whole_gpu.from_slices(items)
    return with_withdrawn([], found)


def _attribute(attrs, name, kind="string"):
    return (attrs.get(name) or {}).get(kind)


def gpus_of(items):
    """The claim-time GPUs (PF addresses) that `items` (offers()) publish."""
    return {item.gpu for item in items if isinstance(item, (CounterSet, ProfileDevice))}


class FeatureMissing(EngineError):
    """The API server stored a claim-time slice without the fields it needs; the message names the slice and field."""


def dropped_field(sent, stored):
    """The first claim-time field of `sent` (a ResourceSlice we wrote) that `stored` (the API server's answer) lacks:
    an API server older than 1.36 or with DRAPartitionableDevices / DRAConsumableCapacity off drops them
    (kubernetes pkg/registry/resource/resourceslice/strategy.go dropDisabledFields) instead of refusing the write."""
    if not isinstance(stored, dict):
        return None
    ours, theirs = sent.get("spec") or {}, stored.get("spec") or {}
    if ours.get("sharedCounters") and not theirs.get("sharedCounters"):
        return "spec.sharedCounters"
    for mine, kept in zip(ours.get("devices") or (), theirs.get("devices") or ()):
        for field in ("consumesCounters", "allowMultipleAllocations"):
            if mine.get(field) and not kept.get(field):
                return "spec.devices[%s].%s" % (mine.get("name"), field)
        for name, capacity in (mine.get("capacity") or {}).items():
            if capacity.get("requestPolicy") and not ((kept.get("capacity") or {}).get(name) or {}).get("requestPolicy"):
                return "spec.devices[%s].capacity.%s.requestPolicy" % (mine.get("name"), name)
    return None


def dropped_taints(sent, stored):
    """Whether the API server stored `sent` without the device taints it carries (DRADeviceTaints off: dropped like
    the fields above)."""
    if not isinstance(stored, dict):
        return False
    kept = {d.get("name"): d for d in (stored.get("spec") or {}).get("devices") or ()}
    return any(d.get("taints") and not (kept.get(d.get("name")) or {}).get("taints")
               for d in (sent.get("spec") or {}).get("devices") or ())


def check_stored(sent, stored):
    """FeatureMissing when the API server dropped a claim-time field of the slice `sent`."""
    field = dropped_field(sent, stored)
    if field:
        raise FeatureMissing("ResourceSlice %s: the API server dropped %s: it does not serve partitionable devices and "
                             "consumable capacity (Kubernetes 1.36.2 or later with DRAPartitionableDevices and "
                             "DRAConsumableCapacity on)" % (sent["metadata"]["name"], field))
