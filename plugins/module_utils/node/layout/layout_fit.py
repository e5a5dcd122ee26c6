# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Does a layout fit a GPU whose SR-IOV VFs are not enabled yet? Decided before the first write.

Enabling VFs is a write (sriov-manage rebinds the PF), so the node CLI's `apply` and the agent
validate such GPUs first, with what a node offers without VFs; check mode gives the same verdict:
- the types the GPU supports: the driver's list (`nvidia-smi vgpu -s -v -i <PF>`, or the node's
  type cache when it holds a complete list), else the collection's catalog
  (gpu_models.VGPU_OFFERS); when neither answers the layout fails (closed), naming the GPU;
- the checks the backends run on a GPU with VFs (vgpu_layout.choose_profiles, check_sizes): every
  profile is a type of this GPU (VDM's entry choice), one framebuffer size unless mixed_size (and
  then the GPU must support mixed-size mode: `nvidia-smi -q`), the framebuffer (catalog, else the
  largest supported type) and one vGPU per VF (`sriov_totalvfs`, readable without VFs).
After the VFs are enabled the GPU is planned again against the driver's creatable lists.

One step, separate from the backends, so more kinds of types (MIG-backed) can add their rules here.
"""

from __future__ import annotations

from collections import OrderedDict

from ansible_collections.accelops.vgpu.plugins.module_utils.gpu_models import vgpu_offer
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw import vgpu_types as vt
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.vgpu_types import mig_backed
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.pci import PciDevice
from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout.vgpu_layout import (
    LayoutError, check_sizes, choose_profiles, gpu_model, type_size_gb)

DRIVER, CATALOG = "the driver (nvidia-smi vgpu -s)", "the collection's GPU catalog"


class Offer:
    """What a GPU without VFs offers: its types, framebuffer (GB or None), vGPU slots, and the source."""

    def __init__(self, types, framebuffer_gb, slots, source):
        self.types, self.framebuffer_gb, self.slots, self.source = list(types), framebuffer_gb, slots, source

    def find(self, profile):
        return vt.find_type(profile, self.types)


def catalog_types(prefix, offers):
    """The catalog's profiles as driver-style types (no IDs: they are only validated, never written)."""
    return [vt.VgpuType(0, "NVIDIA %s-%d%s" % (prefix, size, series))
            for series, sizes in sorted(offers.items()) for size in sizes]


def offer_of(sysfs, gpu, supported):
    """The GPU's Offer; `supported(pf) -> (types, complete)` is the driver's answer (vgpu_apply.TypeNames)."""
    slots = PciDevice(sysfs, gpu.address).sriov_totalvfs or None
    catalog = vgpu_offer(gpu.vendor, gpu.device)
    types, complete = supported(gpu.address) if supported is not None else ([], False)
    if complete and types:
        sizes = [type_size_gb(t) for t in types if type_size_gb(t)]
        return Offer(types, catalog[1] if catalog else (max(sizes) if sizes else None), slots, DRIVER)
    if catalog:
        prefix, framebuffer_gb, offers = catalog
        return Offer(catalog_types(prefix, offers), framebuffer_gb, slots, CATALOG)
    raise LayoutError("GPU %s (PCI ID %s:%s): cannot check the layout before its VFs are enabled: nvidia-smi vgpu -s "
                      "lists no types and the GPU is not in the collection's catalog; enable its VFs first "
                      "(accelops.vgpu.sriov_vfs) or make nvidia-smi available" % (gpu.address, gpu.vendor, gpu.device))


def check_gpu_without_vfs(sysfs, gpu, entries, mixed_size, supported, mixed_mode_supported):
    """Validate the layout for a GPU whose VFs are not enabled: (entry, {profile: count}, Offer).

    Raises LayoutError naming the GPU (and profile) exactly when planning it with VFs would;
    `mixed_mode_supported(pf) -> bool` is asked only when the GPU gets several framebuffer sizes.
    """
    offer = offer_of(sysfs, gpu, supported)
    model = gpu_model(offer.types)
    entry, wanted = choose_profiles(gpu.address, model, entries, offer.find)
    after = [vgpu_type for vgpu_type, count in wanted.items() for dummy in range(count)]
    # MIG-backed types are bound by GPU instances, not framebuffer sizes (node/engine/mig.py checks those)
    on_mig = any(mig_backed(t.name) for t in after)
    check_sizes(gpu.address, after, mixed_size or on_mig, None if on_mig else offer.framebuffer_gb, offer.slots)
    sizes = set(type_size_gb(t) for t in after) - {None}
    if len(sizes) > 1 and not on_mig and not mixed_mode_supported(gpu.address):
        raise LayoutError("GPU %s (%s) does not support mixed-size mode (nvidia-smi -q: Heterogeneous Time-Slice "
                          "Sizes: Not Supported); give it one framebuffer size" % (gpu.address, model))
    profiles = OrderedDict()
    for vgpu_type, count in wanted.items():
        profiles[vgpu_type.short] = profiles.get(vgpu_type.short, 0) + count
    return entry, profiles, offer
