# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read-only discovery of a node's GPUs, their VFs and mdevs, as plain data (the vgpu_facts module).

Works on a live /sys, on gpusim, and on a plain copy of a host's sysfs (relative links, attributes
missing or unreadable): every attribute is read on its own and what cannot be read is reported as
null, never as an error.

    gather(sysfs, held, type_names=None, mig_info=None, whole=None) -> {"gpus": [...], "vfs": [...], "mdevs": [...]}

- gpus: every PCI base class 0x03 function that is not a VF. `framework` is `vendor-vfio` when its
  VFs have `nvidia/` (vGPU 17+ on Ada/Hopper/Blackwell), `mdev` when it or its VFs are mdev parents
  (`class/mdev_bus` entry or `mdev_supported_types`), else `none` (also: SR-IOV not enabled yet).
- vfs: every VF of those GPUs with its vGPU state; `vgpu_type` names the current type when one of
  the GPU's creatable lists still shows it (the driver keeps only the ID of a set type), else when
  `type_names(pf)` (e.g. vgpu_apply.TypeNames: the node's cache, nvidia-smi) knows it.
- MIG (Hopper): with `mig_info(pf)` (mig.facts: nvidia-smi) every NVIDIA GPU gets `mig_mode`
  (enabled/disabled, null without MIG or nvidia-smi) and `gpu_instances`; a VF with a vGPU its
  `gpu_instance_id` (the driver's output; 0 for time-sliced types).
- every GPU: `reserved`, why the engine leaves it alone (passed through: bound to vfio-pci or another
  driver than nvidia, node/holders/pf_driver.py), null when it is the engine's or a DRA claim holds it whole
  (`held_whole`: {by, step}, from the checkpoint: claim_holders.held_whole); `held`/`holders` of the PF
  itself (a passthrough VM holding its VFIO group).
- mdevs: every `bus/mdev/devices/<uuid>` with parent, type and whether a VM holds it.
`held` is the mapping of inuse.held_devices().
"""

from __future__ import annotations

from ansible_collections.accelops.vgpu.plugins.module_utils import gpu_models

from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw import pci, vgpu_types
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import inuse, pf_driver
from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout import vgpu_layout
from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError


def _attempt(read, default=None):
    """One attribute: anything the sysfs copy cannot answer becomes `default`."""
    try:
        return read()
    except (EngineError, OSError, ValueError):
        return default


def _mdev_types(sysfs, parent):
    return [{"type": t.dirname, "name": t.name, "available_instances": t.available_instances}
            for t in _attempt(lambda: vgpu_types.read_mdev_types(sysfs, parent), [])]


def _is_mdev_parent(sysfs, address, bus_parents):
    return address in bus_parents or sysfs.isdir("%s/%s/mdev_supported_types" % (pci.PCI_DEVICES, address))


def _vf_facts(sysfs, address, pf, held, parents, bus_parents):
    dev = pci.PciDevice(sysfs, address)
    vendor_vfio = _attempt(lambda: vgpu_types.has_vfio_types(sysfs, address), False)
    pids = inuse.holders(held, address, parents)
    return {
        "address": address,
        "pf": pf,
        "iommu_group": _attempt(lambda: dev.iommu_group),
        "driver": _attempt(lambda: dev.driver),
        "vgpu_type_id": _attempt(lambda: vgpu_types.read_current(sysfs, address)) if vendor_vfio else None,
        "gpu_instance_id": _attempt(lambda: sysfs.read_int(vgpu_types.vfio_dir(address) + "/gpu_instance_id"))
        if vendor_vfio else None,
        "vgpu_type": None,
        "creatable_types": [{"id": t.type_id, "name": t.name}
                            for t in _attempt(lambda: vgpu_types.read_creatable(sysfs, address), [])]
        if vendor_vfio else [],
        "mdev_types": _mdev_types(sysfs, address) if _is_mdev_parent(sysfs, address, bus_parents) else [],
        "mdevs": sorted(uuid for uuid, parent in parents.items() if parent == address),
        "held": bool(pids),
        "holders": pids,
        "vendor_vfio": vendor_vfio,
    }


def _name_types(vfs, pf, type_names):
    """Fill vgpu_type from the names any sibling's creatable list still shows, else from type_names."""
    names = {}
    for vf in vfs:
        names.update((t["id"], t["name"]) for t in vf["creatable_types"])
    if type_names and any(vf["vgpu_type_id"] and vf["vgpu_type_id"] not in names for vf in vfs):
        # vgpu_apply.TypeNames answers (types, complete)
        for known in _attempt(lambda: type_names(pf), ([], False))[0]:
            names.setdefault(known.type_id, known.name)
    for vf in vfs:
        vf["vgpu_type"] = names.get(vf["vgpu_type_id"]) if vf["vgpu_type_id"] else None


def _framework(vfs, pf_is_mdev_parent):
    vendor_vfio = [vf.pop("vendor_vfio") for vf in vfs]   # internal marker, not a fact
    if any(vendor_vfio):
        return "vendor-vfio"
    if pf_is_mdev_parent or any(vf["mdev_types"] for vf in vfs):
        return "mdev"
    return "none"


def _mig_facts(mig_info, address, vendor):
    unknown = {"mig_mode": None, "gpu_instances": []}
    if mig_info is None or vendor != pci.NVIDIA_VENDOR:
        return unknown
    return _attempt(lambda: mig_info(address), unknown)


def _gpu_facts(sysfs, dev, held, parents, bus_parents, type_names, mig_info=None, whole=None):
    vendor, device = _attempt(lambda: dev.vendor), _attempt(lambda: dev.device)
    vf_addresses = _attempt(dev.virtfns, [])
    vfs = [_vf_facts(sysfs, vf, dev.address, held, parents, bus_parents) for vf in vf_addresses]
    _name_types(vfs, dev.address, type_names)
    pf_parent = _is_mdev_parent(sysfs, dev.address, bus_parents)
    gpu = {
        "address": dev.address,
        "vendor": vendor,
        "device": device,
        "pci_id": "%s:%s" % (vendor, device) if vendor and device else None,
        "model": gpu_models.model_name(vendor, device),
        "framework": _framework(vfs, pf_parent),
        "driver": _attempt(lambda: dev.driver),
        "iommu_group": _attempt(lambda: dev.iommu_group),
        "sriov_totalvfs": _attempt(lambda: dev.sriov_totalvfs, 0),
        "sriov_numvfs": _attempt(lambda: dev.sriov_numvfs, 0),
        "vfs": vf_addresses,
        "mdev_types": _mdev_types(sysfs, dev.address) if pf_parent else [],
        # passed through (bound to vfio-pci...): the engine leaves it alone; why (node/holders/pf_driver.py), else null
        # given whole to a DRA claim (claim_holders.held_whole): held by it, not reserved, whatever its driver
        "reserved": None if dev.address in whole else _attempt(lambda: pf_driver.reserved(sysfs, dev)),
        "held_whole": ({"by": whole[dev.address][0], "step": whole[dev.address][1].get("step")}
                       if dev.address in whole else None),
        "held": bool(inuse.holders(held, dev.address, parents)),
        "holders": inuse.holders(held, dev.address, parents),
    }
    gpu.update(_mig_facts(mig_info, dev.address, vendor))
    return gpu, vfs


def _mdev_facts(sysfs, uuid, parent, held):
    base = "%s/%s" % (inuse.MDEV_DEVICES, uuid)
    return {
        "uuid": uuid,
        "parent": parent,
        "type": _attempt(lambda: sysfs.link_name(base + "/mdev_type")),
        "type_name": _attempt(lambda: sysfs.read_optional(base + "/mdev_type/name")),
        "iommu_group": _attempt(lambda: sysfs.link_name(base + "/iommu_group")),
        "held": bool(held.get(uuid)),
        "holders": list(held.get(uuid, [])),
    }


def _is_gpu_pf(dev):
    return _attempt(lambda: dev.is_display and not dev.is_vf, False)


def gather(sysfs, held, type_names=None, mig_info=None, whole=None):
    """{"gpus", "vfs", "mdevs"} of the node; `held` = inuse.held_devices(...); `whole` = claim_holders.held_whole
    (the GPUs DRA claims hold whole)."""
    whole = whole or {}
    parents = _attempt(lambda: inuse.mdev_parents(sysfs), {})
    bus_parents = set(_attempt(lambda: vgpu_types.mdev_parents(sysfs), []))
    gpus, vfs = [], []
    for address in _attempt(lambda: pci.list_addresses(sysfs), []):
        dev = pci.PciDevice(sysfs, address)
        if _is_gpu_pf(dev):
            gpu, gpu_vfs = _gpu_facts(sysfs, dev, held, parents, bus_parents, type_names, mig_info, whole)
            gpus.append(gpu)
            vfs.extend(gpu_vfs)
    mdevs = [_mdev_facts(sysfs, uuid, parent, held) for uuid, parent in sorted(parents.items())]
    return {"gpus": gpus, "vfs": vfs, "mdevs": mdevs}


def vgpu_census(sysfs, held, type_names=None, group_of=None):
    """{"vfs", "mdevs"}: gather()'s entries of every vGPU on the node's NVIDIA GPUs, only the fields a count
    needs (`vgpu_type_id`, `vgpu_type`, `held`, `iommu_group`), read with one read per VF: the agent counts
    them after every reconcile (a full gather reads ~10 attributes per VF, seconds on a 256-VF node).
    Names come from `type_names(pf)` (vgpu_apply.TypeNames: the node cache the apply just refreshed);
    `group_of(address)` answers a VF's IOMMU group (inuse.Holders.facts: read once per apply), else its link."""
    parents = _attempt(lambda: inuse.mdev_parents(sysfs), {})
    group_of = group_of or (lambda address: pci.PciDevice(sysfs, address).iommu_group)
    vfs_of = {}
    vfs = []
    for gpu in _attempt(lambda: vgpu_layout.nvidia_gpus(sysfs, vfs_of), []):
        typed = []
        for address in vfs_of.get(gpu.address) or ():
            type_id = _attempt(lambda: vgpu_types.read_current(sysfs, address))
            if type_id:     # 0: no vGPU; None: no vendor-VFIO directory (an mdev GPU's VF)
                typed.append({"address": address, "pf": gpu.address, "vgpu_type_id": type_id, "vgpu_type": None,
                              "creatable_types": [], "held": bool(inuse.holders(held, address, parents)),
                              "iommu_group": _attempt(lambda: group_of(address))})
        _name_types(typed, gpu.address, type_names)
        for address in vfs_of.get(gpu.address) or ():
            if all(vf["vgpu_type"] for vf in typed):
                break      # a type the names do not know: the creatable lists that still show it, as gather() does
            names = dict((t.type_id, t.name) for t in _attempt(lambda: vgpu_types.read_creatable(sysfs, address), []))
            for vf in typed:
                vf["vgpu_type"] = vf["vgpu_type"] or names.get(vf["vgpu_type_id"])
        vfs.extend(typed)
    mdevs = [_mdev_facts(sysfs, uuid, parent, held) for uuid, parent in sorted(parents.items())]
    return {"vfs": vfs, "mdevs": mdevs}
