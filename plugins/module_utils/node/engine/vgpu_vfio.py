# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Vendor-specific VFIO backend (vGPU 17+, Ada/Hopper/Blackwell): one vGPU per SR-IOV VF.

Facts (kubevirt/kubevirt#17642; harvester/pcidevices `pkg/controller/gpudevice/vgpu_controller.go` and its sysfs
fixture; NVML `nvmlDeviceGetCreatableVgpus`): a VF stays on `nvidia` and is typed through
`<VF>/nvidia/current_vgpu_type` (write the numeric ID, `0` clears; reading gives only the ID).
`creatable_vgpu_types` lists what is creatable *now*: it shrinks on every sibling after each write
and consumed types drop out, so the ID<->name catalog is built from all VFs before the first write
(completed from `nvidia-smi vgpu -s -v` when a set ID or a wanted profile is missing). The driver
refuses a write of a type that is not creatable on that VF now; where the plan cannot predict the
lists, the VF's list is re-read right before each write (see `predictable`). In default
(homogeneous) mode all vGPUs of a GPU share one framebuffer size; other sizes need mixed-size mode.

Per-VF diff, not VDM's "clear all": VFs that already have a wanted type are kept (held VFs first),
only wrong VFs are cleared, free VFs are filled in VF order. A VF a VM holds is never written; a
layout that needs it changed fails naming it, before any write.
"""

from __future__ import annotations

from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw import vgpu_types as vt
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import claim_holders
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders.inuse import describe
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.vgpu_types import mig_backed
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.pci import PciDevice
from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout.vgpu_layout import (
    GpuPlan, LayoutError, VgpuChange, check_sizes, choose_profiles, gpu_model, type_size_gb)
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine.vgpu_writer import VgpuWriteError, VgpuWriter

FRAMEWORK = "vendor-vfio"


class VfioGpu:
    """What the driver shows for one GPU before any write: VFs, their types, the type catalog."""

    def __init__(self, sysfs, gpu, held, supported_types=None, vfs=None, known_types=None):
        """`vfs`: the GPU's VF addresses when the caller has read them already (they cost a readlink each).

        `known_types`: every type the GPU supports, from the node cache (no driver call), or None.
        """
        self.sysfs, self.gpu = sysfs, gpu
        self.vfs = PciDevice(sysfs, gpu.address).virtfns() if vfs is None else list(vfs)
        self.held = dict((vf, held[vf]) for vf in self.vfs if vf in held)
        self.restorable = {}   # VF -> type ID a prepared DRA claim holds it with, lost since (see restorable())
        self.current, self.catalog = {}, {}
        first = self.vfs[0] if self.vfs else None
        listed = []
        if first:
            self.current[first] = vt.read_current(sysfs, first) or 0
            listed = vt.read_creatable(sysfs, first)
        # When the first VF still offers a type as large as the whole GPU, no VF holds framebuffer, so
        # none has a vGPU: its siblings' current_vgpu_type need not be read (a round trip each).
        self.all_free = bool(first) and not self.current[first] and _whole_gpu_offered(listed, known_types)
        for vf in self.vfs[1:]:
            self.current[vf] = 0 if self.all_free else (vt.read_current(sysfs, vf) or 0)
        # Lists of a GPU without vGPUs show every supported type, the same on every VF: one read
        # does. Once some are set the lists collapse and differ (brief 1.4): they only name types,
        # so they are read only when the node cache (same driver) cannot name every set ID.
        # In MIG mode they show only MIG-backed types with a free GPU instance (none without GIs): never
        # every supported type, so such a list completes nothing (the driver's list is asked instead).
        self.lists_complete = self.complete = not any(self.current.values()) and not all(
            mig_backed(t.name) for t in listed)
        known = dict((t.type_id, t) for t in known_types or [])
        if not self.lists_complete and known and all(i in known for i in self.current.values() if i):
            listed, self.complete = listed + list(known.values()), True
        elif not self.lists_complete:
            for vf in self.vfs[1:]:
                listed = listed + vt.read_creatable(sysfs, vf)
        for vgpu_type in listed:
            self.catalog.setdefault(vgpu_type.type_id, vgpu_type)
        self._supported_types = supported_types
        if not self.complete or any(i not in self.catalog for i in self.current.values() if i):
            self._ask_driver()

    def _ask_driver(self):
        """Complete the catalog once from `supported_types(pf) -> (types, whether that is all of them)`."""
        if self._supported_types is None:
            return
        ask, self._supported_types = self._supported_types, None
        listed, complete = ask(self.gpu.address)
        for vgpu_type in listed:
            self.catalog.setdefault(vgpu_type.type_id, vgpu_type)
        self.complete = self.complete or complete

    def type_of(self, type_id):
        if not type_id:
            return None
        if type_id not in self.catalog:
            raise LayoutError("VF %s of GPU %s has vGPU type ID %d, which no creatable_vgpu_types list or "
                              "`nvidia-smi vgpu -s -v` names" % (self._vf_with(type_id), self.gpu.address, type_id))
        return self.catalog[type_id]

    def _vf_with(self, type_id):
        return next(vf for vf, cur in self.current.items() if cur == type_id)

    def find(self, profile):
        found = vt.find_type(profile, self.catalog.values())
        if found is None and self._supported_types is not None:
            self._ask_driver()
            found = vt.find_type(profile, self.catalog.values())
        return found

    @property
    def model(self):
        return gpu_model(self.catalog.values())

    def total_gb(self):
        """Framebuffer of the whole GPU = the largest type's size, when the catalog is complete."""
        sizes = [type_size_gb(t) for t in self.catalog.values()]
        sizes = [s for s in sizes if s]
        return max(sizes) if self.complete and sizes else None


def _whole_gpu_offered(listed, known_types):
    """Whether `listed` (a VF's creatable list now) offers one of the largest types of `known_types`
    (the GPU's full catalog: the largest type takes the whole framebuffer), same ID and name."""
    if not known_types or not listed:
        return False
    sizes = dict((t, type_size_gb(t)) for t in known_types)
    largest = max([s for s in sizes.values() if s] or [0])
    whole = set(t for t, s in sizes.items() if largest and s == largest)
    return any(t in whole for t in listed)


def restorable(view, claimed_types):
    """{VF: type ID} of VFs whose only holders are prepared DRA claims (no process has them open), which have no
    type now and were prepared with one (`claimed_types`, node/holders/claim_holders): a vGPU-manager restart reset them
    under the claim. Setting that type again gives the claim back what it was prepared with; nothing else may
    write a held VF."""
    found = {}
    for vf, holders in view.held.items():
        type_id = claimed_types.get(vf)
        if type_id and not view.current.get(vf) and holders and all(map(claim_holders.is_claim_holder, holders)):
            found[vf] = type_id
    return found


def plan(view, entries, mixed_size=False, absent=False):
    """A GpuPlan for one vendor-VFIO GPU; raises LayoutError before anything is written."""
    gpu = view.gpu
    result = GpuPlan(gpu.address, FRAMEWORK, view.model, "%s:%s" % (gpu.vendor, gpu.device))
    if not view.vfs:
        raise LayoutError("GPU %s: SR-IOV VFs are not enabled; enable them first (accelops.vgpu.sriov_vfs, or "
                          "accelops-vgpu apply which enables them)" % gpu.address)
    before = dict((vf, _named(view, cur, absent)) for vf, cur in view.current.items())
    if absent:
        wanted = {}
    else:
        entry, wanted = choose_profiles(gpu.address, view.model, entries, view.find)
        result.origin = entry.origin
    after = _assign(gpu.address, view, before, wanted, absent, result)
    if not absent and not any(t is not None and mig_backed(t.name) for t in after.values()):
        # MIG-backed types need no mixed-size mode: their GPU instances are checked by node/engine/mig.py
        check_sizes(gpu.address, [t for t in after.values() if t is not None], mixed_size,
                    view.total_gb(), len(view.vfs))
    result.mixed_size = bool(mixed_size)
    for vf in view.vfs:
        result.vgpus.append(VgpuChange(vf, before[vf], after[vf], held=view.held.get(vf)))
        if view.current[vf] and (after[vf] is None or after[vf].type_id != view.current[vf]):
            result.steps.append(("clear", vf, 0))  # a set type is changed through 0
    for vf in view.vfs:
        if after[vf] is not None and (before[vf] is None or before[vf].type_id != after[vf].type_id):
            result.steps.append(("set", vf, after[vf].type_id))
    result.steps.sort(key=lambda step: step[0] != "clear")  # clears first, then fills, each in VF order
    return result


def _named(view, type_id, absent):
    """The type set on a VF; clearing (absent) needs no name, so an unnamed ID is not an error then."""
    if absent and type_id and type_id not in view.catalog:
        return vt.VgpuType(type_id, "type-%d" % type_id)
    return view.type_of(type_id)


def _assign(address, view, before, wanted, absent, result):
    """VF -> wanted type after the apply: keep right VFs (held first), clear wrong ones, fill free ones."""
    remaining = dict((t.type_id, n) for t, n in wanted.items())
    after = dict((vf, None) for vf in view.vfs)
    ordered = [vf for vf in view.vfs if vf in view.held] + [vf for vf in view.vfs if vf not in view.held]
    for vf in ordered:
        current = before[vf]
        if current is not None and remaining.get(current.type_id, 0) > 0:
            remaining[current.type_id] -= 1
            after[vf] = current
        elif vf in view.held and view.current[vf]:
            if absent:
                after[vf] = current
                result.warnings.append("VF %s of GPU %s is held by a VM (%s); its vGPU was left in place"
                                       % (vf, address, describe(view.held[vf])))
            else:
                raise LayoutError("VF %s of GPU %s is held by a VM (%s) and has %s; the layout needs it changed"
                                  % (vf, address, describe(view.held[vf]),
                                     current.short if current else "type %d" % view.current[vf]), held=[vf])
    for vf, type_id in sorted(view.restorable.items()):
        if not absent and after[vf] is None and remaining.get(type_id, 0) > 0:
            after[vf] = view.type_of(type_id)
            remaining[type_id] -= 1
            result.warnings.append("VF %s of GPU %s lost its vGPU type under %s (vGPU manager restarted?); %s set "
                                   "again" % (vf, address, describe(view.held[vf]), after[vf].short))
    free = [vf for vf in view.vfs if after[vf] is None and vf not in view.held]
    fills = sorted(((t, n) for t, n in wanted.items()), key=lambda item: -(type_size_gb(item[0]) or 0))
    for vgpu_type, dummy in fills:
        while remaining.get(vgpu_type.type_id, 0) > 0:
            if not free:
                raise LayoutError("GPU %s: no free VF left for %s (%d VFs, %d held by VMs)"
                                  % (address, vgpu_type.short, len(view.vfs), len(view.held)))
            after[free.pop(0)] = vgpu_type
            remaining[vgpu_type.type_id] -= 1
    return after


def rebuild(view, gpu_plan):
    """Clear and re-create every vGPU: the driver switches mixed-size mode only on an empty GPU."""
    for vf in view.vfs:
        if not view.current[vf]:
            continue
        if vf in view.held:
            raise LayoutError("GPU %s needs mixed-size mode, which the driver only switches on a GPU without "
                              "vGPUs, but VF %s is held by a VM" % (gpu_plan.address, vf))
        if ("clear", vf, 0) not in gpu_plan.steps:
            gpu_plan.steps += [("clear", vf, 0), ("set", vf, view.current[vf])]
    gpu_plan.steps.sort(key=lambda step: (step[0] != "clear", view.vfs.index(step[1])))


def predictable(view, gpu_plan):
    """Whether the driver's creatable lists during the plan's writes follow from the plan alone.

    True for a GPU that had no vGPUs (its complete list was read under the node lock) getting vGPUs
    of one framebuffer size: the plan checked count and framebuffer, and in either mode the lists
    keep offering that size until the plan's vGPUs are in. Elsewhere (vGPUs already set, several
    sizes, a mode switch) what stays creatable depends on placement: re-read before each write.
    """
    sizes = set(type_size_gb(view.catalog[s[2]]) for s in gpu_plan.steps if s[0] == "set")
    return view.lists_complete and not gpu_plan.switch_mode and len(sizes) == 1 and None not in sizes


def execute(sysfs, view, gpu_plan, steps=None, writer=None):
    """Run the plan's writes: clears, then fills; `view.current` follows each successful write.
    `writer`: the node's vGPU writer (node/engine/vgpu_writer.py; vgpu_apply's raises HeldSincePlan when a VM opened the VF
    or a pod was allocated it since the plan); None: one that asks no holder (tests).

    The driver checks every write against what is creatable on that VF now and refuses the rest
    (brief 1.4), so a successful write is the read-back, and a refused one leaves the VF as it was.
    Where the plan cannot predict the creatable lists (see `predictable`) the VF's list is re-read
    before the write, and a type no longer listed stops the apply before writing it; a refused write
    is reported with the kernel's errno and what the VF offers now (one re-read).
    """
    writer = writer if writer is not None else VgpuWriter(sysfs, None)
    reread = not predictable(view, gpu_plan)
    for action, vf, type_id in gpu_plan.steps if steps is None else steps:
        if action == "set" and reread:
            creatable = vt.read_creatable(sysfs, vf)
            if type_id not in [t.type_id for t in creatable]:
                raise _not_creatable(view, gpu_plan, vf, type_id, creatable)
        try:
            writer.set_type(vf, type_id, read_back=False)
        except VgpuWriteError as err:
            if action != "set" or err.refused is None:
                raise
            raise _not_creatable(view, gpu_plan, vf, type_id, vt.read_creatable(sysfs, vf), err.refused) from None
        view.current[vf] = type_id


def _not_creatable(view, gpu_plan, vf, type_id, creatable, err=None):
    refused = "the driver refused it: %s; " % err if err is not None else ""
    return LayoutError("VF %s of GPU %s: %s (ID %d) is not creatable now (%screatable: %s)"
                       % (vf, gpu_plan.address, view.catalog[type_id].short, type_id, refused,
                          ", ".join(t.short for t in creatable) or "none"))


def current_profiles(view):
    """{short name: count} of the vGPUs set on the GPU (for assert/export)."""
    counts = {}
    for cur in view.current.values():
        if cur:
            name = view.type_of(cur).short
            counts[name] = counts.get(name, 0) + 1
    return counts
