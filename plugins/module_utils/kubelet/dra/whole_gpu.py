# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Whole GPU or vGPUs on one counter (issue 42 item 1): the whole-GPU device of a claim-time GPU, and its Prepare.

A claim-time GPU declared `whole-gpu: true` (node/engine/claim_time_layout.py) publishes, beside its profile devices, one
device `whole-gpu-<address>` that consumes EVERY counter of the GPU's counter set at its full value (today the one
counter `gpu: 1`; a counter set with more counters is consumed whole too). The counting argument (docs/design.md
"Whole GPU or vGPUs"): a profile device draws `gpu: 1` while it has any allocation; the whole device draws all of
it; the allocator allocates a device only when every counter it draws is still free (kubernetes
structured/allocator checkAvailableCounters), so while a vGPU claim holds the GPU the whole device does not fit,
and while a whole claim holds it no profile device fits. The whole device is not multi-allocatable: one claim.

Attributes: `resource.kubernetes.io/pciBusID` (the PF), `wholeGPU: true`, `framework: vfio-pci`, `profile: whole`,
`claimTime: true`, `framebuffer` (MiB, the GPU's), `parentGPU`, `productName`, `pcieRoot`, `numaNode`: the keys the
claim-time profile devices carry too, so a selector written for those evaluates on this one without an error.

Prepare (`WholeGpuPreparer`, called by driver.py under the node lock): `check` refuses while any VF has a type, or
the PF or a VF is held (a VM, a prepared claim, a device plugin allocation: every in-use holder source), or the PF
is bound to another driver than nvidia that no record of this claim explains (an operator's passthrough); then the
driver records the claim, and `take` runs node/engine/whole_gpu.py's steps, each recorded before it is taken.
Unprepare: `give_back` (back to nvidia, VFs enabled and verified); the profile devices stay published throughout,
so the GPU's vGPUs are offered again as soon as the counter is free.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace

from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import devices as dra_devices
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.claims import ClaimError
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import sriov, whole_gpu
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import claim_holders
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw import pci
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import SysfsError

FRAMEWORK = whole_gpu.VFIO_DRIVER
PROFILE = "whole"


def device_name(address):
    return dra_devices.device_name("whole-gpu", address)


@dataclass(frozen=True)
class WholeGpuDevice:
    """The whole GPU as one DRA device (ResourceSlice entry), and as a prepared device (driver entries)."""

    name: str
    gpu: str
    counter_set: str
    counters: tuple                 # ((counter, value), ...): everything the GPU's counter set holds
    framebuffer_mib: int | None = None
    pcie_root: str | None = None
    numa_node: int | None = None
    product: str | None = None
    offer: dict = field(default=None, compare=False, hash=False)   # the GPU's claim-time offers, kept in the record
    withdrawn: bool = False     # no longer offered, published while claims may use it: tainted (agent_plugin._still_used)

    consumes_counters = True        # slices.py: at most 64 such devices per slice
    type_id = None                  # no vGPU type: nothing to restore or clear
    mdev_uuid = None

    @property
    def key(self):
        return self.gpu             # what the claim holds (checkpoint holders, inuse)

    @property
    def address(self):
        return self.gpu             # cdi.py / devices.vfio_nodes: the PF's VFIO group

    def attributes(self):
        attrs = {dra_devices.PCI_BUS_ID: {"string": self.gpu}, "wholeGPU": {"bool": True},
                 "framework": {"string": FRAMEWORK}, "profile": {"string": PROFILE}, "claimTime": {"bool": True},
                 "parentGPU": {"string": self.gpu}}
        if self.framebuffer_mib:
            attrs["framebuffer"] = {"int": self.framebuffer_mib}
        return dra_devices.placed(attrs, self.pcie_root, self.numa_node, self.product)

    def to_api(self):
        entry = {"name": self.name, "attributes": self.attributes(),
                 "consumesCounters": [{"counterSet": self.counter_set,
                                       "counters": {name: {"value": value} for name, value in self.counters}}]}
        if self.withdrawn:
            entry["taints"] = [dict(dra_devices.WITHDRAWN_TAINT)]
        return entry

    def withdraw(self):
        return replace(self, withdrawn=True)

    def consumption(self):
        return dict(self.counters)

    def counter_set_for(self, kept, current):
        """The GPU's counter set while `kept` (withdrawn devices of this GPU, this one among them) stay published
        (claim_time.with_withdrawn): the plain set offered now, else the one this device draws all of."""
        from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import claim_time  # pylint: disable=import-outside-toplevel
        if type(current) is claim_time.CounterSet:     # pylint: disable=unidiomatic-typecheck
            return current
        return claim_time.CounterSet(self.counter_set, self.gpu, int(self.consumption().get(claim_time.COUNTER, 1)))


def device_for(counter_set, gpu, pcie_root=None, numa_node=None):
    """The whole device of the claim-time GPU `gpu` (an apply result's claim_time entry) drawing all of
    `counter_set` (claim_time.CounterSet: its to_api() counters, each at its full value)."""
    counters = tuple(sorted((name, value["value"]) for name, value in counter_set.to_api()["counters"].items()))
    sizes = [offer.get("size_mib") or 0 for offer in gpu.get("profiles") or ()]
    offer = {"model": gpu.get("model"), "vfs": gpu.get("vfs"), "profiles": copy.deepcopy(gpu.get("profiles") or [])}
    return WholeGpuDevice(device_name(gpu["address"]), gpu["address"], counter_set.name, counters,
                          max(sizes) if sizes else None, pcie_root, numa_node, gpu.get("model"), offer)


def from_slices(items):
    """The whole-GPU devices ResourceSlices (`items`, API objects) publish, as to_api wrote them: what a restarted agent
    published before (kept while its first applies fail: a whole device dropped under its claim frees the counter)."""
    found = []
    for item in items or ():
        for entry in (item.get("spec") or {}).get("devices") or ():
            attrs = entry.get("attributes") or {}
            try:
                if not (attrs.get("wholeGPU") or {}).get("bool"):
                    continue
                [draws] = entry["consumesCounters"]
                found.append(WholeGpuDevice(
                    entry["name"], attrs["parentGPU"]["string"], draws["counterSet"],
                    tuple(sorted((name, value["value"]) for name, value in draws["counters"].items())),
                    (attrs.get("framebuffer") or {}).get("int"), (attrs.get(dra_devices.PCIE_ROOT) or {}).get("string"),
                    (attrs.get("numaNode") or {}).get("int"), (attrs.get("productName") or {}).get("string"),
                    withdrawn=bool(entry.get("taints"))))
            except (KeyError, TypeError, ValueError):
                continue    # not one of ours as we write them
    return found


class WholeGpuPreparer:
    """`holders`: which devices are held and by whom (an inuse.Holders asking every holder source:
    node/holders/kubelet_holders.node_holders), used under the node lock only; `runner`: sriov-manage's;
    `record`: the allocation record's path (pod_allocations.record_path)."""

    def __init__(self, sysfs, holders, runner, record=None):
        self.sysfs, self.holders, self.runner, self.record = sysfs, holders, runner, record
        self.devices = {}

    def update(self, items):
        """The whole-GPU devices as last published (claim_time.offers)."""
        self.devices = {item.name: item for item in items if isinstance(item, WholeGpuDevice)}

    def owns(self, name):
        return name in self.devices

    def check(self, ref, name, earlier=None):
        """The WholeGpuDevice `name` of claim `ref` when the GPU may be given whole now, else a ClaimError naming the
        GPU and what holds it (nothing written). `earlier`: this claim's record of it (a retry after a crash)."""
        device = self.devices[name]
        self.holders.forget()       # a new prepare: the devices' facts are read again
        mine = claim_holders.HOLDER % (ref.namespace, ref.name)
        try:
            driver = pci.PciDevice(self.sysfs, device.gpu).driver
            found = self.holders.held([device.gpu] + pci.PciDevice(self.sysfs, device.gpu).virtfns())
            # another claim's record holds the PF (given whole to it, a stale allocation): named, not guessed at
            others = [h for h in found.get(device.gpu) or () if claim_holders.is_claim_holder(h) and h != mine]
            if others:
                why = "it is given whole to %s" % ", ".join(sorted(others))
            # a retry after a crash finds the PF where this claim's recorded step left it (any driver): ours
            elif driver != whole_gpu.HOST_DRIVER and not (earlier or {}).get("whole"):
                why = "it is bound to %s, not by this driver (an operator's passthrough?)" % (driver or "no driver")
            elif driver != whole_gpu.VFIO_DRIVER and not self.sysfs.isdir(whole_gpu.VFIO_DRIVER_DIR):
                # else the VFs would go and the PF leave nvidia before the bind finds no driver to take it
                why = "the %s driver is not loaded (modprobe %s)" % (whole_gpu.VFIO_DRIVER, whole_gpu.VFIO_DRIVER)
            else:
                why = whole_gpu.busy(self.sysfs, device.gpu, found, (mine,))
        except (SysfsError, OSError) as exc:
            why = "it cannot be read (%s)" % exc
        if why:
            raise ClaimError("%s: device %s: GPU %s cannot be given whole: %s; nothing written" % (
                ref, name, device.gpu, why))
        return device

    def record_of(self, device):
        """The checkpoint record's `whole` field for the device (its offers are published while VFs are off)."""
        return {"step": whole_gpu.STEP_CHECKED, "offers": copy.deepcopy(device.offer)}

    def _set_vfs(self, pf, count):
        sriov.set_count(self.sysfs, self.runner, [pf], count, self.holders, self.record)

    def take(self, ref, device, step):
        """Prepare's steps (node/engine/whole_gpu.take); `step(name)` records each before it is taken."""
        try:
            whole_gpu.take(self.sysfs, device.gpu, self._set_vfs, step)
        except (whole_gpu.WholeGpuError, SysfsError) as exc:
            raise ClaimError("%s: GPU %s: %s" % (ref, device.gpu, exc)) from None
        except ClaimError:
            raise
        except Exception as exc:  # pylint: disable=broad-exception-caught
            # the sriov engine's errors (SriovError) name the PF; said as this claim's error
            raise ClaimError("%s: GPU %s cannot be given whole: %s" % (ref, device.gpu, exc)) from None

    def give_back(self, ref, gpu, step, ours=True):
        """Unprepare's steps (node/engine/whole_gpu.give_back) for the PF `gpu`; a ClaimError naming it when they fail.
        `ours`: the claim's record is of this boot (else the PF's driver is not this driver's doing)."""
        self.holders.forget()
        try:
            whole_gpu.give_back(self.sysfs, gpu, self._set_vfs, step, self.holders.held([gpu]), ours)
        except Exception as exc:  # pylint: disable=broad-exception-caught
            raise ClaimError("%s: GPU %s is not given back to vGPUs yet: %s; the kubelet retries" % (
                ref, gpu, exc)) from None
