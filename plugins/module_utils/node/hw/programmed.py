# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which vGPUs a node has programmed: the one answer the kubelet plugins publish from (standard library only).

    programmed(gpus, vfs, mdevs) -> [Programmed]
    of_facts(facts)   -> (gpus, vfs, mdevs) of a full read of the node (node/engine/facts.gather)
    of_apply(result)  -> (gpus, vfs, mdevs) of an apply result (vgpu_apply.apply: what it wrote and verified,
                         so publishing after a reconcile costs no second read of the node)

A vGPU is a VF with a type whose name is known, or an mdev whose type name is known, on a GPU of `gpus`; a device
nobody can select by profile is not offered. The DRA driver (kubelet/dra/devices.py: inventory, from_apply) and the
device plugin (kubelet/device_plugin.py: devices_from_apply, and devices_programmed through the DRA inventory) build
their devices from this list, so both say the same vGPUs whichever of the two reads they start from.
"""

from __future__ import annotations

import re
from collections import namedtuple

from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.vgpu_types import short_name

_MDEV_TYPE = re.compile(r"^nvidia-(\d+)$")


class Programmed(namedtuple("Programmed", "gpu address uuid type_id type_name profile mdev_type")):
    """One programmed vGPU. gpu: its GPU's dict (`address`, `model`, `pci_id`, as facts or the apply result give
    it); address: the VF (vendor VFIO) or the mdev's parent function; uuid: the mdev's UUID (None for a VF);
    type_id: the driver's numeric type ID (None when unknown); type_name: `NVIDIA L40S-24Q`; profile: `L40S-24Q`;
    mdev_type: the mdev type's directory name (`nvidia-NNN`; None for a VF)."""

    __slots__ = ()


def programmed(gpus, vfs, mdevs):
    """[Programmed]: the VFs in `vfs` order, then the mdevs in `mdevs` order.

    - gpus: [{"address", ...}];
    - vfs: [{"address", "pf", "vgpu_type_id", "vgpu_type", optional "profile"}];
    - mdevs: [{"uuid", "parent", "type", "type_name", optional "pf" (else the parent's PF from `vfs`, or the
      parent itself), optional "profile"}]. A missing profile is the type name's short form."""
    by_address = dict((gpu["address"], gpu) for gpu in gpus or ())
    found = []
    for vf in vfs or ():
        gpu = by_address.get(vf["pf"])
        if gpu is None or not vf.get("vgpu_type_id") or not vf.get("vgpu_type"):
            continue
        found.append(Programmed(gpu, vf["address"], None, vf["vgpu_type_id"], vf["vgpu_type"],
                                vf.get("profile") or short_name(vf["vgpu_type"]), None))
    pf_of = dict((vf["address"], vf["pf"]) for vf in vfs or ())
    for mdev in mdevs or ():
        gpu = by_address.get(mdev.get("pf") or pf_of.get(mdev["parent"], mdev["parent"]))
        if gpu is None or not mdev.get("type_name"):
            continue
        number = _MDEV_TYPE.match(str(mdev.get("type") or ""))
        found.append(Programmed(gpu, mdev["parent"], mdev["uuid"], int(number.group(1)) if number else None,
                                mdev["type_name"], mdev.get("profile") or short_name(mdev["type_name"]),
                                mdev.get("type")))
    return found


def of_facts(facts):
    """programmed()'s arguments from node facts (node/engine/facts.gather)."""
    return facts.get("gpus") or (), facts.get("vfs") or (), facts.get("mdevs") or ()


def of_apply(result):
    """programmed()'s arguments from an apply result: `gpus[].vgpus[]` with each one's profile (`after`), type ID
    and, for an mdev, its UUID on the parent `address`; the type names from `resources[]` (by profile and
    framework). A vGPU without a profile or a known type name is none."""
    names = dict(((r["profile"], r["framework"]), r["type_name"]) for r in result.get("resources") or ())
    gpus, vfs, mdevs = [], [], []
    for gpu in result.get("gpus") or ():
        gpus.append(gpu)
        for vgpu in gpu.get("vgpus") or ():
            profile = vgpu.get("after")
            type_name = names.get((profile, gpu.get("framework")))
            if not profile or not type_name:
                continue
            if vgpu.get("uuid"):
                mdevs.append({"uuid": vgpu["uuid"], "parent": vgpu["address"], "pf": gpu["address"],
                              "type": vgpu.get("type_id"), "type_name": type_name, "profile": profile})
            else:
                vfs.append({"address": vgpu["address"], "pf": gpu["address"], "vgpu_type_id": vgpu.get("type_id"),
                            "vgpu_type": type_name, "profile": profile})
    return gpus, vfs, mdevs
