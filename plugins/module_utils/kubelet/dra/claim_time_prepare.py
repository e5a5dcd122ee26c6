# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""NodePrepareResources for a claim-time device (kubelet/dra/claim_time.py): the VF is chosen and typed now.

The DRA driver (driver.py) calls this under the node lock (the one every layout apply takes):
1. `choose(ref, name, earlier, taken)`: a VF of the allocated GPU that has no type, that nothing the engine
   knows holds (inuse.held_devices with every holder source: VFIO group users, prepared claims, kubelet
   allocations) and that no other device of this call took, and whose creatable list has the profile's type.
   A claim prepared before (a retry after a crash: its record says which VF) gets the same VF back when that
   still has the type or none (adopted);
2. the driver records the claim PrepareStarted with that VF (durably) before any write;
3. `write(device)`: the type written to `nvidia/current_vgpu_type` and read back;
4. the driver writes the CDI spec and the KEP-5304 metadata (`resource.kubernetes.io/pciBusID`: the VF).
`release(device)` at unprepare writes 0 when nothing but the claim holds the VF; a VF a process still holds
keeps its type (the reconcile clears a claim-time GPU's unheld, unrecorded types: claim_time_layout.plan).
"""

from __future__ import annotations

from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import claim_time
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.claims import ClaimError
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.devices import VgpuDevice
from ansible_collections.accelops.vgpu.plugins.module_utils.node import claim_holders, inuse, vgpu_types
from ansible_collections.accelops.vgpu.plugins.module_utils.node.pci import PciDevice
from ansible_collections.accelops.vgpu.plugins.module_utils.node.sysfs import SysfsError


class ClaimTimePreparer:
    """`held_of(devices)` -> {device: [holder]}: the engine's in-use answer (vgpu_apply.Node.held, every holder
    source; `devices`, the GPU and the VF asked about, are its probe scope); `recheck(devices)`: the engine's
    O(1) re-check right before a write (inuse.Holders.recheck), None to skip it."""

    def __init__(self, sysfs, held_of, recheck=None):
        self.sysfs, self.held_of, self.recheck = sysfs, held_of, recheck
        self.devices = {}       # published device name -> claim_time.ProfileDevice
        self.vf_lists = {}      # PF address -> its VF addresses (_vfs)

    def update(self, items):
        """The claim-time devices as last published (claim_time.offers)."""
        self.devices = {item.name: item for item in items if isinstance(item, claim_time.ProfileDevice)}

    def owns(self, name):
        return name in self.devices

    def choose(self, ref, name, earlier=None, taken=()):
        """The VgpuDevice (named as allocated, its address the chosen VF) for device `name` of claim `ref`.

        `earlier`: this claim's checkpoint record of that device from an earlier, unfinished prepare;
        `taken`: VFs other devices of this call or other prepared claims have."""
        offer = self.devices[name]
        vfs = self._vfs(offer.gpu)
        mine = claim_holders.HOLDER % (ref.namespace, ref.name)
        if earlier and earlier.get("key") in vfs:
            vf = earlier["key"]
            current = vgpu_types.read_current(self.sysfs, vf) or 0
            others = [h for h in inuse.holders(self.held_of([offer.gpu, vf]), vf) if h != mine]
            if current in (0, offer.type_id) and not others:
                return self._device(name, offer, vf)
        for vf in vfs:
            # cheapest first: a typed VF is out at one read; the holder scan runs for a candidate only
            if vf in taken or vgpu_types.read_current(self.sysfs, vf):
                continue
            if inuse.holders(self.held_of([offer.gpu, vf]), vf):
                continue
            if offer.type_id in [t.type_id for t in vgpu_types.read_creatable(self.sysfs, vf)]:
                return self._device(name, offer, vf)
        raise ClaimError("%s: device %s: no free VF of GPU %s can take %s now (VFs without a type and without "
                         "holder offer no such type)" % (ref, name, offer.gpu, offer.profile))

    def _vfs(self, gpu):
        """The GPU's VFs, read once (33 sysfs reads) and again when one of them is gone (VFs re-enabled)."""
        known = self.vf_lists.get(gpu)
        if not known or not self.sysfs.exists(vgpu_types.vfio_dir(known[-1]) + "/current_vgpu_type"):
            known = self.vf_lists[gpu] = PciDevice(self.sysfs, gpu).virtfns()
        return known

    @staticmethod
    def _device(name, offer, vf):
        return VgpuDevice(name=name, framework=claim_time.FRAMEWORK, address=vf, parent_gpu=offer.gpu,
                          profile=offer.profile, type_name=offer.type_name, type_id=offer.type_id,
                          pcie_root=offer.pcie_root, numa_node=offer.numa_node, product=offer.product,
                          framebuffer_mib=offer.size_mib)

    def write(self, ref, device):
        """Type the chosen VF (nothing to do when it has the type already) and read it back."""
        path = vgpu_types.vfio_dir(device.address) + "/current_vgpu_type"
        if (vgpu_types.read_current(self.sysfs, device.address) or 0) == device.type_id:
            return
        if self.recheck is not None:   # a VM may have opened the VF since it was chosen: asked right before
            mine = claim_holders.HOLDER % (ref.namespace, ref.name)
            found = [h for h in self.recheck([device.address]).get(device.address, ()) if h != mine]
            if found:
                raise ClaimError("%s: VF %s of GPU %s is held by %s since it was chosen; nothing written" % (
                    ref, device.address, device.parent_gpu, inuse.describe(found)))
        try:
            self.sysfs.write(path, device.type_id)
        except SysfsError as exc:
            raise ClaimError("%s: VF %s of GPU %s: the driver refused %s (type %d): %s" % (
                ref, device.address, device.parent_gpu, device.profile, device.type_id, exc)) from None
        back = vgpu_types.read_current(self.sysfs, device.address)
        if back != device.type_id:
            raise ClaimError("%s: VF %s of GPU %s: wrote type %d (%s), it reads back %s" % (
                ref, device.address, device.parent_gpu, device.type_id, device.profile, back))

    def release(self, ref, record, gpu=None):
        """Clear the VF of a claim-time record (unprepare, or a prepare that failed) when nothing but the claim
        holds it; True when cleared or already clear."""
        vf = record.get("key")
        if not vf:
            return True
        try:
            current = vgpu_types.read_current(self.sysfs, vf) or 0
        except (SysfsError, ValueError):
            return False
        if not current:
            return True
        if current != record.get("typeID"):
            return False    # someone else's type now: never ours to clear
        pf = gpu or self.sysfs.link_name("%s/%s/physfn" % (vgpu_types.PCI_DEVICES, vf))
        mine = claim_holders.HOLDER % (ref.namespace, ref.name)
        if [h for h in inuse.holders(self.held_of([pf, vf] if pf else [vf]), vf) if h != mine]:
            return False
        self.sysfs.write(vgpu_types.vfio_dir(vf) + "/current_vgpu_type", 0)
        return True
