# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Legacy mdev backend: Turing (T4: the PF is the mdev parent) and Ampere SR-IOV (A2/A16: each VF
is a parent holding at most one mdev).

Facts (kernel `Documentation/driver-api/vfio-mediated-device.rst`; NVIDIA/go-nvlib `pkg/nvmdev/nvmdev.go`):
parents are `class/mdev_bus/<BDF>`, mdevs `bus/mdev/devices/<UUID>`;
`<parent>/mdev_supported_types/nvidia-<N>/{name,available_instances,description,create}`; create by
writing a UUID to `create`, remove by writing `1` to `bus/mdev/devices/<UUID>/remove`. VDM spreads
instances across a GPU's VF parents up to each `available_instances`.

Same semantics as the vendor-VFIO backend: keep mdevs of a wanted type (held ones first), remove
only unwanted ones no VM holds, create the rest. UUIDs are uuid5(parent, profile, index), so
re-creating after a reboot yields the same UUIDs and re-applying never churns them.
"""

from __future__ import annotations

import uuid as uuid_mod

from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw import vgpu_types as vt
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders.inuse import describe, mdev_parents as mdev_parent_map
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.pci import PciDevice
from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout.vgpu_layout import (
    GpuPlan, LayoutError, VgpuChange, check_sizes, choose_profiles, gpu_model, type_size_gb)
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine.vgpu_writer import VgpuWriter

FRAMEWORK = "mdev"
UUID_NAMESPACE = uuid_mod.UUID("bece7918-b269-5ece-ac7c-e45e85219fbe")


def mdev_uuid(parent, profile, index):
    """The deterministic UUID of the index-th `profile` mdev on `parent`."""
    return str(uuid_mod.uuid5(UUID_NAMESPACE, "%s/%s/%d" % (parent, profile, index)))


class Mdev:
    def __init__(self, uuid, parent, vgpu_type, held):
        self.uuid, self.parent, self.type, self.held = uuid, parent, vgpu_type, held


class MdevGpu:
    """A GPU's mdev parents (the PF, or its VFs), their types and the mdevs on them."""

    def __init__(self, sysfs, gpu, held):
        self.sysfs, self.gpu = sysfs, gpu
        on_bus = set(vt.mdev_parents(sysfs))
        self.pf_parent = gpu.address in on_bus
        self.parents = [gpu.address] if self.pf_parent else [
            vf for vf in PciDevice(sysfs, gpu.address).virtfns() if vf in on_bus]
        self.types = dict((p, vt.read_mdev_types(sysfs, p)) for p in self.parents)
        self.catalog = {}
        for parent in self.parents:
            for mdev_type in self.types[parent]:
                self.catalog.setdefault(mdev_type.dirname, mdev_type)
        self.mdevs = []
        for uuid, parent in sorted(mdev_parent_map(sysfs).items()):
            if parent in self.types:
                dirname = sysfs.link_name("%s/%s/mdev_type" % (vt.MDEV_DEVICES, uuid))
                self.mdevs.append(Mdev(uuid, parent, self._type(parent, dirname), held.get(uuid, [])))
        order = dict((p, n) for n, p in enumerate(self.parents))
        self.mdevs.sort(key=lambda m: (order[m.parent], m.uuid))

    def _type(self, parent, dirname):
        for mdev_type in self.types[parent]:
            if mdev_type.dirname == dirname:
                return mdev_type
        return vt.MdevType(parent, dirname, dirname or "unknown", 0, "")

    def find(self, profile):
        return vt.find_type(profile, self.catalog.values())

    @property
    def model(self):
        return gpu_model(self.catalog.values())

    def total_gb(self):
        sizes = [s for s in (type_size_gb(t) for t in self.catalog.values()) if s]
        return max(sizes) if sizes else None

    def max_instances(self, mdev_type):
        value = vt.parse_description(mdev_type.description).get("max_instance", "")
        return int(value) if value.isdigit() else None


def plan(view, entries, mixed_size=False, absent=False):
    """A GpuPlan for one mdev GPU; raises LayoutError before anything is written."""
    gpu = view.gpu
    result = GpuPlan(gpu.address, FRAMEWORK, view.model, "%s:%s" % (gpu.vendor, gpu.device))
    if not view.parents:
        raise LayoutError("GPU %s: no mdev parent (no VF in class/mdev_bus); enable SR-IOV VFs first" % gpu.address)
    wanted = {}
    if not absent:
        entry, wanted = choose_profiles(gpu.address, view.model, entries, view.find)
        result.origin = entry.origin
    remaining = dict((t.dirname, n) for t, n in wanted.items())
    kept = []
    for mdev in sorted(view.mdevs, key=lambda m: not m.held):
        if remaining.get(mdev.type.dirname, 0) > 0:
            remaining[mdev.type.dirname] -= 1
            kept.append(mdev)
        elif mdev.held and absent:
            kept.append(mdev)
            result.warnings.append("mdev %s on %s is held by a VM (%s); it was left in place"
                                   % (mdev.uuid, mdev.parent, describe(mdev.held)))
        elif mdev.held:
            raise LayoutError("mdev %s (%s) on %s of GPU %s is held by a VM (%s); the layout needs it removed"
                              % (mdev.uuid, mdev.type.short, mdev.parent, gpu.address,
                                 describe(mdev.held)), held=[mdev.uuid])
    creates = _place(view, wanted, remaining, kept)
    after = [m.type for m in kept] + [t for dummy, t, dummy2 in creates]
    if not absent:
        check_sizes(gpu.address, after, mixed_size, view.total_gb(), None if view.pf_parent else len(view.parents))
        for vgpu_type, count in wanted.items():
            limit = view.max_instances(vgpu_type)
            if limit is not None and count > limit:
                raise LayoutError("GPU %s: %d x %s requested, the type allows %d per GPU"
                                  % (gpu.address, count, vgpu_type.short, limit))
    result.mixed_size = bool(mixed_size)
    kept_ids = set(m.uuid for m in kept)
    for mdev in view.mdevs:
        keep = mdev.uuid in kept_ids
        result.vgpus.append(VgpuChange(mdev.parent, mdev.type, mdev.type if keep else None, mdev.uuid, mdev.held))
        if not keep:
            result.steps.append(("remove", mdev.uuid, mdev.parent))
    for parent, mdev_type, uuid in creates:
        result.vgpus.append(VgpuChange(parent, None, mdev_type, uuid))
        result.steps.append(("create", uuid, parent, mdev_type.dirname))
    return result


def _place(view, wanted, remaining, kept):
    """[(parent, type, uuid)] for the missing mdevs: VF parents take one each, in VF order."""
    busy = set(m.parent for m in kept)
    taken = set(m.uuid for m in view.mdevs)
    creates = []
    for vgpu_type in sorted(wanted, key=lambda t: -(type_size_gb(t) or 0)):
        for dummy in range(remaining.get(vgpu_type.dirname, 0)):
            if view.pf_parent:
                parent = view.parents[0]
            else:
                free = [p for p in view.parents if p not in busy]
                if not free:
                    raise LayoutError("GPU %s: no free VF left for %s (%d VF parents, %d in use)"
                                      % (view.gpu.address, vgpu_type.short, len(view.parents), len(busy)))
                parent = free[0]
                busy.add(parent)
            index = 0
            while mdev_uuid(parent, vgpu_type.short, index) in taken:
                index += 1
            uuid = mdev_uuid(parent, vgpu_type.short, index)
            taken.add(uuid)
            creates.append((parent, _same_type(view, parent, vgpu_type), uuid))
    return creates


def _same_type(view, parent, vgpu_type):
    """The parent's own entry for a type (dirnames are the same across a GPU's parents)."""
    for mdev_type in view.types[parent]:
        if mdev_type.dirname == vgpu_type.dirname:
            return mdev_type
    raise LayoutError("GPU %s: mdev parent %s does not offer %s" % (view.gpu.address, parent, vgpu_type.short))


def rebuild(view, gpu_plan):
    """Remove and re-create (same UUID) every kept mdev: the driver switches mixed-size mode only on an
    empty GPU; a kept mdev a VM holds makes this fail before any write."""
    del view  # the plan's VgpuChanges carry the mdevs; the signature matches the VFIO backend
    kept = [v for v in gpu_plan.vgpus if v.before is not None and v.after is not None]
    for change in kept:
        if change.held:
            raise LayoutError("GPU %s needs mixed-size mode, which the driver only switches on a GPU without "
                              "vGPUs, but mdev %s on %s is held by a VM" % (gpu_plan.address, change.uuid, change.address))
    removes = [("remove", v.uuid, v.address) for v in kept]
    creates = [("create", v.uuid, v.address, v.after.dirname) for v in kept]
    gpu_plan.steps = ([s for s in gpu_plan.steps if s[0] == "remove"] + removes + creates
                      + [s for s in gpu_plan.steps if s[0] == "create"])


def execute(sysfs, view, gpu_plan, steps=None, writer=None):
    """Run the plan: removals first, then creations with available_instances re-read before each.
    `writer`: the node's vGPU writer (node/engine/vgpu_writer.py; vgpu_apply's raises when a VM opened the mdev since the
    plan); None: one that asks no holder (tests)."""
    del view  # the mdev plan carries everything it needs; the signature matches the VFIO backend
    writer = writer if writer is not None else VgpuWriter(sysfs, None)
    for step in gpu_plan.steps if steps is None else steps:
        if step[0] == "remove":
            dummy, uuid, parent = step
            writer.remove_mdev(uuid, parent)
            continue
        dummy, uuid, parent, dirname = step
        type_dir = "%s/%s/mdev_supported_types/%s" % (vt.MDEV_BUS, parent, dirname)
        available = sysfs.read_int(type_dir + "/available_instances", 0)
        if available < 1:
            name = sysfs.read_optional(type_dir + "/name", dirname)
            raise LayoutError("mdev parent %s of GPU %s: no instance of %s available now"
                              % (parent, gpu_plan.address, vt.short_name(name)))
        writer.create_mdev(parent, dirname, uuid)


def current_profiles(view):
    counts = {}
    for mdev in view.mdevs:
        counts[mdev.type.short] = counts.get(mdev.type.short, 0) + 1
    return counts
