# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""MIG-backed vGPUs placed at claim time (issue 42.2): what a claim-time GPU in MIG mode offers, and the GPU
instance (GI) steps of NodePrepareResources / NodeUnprepareResources.

A claim-time entry whose allow-list names MIG-backed profiles (`H100-1-10C`, `H100-3-40C`) declares a GPU whose
vGPUs sit on GIs placed when a claim is prepared (docs/design.md "MIG-backed vGPU at claim time"). MIG mode stays
what the operator set (it needs the GPU idle; nothing here toggles it): a GPU not in MIG mode offers nothing and a
warning says so. In MIG mode the GPU offers, per allowed type and per placement `nvidia-smi mig -lgipp` lists for
its GI profile, one placement; what each placement takes (memory slices `start..start+size-1`, compute slices,
one instance of a profile the driver limits below its placement count, `-lgip` Total: the `+me` profile) becomes
DRA counters (kubelet/dra/claim_time_mig.py). GIs that no claim of ours created (an operator's, the layout's) are
never touched: placements overlapping them are not offered and their compute slices and instances are taken off
the totals.

Which GIs are ours: the DRA checkpoint's records (`mig` of a claim-time device record: GPU, GI profile, start,
`before` = the GI IDs that existed right before our create, `gi` = the GI the create made). A GI is ours when a
record names its ID at that profile and start, or, for a create that a crash cut short (`before` recorded, no
`gi`), when it sits at that profile and start and its ID is not in `before`.
"""

from __future__ import annotations

import re

from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import mig
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw import vgpu_types
from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout.vgpu_layout import LayoutError


_CREATED = re.compile(r"created GPU instance ID\s+(\d+)")


def wanted(allow):
    """Whether a claim-time allow-list names MIG-backed profiles (then the GPU is a MIG claim-time GPU)."""
    return bool(allow) and any(mig.mig_backed(profile) for profile in allow)


def check_allow(allow, origin):
    """A claim-time entry offers one kind: MIG-backed or time-sliced profiles, not both (a GPU carries one kind)."""
    kinds = {mig.mig_backed(profile) for profile in allow or ()}
    if len(kinds) == 2:
        raise LayoutError("%s: profiles mix MIG-backed and time-sliced profiles; a GPU carries one kind of vGPU"
                          % origin)


def recorded(claims):
    """{PF: [mig record]} of the DRA checkpoint's claims (claim_holders.read_claims): the GIs our claims made or
    were making."""
    found = {}
    for entry in (claims or {}).values():
        for device in entry.get("devices") or ():
            record = device.get("mig")
            if isinstance(record, dict) and record.get("gpu"):
                found.setdefault(record["gpu"], []).append(record)
    return found


def is_ours(gi, record):
    """Whether GpuInstance `gi` is the one `record` (a claim's mig record) created."""
    if gi.profile_id != record.get("giProfile") or gi.start != record.get("start"):
        return False
    if record.get("gi") is not None:
        return gi.gi_id == record["gi"]
    before = record.get("before")
    return isinstance(before, list) and gi.gi_id not in before


def foreign(gis, records):
    """The GIs of `gis` that no record of ours explains."""
    return [gi for gi in gis if not any(is_ours(gi, record) for record in records)]


def offers(smi, view, allow, records):
    """(mig facts, [offer]) of a claim-time GPU in MIG mode, or (None, []) with a warning string when it is not.

    mig facts: {memory_slices, compute_slices, limits {GI profile ID: instances}} after what foreign GIs take;
    offer: {profile, type_name, type_id, size_mib, gi_profile, compute, size, starts [free placements],
    max_instances (of this type alone: its free placements, at most what the driver allows)}."""
    address = view.gpu.address
    mode = smi.mode(address)
    if not mode:
        return None, [], ("GPU %s: claim-time MIG-backed profiles need MIG mode, which is %s; it offers nothing "
                          "(MIG mode is set beforehand, with the GPU idle: nvidia-smi -i %s -mig 1)"
                          % (address, "not supported" if mode is None else "off", address))
    types = smi.supported(address)
    geometry = smi.geometry(address)
    gis = smi.instances(address)
    others = foreign(gis, records)
    blocked = set(s for gi in others for s in range(gi.start, gi.start + gi.size))
    compute = mig.COMPUTE_SLICES - sum(geometry.get(gi.profile_id, (1,))[0] for gi in others)
    limits = {}
    result = []
    for profile in allow:
        found = vgpu_types.find_type(profile, [vgpu_types.VgpuType(t.type_id, t.name) for t in types])
        if found is None:
            raise LayoutError("GPU %s (%s): claim-time profile %s is not a MIG-backed type the driver lists "
                              "(nvidia-smi vgpu -s -v)" % (address, view.model or "unknown model", profile))
        mig_type = next(t for t in types if t.type_id == found.type_id)
        shape = geometry.get(mig_type.gi_profile)
        if shape is None:
            raise LayoutError("GPU %s: GPU instance profile %d of %s has no placement (nvidia-smi mig -lgipp)"
                              % (address, mig_type.gi_profile, found.short))
        cores, size, starts, total = shape
        taken = sum(1 for gi in others if gi.profile_id == mig_type.gi_profile)
        if total < len(starts):   # the driver allows fewer instances than placements (`+me`: one per GPU)
            limits[mig_type.gi_profile] = max(total - taken, 0)
        free = [s for s in starts if s + size <= mig.MEMORY_SLICES and not blocked & set(range(s, s + size))]
        if cores > compute or taken >= total:
            free = []
        gib = vgpu_types.parse_profile(found.name).size_gb
        result.append({"profile": found.short, "type_name": found.name, "type_id": found.type_id,
                       "size_mib": gib * 1024, "gi_profile": mig_type.gi_profile, "compute": cores, "size": size,
                       "starts": free, "max_instances": min(len(free), total - taken)})
    facts = {"memory_slices": mig.MEMORY_SLICES, "compute_slices": max(compute, 0),
             "limits": {str(k): v for k, v in sorted(limits.items())}}
    return facts, result, None


# --- Prepare / Unprepare steps (the DRA driver records each before it is taken) -------------------------------

def find_created(smi, address, record):
    """The GpuInstance `record` describes (ours), or None."""
    return next((gi for gi in smi.instances(address) if is_ours(gi, record)), None)


def create(smi, address, record, compute_instance, note):
    """Create the GI of `record` (giProfile at start) unless it exists already (a retry after a crash: adopted).

    `note()` saves the record durably; it is called with `before` set, BEFORE the create, and with `gi` set after.
    A placement another GI overlaps is refused with one line naming that GI; nothing is created."""
    if record.get("gi") is not None or record.get("before") is not None:
        found = find_created(smi, address, record)
        if found is not None:
            record["gi"] = found.gi_id
            note()
            return found
        record["gi"] = None
    gis = smi.instances(address)
    start, size = record["start"], record["size"]
    overlap = [gi for gi in gis if set(range(gi.start, gi.start + gi.size)) & set(range(start, start + size))]
    if overlap:
        raise LayoutError("GPU %s: placement %d:%d is taken by GPU instance %d (%s), which this claim did not create"
                          % (address, start, size, overlap[0].gi_id, overlap[0].name))
    record["before"] = sorted(gi.gi_id for gi in gis)
    record["ci"] = bool(compute_instance)
    note()
    # NVML nvmlDeviceCreateGpuInstanceWithPlacement; the nvidia-smi form `<ID>:<start>` is UNCONFIRMED
    dummy, out = smi.run(address, ["mig", "-i", address, "-cgi", "%d:%d" % (record["giProfile"], start)]
                         + (["-C"] if compute_instance else []), "mig -cgi %d:%d" % (record["giProfile"], start))
    said = _CREATED.search(out or "")
    if said and int(said.group(1)) not in record["before"]:
        # the ID nvidia-smi names (MIG user guide wording); Prepare checks the VF's gpu_instance_id against it
        record["gi"] = int(said.group(1))
        note()
        return mig.GpuInstance(record["gi"], record["giProfile"], "", start, size)
    found = find_created(smi, address, record)     # another wording: list the GIs again
    if found is None:
        raise LayoutError("GPU %s: after nvidia-smi mig -cgi %d:%d no new GPU instance is at %d:%d"
                          % (address, record["giProfile"], start, start, size))
    record["gi"] = found.gi_id
    note()
    return found


def destroy(smi, address, record):
    """Destroy the GI `record` created (its compute instance first); never another one. None when destroyed or
    gone, else why it stays."""
    if record.get("gi") is None and record.get("before") is None:
        return None          # recorded before the create was started: nothing was created
    found = find_created(smi, address, record)
    if found is None:
        return None
    smi.run(address, ["mig", "-i", address, "-dci", "-gi", str(found.gi_id)], "mig -dci -gi %d" % found.gi_id,
            ok_codes=(0, 1, 6))   # no compute instance: nothing to destroy
    try:
        smi.run(address, ["mig", "-i", address, "-dgi", "-gi", str(found.gi_id)], "mig -dgi -gi %d" % found.gi_id)
    except LayoutError as exc:
        return str(exc)
    return None


def landed_on(sysfs, vf):
    """The GI ID the VF's vGPU occupies (`nvidia/gpu_instance_id`, an output of the driver), or None."""
    return sysfs.read_int(vgpu_types.vfio_dir(vf) + "/gpu_instance_id")
