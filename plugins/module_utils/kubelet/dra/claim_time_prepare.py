# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""NodePrepareResources for a claim-time device (kubelet/dra/claim_time.py): the VF is chosen and typed now.

The DRA driver (driver.py) calls this under the node lock (the one every layout apply takes):
0. `begin()`: the holders (an inuse.Holders asking every holder source, node/holders/kubelet_holders.node_holders)
   forget what they read for the last claim: what cannot change while the node lock is held (the VFs' IOMMU groups,
   their VFIO identities) is read once per claim, who holds a group is asked each time;
1. `choose(ref, name, earlier, taken)`: a VF of the allocated GPU that has no type, that no other prepared claim
   or other device of this call took (`taken`) and whose creatable list has the profile's type: sysfs reads only.
   A claim prepared before (a retry after a crash: its record says which VF) gets the same VF back when that
   still has the type or none (adopted);
2. the driver records the claim PrepareStarted with that VF (durably) before any write;
3. `write(device)`: right before the write, and only there, the VF is asked of the holders (its group's
   EBUSY probe and every holder source: VFIO group users, prepared claims, kubelet allocations); one held by
   anything but this claim raises VfHeld with nothing written (the driver records the next candidate and tries
   that); else the type is written and read back, by the node's vGPU writer (node/engine/vgpu_writer.py, which also
   orders the write against a device plugin Allocate). A VF that has the type already
   (adopted) is not written and not asked;
4. the driver writes the CDI spec and the KEP-5304 metadata (`resource.kubernetes.io/pciBusID`: the VF).
`release(ref, record)` at unprepare writes 0 when nothing but the claim holds the VF; a VF a process still holds
keeps its type (the reconcile clears a claim-time GPU's unheld, unrecorded types: claim_time_layout.plan).
"""

from __future__ import annotations

from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import claim_time, claim_time_mig
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.claims import ClaimError
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.devices import DraDevice
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw import vgpu_types
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import claim_holders
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.pci import PciDevice
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import SysfsError
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine.vgpu_writer import VgpuWriter, attempt


class VfHeld(ClaimError):
    """The chosen VF is held by something else right before the write; nothing was written."""

    def __init__(self, message, vf):
        super().__init__(message)
        self.vf = vf


class ClaimTimePreparer:
    """`holders`: which VFs are held and by whom (an inuse.Holders asking every holder source:
    node/holders/kubelet_holders.node_holders), used under the node lock only; `begin()` once per claim prepared or
    unprepared. `record`: the allocation record's path (pod_allocations.record_path)."""

    def __init__(self, sysfs, holders, record=None, runner=None, compute_instances=True):
        self.sysfs, self.holders, self.record = sysfs, holders, record
        self.begun = False
        self.devices = {}       # published device name -> claim_time.ProfileDevice
        self.vf_lists = {}      # PF address -> its VF addresses (_vfs)
        self.mig = claim_time_mig.MigSteps(sysfs, runner, compute_instances) if runner is not None else None   # MIG-backed placements
        self.progress = {}      # (claim UID, device name) -> its `mig` record (claim_time_mig.py), as the driver saves it

    def begin(self):
        """A new prepare or unprepare: the devices' facts are read again, once."""
        self.holders.forget()
        self.begun = True
        return self.holders

    def _writer(self):
        """This prepare's vGPU writer (node/engine/vgpu_writer.py): its re-check is the holders'."""
        if not self.begun:
            self.begin()
        return VgpuWriter(self.sysfs, self.holders.recheck, self.record)

    def update(self, items):
        """The claim-time devices as last published (claim_time.offers)."""
        self.devices = {item.name: item for item in items if isinstance(item, claim_time.ProfileDevice)}

    def owns(self, name):
        return name in self.devices

    def choose(self, ref, name, earlier=None, taken=()):
        """The DraDevice (named as allocated, its address the chosen VF) for device `name` of claim `ref`.

        `earlier`: this claim's checkpoint record of that device from an earlier, unfinished prepare;
        `taken`: VFs other devices of this call or other prepared claims have, and VFs found held at the write.
        Who holds the VF is asked once, by `write`, right before the type is written."""
        offer = self.devices[name]
        vfs = self._vfs(offer.gpu)
        if isinstance(offer, claim_time_mig.PlacementDevice):
            return self._choose_placement(ref, name, offer, vfs, earlier, taken)
        if earlier and earlier.get("key") in vfs and earlier["key"] not in taken:
            vf = earlier["key"]
            if (vgpu_types.read_current(self.sysfs, vf) or 0) in (0, offer.type_id):
                return self._device(name, offer, vf)
        for vf in vfs:
            # cheapest first: a typed VF is out at one read
            if vf in taken or vgpu_types.read_current(self.sysfs, vf):
                continue
            if offer.type_id in [t.type_id for t in vgpu_types.read_creatable(self.sysfs, vf)]:
                return self._device(name, offer, vf)
        raise ClaimError("%s: device %s: no free VF of GPU %s can take %s now (VFs without a type and without "
                         "holder offer no such type)" % (ref, name, offer.gpu, offer.profile))

    def _choose_placement(self, ref, name, offer, vfs, earlier, taken):
        """A MIG-backed placement: an untyped VF (its creatable list shows the type only once the GI exists), and the
        claim's `mig` record: the earlier one after a crash (its GI adopted), else a new one."""
        if self.mig is None:
            raise ClaimError("%s: device %s is MIG-backed, and this driver runs no nvidia-smi" % (ref, name))
        key = (ref.uid, name)
        if earlier and isinstance(earlier.get("mig"), dict):
            self.progress[key] = dict(earlier["mig"])
        elif key not in self.progress:
            self.progress[key] = offer.record()
        vf = self.mig.choose(self.sysfs, vfs, taken, earlier.get("key") if earlier else None, offer.type_id)
        if vf is None:
            raise ClaimError("%s: device %s: GPU %s has no free VF for %s" % (ref, name, offer.gpu, offer.profile))
        return self._device(name, offer, vf)

    def mig_record(self, uid, name):
        """The `mig` record of a claim's device (None: not MIG-backed), for the driver's checkpoint."""
        return self.progress.get((uid, name))

    def _vfs(self, gpu):
        """The GPU's VFs, read once (33 sysfs reads) and again when one of them is gone (VFs re-enabled)."""
        known = self.vf_lists.get(gpu)
        if not known or not self.sysfs.exists(vgpu_types.vfio_dir(known[-1]) + "/current_vgpu_type"):
            known = self.vf_lists[gpu] = PciDevice(self.sysfs, gpu).virtfns()
        return known

    @staticmethod
    def _device(name, offer, vf):
        return DraDevice(name=name, framework=claim_time.FRAMEWORK, address=vf, parent_gpu=offer.gpu,
                         profile=offer.profile, type_name=offer.type_name, type_id=offer.type_id,
                         pcie_root=offer.pcie_root, numa_node=offer.numa_node, product=offer.product,
                         framebuffer_mib=offer.size_mib)

    def write(self, ref, device, note=None):
        """Type the chosen VF (nothing to do when it has the type already) and read it back; VfHeld, nothing
        written, when anything but the claim holds it now (asked right before the write, the one holder check).
        A MIG-backed placement creates its GI first (`note()`: the driver saves the claim's record durably, called
        before each step), then checks that the vGPU landed on it (claim_time_mig.py)."""
        record = self.progress.get((ref.uid, device.name))
        if record is None:
            return self._write_type(ref, device)
        self.mig.create(ref, record, note or (lambda: None))
        self._write_type(ref, device)
        try:
            self.mig.check_landed(ref, device, record)
        except ClaimError:
            self._writer().clear_type(device.address, acting_for=(claim_holders.HOLDER % (ref.namespace, ref.name),))
            raise
        return None

    def _write_type(self, ref, device):
        if (vgpu_types.read_current(self.sysfs, device.address) or 0) == device.type_id:
            return
        mine = (claim_holders.HOLDER % (ref.namespace, ref.name),)
        attempt(lambda: self._writer().set_type(device.address, device.type_id, acting_for=mine),
                held=lambda who: VfHeld("%s: VF %s of GPU %s is held by %s; nothing written" % (
                    ref, device.address, device.parent_gpu, who), device.address),
                failed=lambda exc: ClaimError("%s: GPU %s, %s (type %d): %s" % (
                    ref, device.parent_gpu, device.profile, device.type_id, exc)), acting_for=mine)

    def release(self, ref, record):
        """Clear the VF of a claim-time record (unprepare, a prepare that failed, a stale record) when nothing but the
        claim holds it, then destroy the GI a MIG-backed record created (never another); None when done, else why
        the VF keeps its type (and its GI)."""
        why = self._release_vf(ref, record)
        if why is None and isinstance(record.get("mig"), dict) and self.mig is not None:
            why = self.mig.destroy(record["mig"])
        if why is None:
            self.progress.pop((ref.uid, record.get("device")), None)
        return why

    def _release_vf(self, ref, record):
        vf = record.get("key")
        if not vf:
            return None
        try:
            current = vgpu_types.read_current(self.sysfs, vf) or 0
        except (SysfsError, ValueError):
            return "its type cannot be read"
        if not current:
            return None
        if current != record.get("typeID"):
            return "it has type %s now, not the claim's %s" % (current, record.get("typeID"))   # never ours to clear
        mine = (claim_holders.HOLDER % (ref.namespace, ref.name),)
        return attempt(lambda: self._writer().clear_type(vf, acting_for=mine), held=lambda who: "held by %s" % who,
                       acting_for=mine)
