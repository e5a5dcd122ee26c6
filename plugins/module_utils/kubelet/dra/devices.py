# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The DRA devices of a node: one per programmed vGPU, as plain data computed from the engine's facts.

    inventory(sysfs, facts) -> [DraDevice]   (facts = node.engine.facts.gather(...))
    NodeView(sysfs, read_facts): the driver's reads: every device (publish), or a few by name (prepare)

A vendor-specific VFIO VF with a type set is one device, and so is every mdev. What a device
publishes (docs/design.md "DRA driver"; sources there):
- `resource.kubernetes.io/pciBusID`: the VF (vendor VFIO) or the mdev's parent function, extended BDF;
- `resource.kubernetes.io/pcieRoot`: `pci<domain>:<bus>`, the first element below `devices/` of the
  function's sysfs path (k8s.io/dynamic-resource-allocation deviceattribute.GetPCIeRootAttributeByPCIBusID);
- `mdevUUID` (unqualified, so in the driver's domain) for an mdev: KubeVirt >= 1.8.3 reads it before
  pciBusID from the KEP-5304 metadata file and then attaches the mdev, not the PCI function;
- the driver's own: `profile` (L40S-24Q), `typeName` (NVIDIA L40S-24Q), `typeID` (the driver's numeric
  type ID), `framework` (vendor-vfio | mdev), `parentGPU` (the PF), `productName` (the catalog's model),
  `numaNode` (when sysfs knows it), `migBacked`; capacity `framebuffer` from the profile's size, written as
the API server stores it (quantity.py: `24Gi`, not `24576Mi`).

The device name carries the profile (`l40s-24q-0000-41-00-4`, `t4-1b-<uuid>`): a VF retyped after
the scheduler allocated it is a different device, so Prepare refuses the stale allocation by name alone.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass

from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import quantity
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw import programmed, vgpu_types
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import claim_holders, inuse
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.pci import PCI_DEVICES
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import SysfsError

DRIVER = claim_holders.DRIVER     # vgpu.accelops.io
STANDARD = "resource.kubernetes.io/"
PCI_BUS_ID, PCIE_ROOT = STANDARD + "pciBusID", STANDARD + "pcieRoot"
MDEV_UUID = "mdevUUID"          # unqualified: KubeVirt's key (pkg/dra/metadata/types.go)
MAX_NAME = 63                   # a device name is a DNS label
MAX_STRING = 64                 # an attribute's string value (resource.k8s.io/v1 DeviceAttribute)
# the taint of a claim-time device no longer offered while claims may use it: NoSchedule keeps its allocated claims and
# stops new allocations (KEP-5055, DRADeviceTaints: beta and on by default in 1.36, GA in 1.37; kubernetes
# pkg/features/kube_features.go)
WITHDRAWN_TAINT = {"key": DRIVER + "/withdrawn", "effect": "NoSchedule"}
_LABEL_CHARS = re.compile(r"[^a-z0-9-]+")


@dataclass(frozen=True)
class DraDevice:
    """One allocatable vGPU as the DRA driver publishes (a ResourceSlice device) and prepares it (a device plugin's is
    device_plugin.PluginDevice)."""

    name: str
    framework: str                  # vendor-vfio | mdev
    address: str                    # the VF (vendor VFIO) or the mdev's parent function
    parent_gpu: str
    profile: str
    type_name: str
    type_id: int | None
    mdev_uuid: str | None = None
    pcie_root: str | None = None
    numa_node: int | None = None
    product: str | None = None
    mig_backed: bool = False
    framebuffer_mib: int | None = None

    @property
    def key(self):
        """What a VM or a claim holds: the mdev UUID, else the VF's address (inuse's keys)."""
        return self.mdev_uuid or self.address

    def attributes(self):
        """resource.k8s.io/v1 DeviceAttribute map (ResourceSlice and KEP-5304 metadata)."""
        attrs = {PCI_BUS_ID: {"string": self.address}, "profile": {"string": self.profile},
                 "typeName": {"string": self.type_name[:MAX_STRING]}, "framework": {"string": self.framework},
                 "parentGPU": {"string": self.parent_gpu}, "migBacked": {"bool": self.mig_backed}}
        if self.type_id is not None:
            attrs["typeID"] = {"int": self.type_id}
        if self.mdev_uuid:
            attrs[MDEV_UUID] = {"string": self.mdev_uuid}
        return placed(attrs, self.pcie_root, self.numa_node, self.product)

    def capacity(self):
        # canonical (24Gi, not 24576Mi): the API server stores it so, and a listing publish compares with it
        return {"framebuffer": {"value": quantity.mebibytes(self.framebuffer_mib)}} if self.framebuffer_mib else {}

    def to_api(self):
        """The Device entry of a resource.k8s.io/v1 ResourceSlice."""
        entry = {"name": self.name, "attributes": self.attributes()}
        if self.framebuffer_mib:
            entry["capacity"] = self.capacity()
        return entry


def placed(attrs, root, numa, product):
    """`attrs` with where the GPU sits and what it is, where known: pcieRoot, numaNode, productName."""
    if root:
        attrs[PCIE_ROOT] = {"string": root}
    if numa is not None:
        attrs["numaNode"] = {"int": numa}
    if product:
        attrs["productName"] = {"string": product[:MAX_STRING]}
    return attrs


def device_name(profile, ident):
    """`<profile>-<address or uuid>` as a DNS label: lower case, `:`/`.` -> `-`, at most 63 characters."""
    suffix = _LABEL_CHARS.sub("-", ident.lower()).strip("-")
    prefix = _LABEL_CHARS.sub("-", profile.lower()).strip("-")[:MAX_NAME - len(suffix) - 1].strip("-")
    return "%s-%s" % (prefix, suffix) if prefix else suffix


def pcie_root(sysfs, address):
    """`pci0000:41` for a function linked from bus/pci/devices to devices/pci0000:41/..., else None."""
    target = sysfs.readlink("%s/%s" % (PCI_DEVICES, address))
    if not target:
        return None
    parts = posixpath.normpath(posixpath.join(PCI_DEVICES, target)).split("/")
    if len(parts) >= 3 and parts[0] == "devices" and parts[1].startswith("pci") and parts[-1] == address:
        return parts[1]
    return None


def numa_node(sysfs, address):
    """The function's NUMA node; None where the kernel says -1 (no NUMA) or does not say."""
    try:
        value = sysfs.read_int("%s/%s/numa_node" % (PCI_DEVICES, address))
    except SysfsError:
        return None
    return value if value is not None and value >= 0 else None


def _framebuffer_mib(profile):
    try:
        return vgpu_types.parse_profile(profile).size_gb * 1024
    except vgpu_types.VgpuTypeError:
        return None


def vfio_nodes(sysfs, device):
    """The device's VFIO nodes relative to `<dev>/vfio/`: its IOMMU group, and the iommufd cdev of a VF."""
    if device.mdev_uuid:
        base = "%s/%s" % (inuse.MDEV_DEVICES, device.mdev_uuid)
    else:
        base = "%s/%s" % (PCI_DEVICES, device.address)
    return tuple(inuse.device_nodes(sysfs, base))


def still_there(sysfs, device):
    """Whether the vGPU is still what was published (a few reads of this one device)."""
    try:
        if device.mdev_uuid:
            base = "%s/%s" % (inuse.MDEV_DEVICES, device.mdev_uuid)
            return sysfs.isdir(base) and sysfs.link_name(base + "/mdev_type") == "nvidia-%s" % device.type_id
        return device.type_id is not None and vgpu_types.read_current(sysfs, device.address) == device.type_id
    except (SysfsError, OSError, ValueError):
        return False


class _GpuPlace:
    """pcieRoot and NUMA node of each GPU, read once per inventory."""

    def __init__(self, sysfs):
        self.sysfs, self.cache = sysfs, {}

    def __call__(self, address):
        if address not in self.cache:
            self.cache[address] = (pcie_root(self.sysfs, address), numa_node(self.sysfs, address))
        return self.cache[address]


def _common(place, gpu, profile, type_name):
    root, numa = place(gpu["address"])
    return {"parent_gpu": gpu["address"], "profile": profile, "type_name": type_name, "pcie_root": root,
            "numa_node": numa, "product": gpu.get("model"), "mig_backed": vgpu_types.mig_backed(profile),
            "framebuffer_mib": _framebuffer_mib(profile)}


def inventory(sysfs, facts):
    """[DraDevice] of the node, sorted by name; `facts` is node.engine.facts.gather()'s result.

    A VF whose type has no known name (no creatable list or nvidia-smi names it) is left out: a
    device nobody can select by profile is not offered (node/hw/programmed.py says which vGPUs there are)."""
    return _devices(sysfs, programmed.programmed(*programmed.of_facts(facts)))


def from_apply(sysfs, result):
    """[DraDevice] of the node from an apply result (`gpus[].vgpus[]`, the type names from `resources[]`): the
    reconcile's own inventory, as the device plugin uses it, so publishing costs no second scan of the node.
    Same devices as `inventory()` reads for the GPUs the layout selects."""
    return _devices(sysfs, programmed.programmed(*programmed.of_apply(result)))


def _devices(sysfs, vgpus):
    """[DraDevice] of node/hw/programmed.py's [Programmed], sorted by name."""
    place = _GpuPlace(sysfs)
    found = [DraDevice(name=device_name(vgpu.profile, vgpu.uuid or vgpu.address),
                       framework="mdev" if vgpu.uuid else "vendor-vfio", address=vgpu.address, type_id=vgpu.type_id,
                       mdev_uuid=vgpu.uuid, **_common(place, vgpu.gpu, vgpu.profile, vgpu.type_name))
             for vgpu in vgpus]
    return sorted(found, key=lambda device: device.name)


class NodeView:
    """The DRA driver's reads of the node. `devices()` reads everything (facts -> inventory) and
    remembers it; `current(names)` answers for a few devices with a few reads each (prepare's check:
    still there with the type they were read with), doing one full read only for a name it has not
    seen; `nodes(device)` are its VFIO nodes for the CDI spec. `serves(gpu address)`: the GPUs whose vGPUs are
    the driver's (DRA_DRIVER_GPUS, the others may be the device plugin's); None: every GPU."""

    def __init__(self, sysfs, read_facts, serves=None):
        self.sysfs, self.read_facts, self.serves = sysfs, read_facts, serves
        self.known = {}

    def devices(self):
        return self.remember(inventory(self.sysfs, self.read_facts()))

    def remember(self, found):
        """`found` (a full inventory, e.g. from_apply's) becomes what `current()` answers from; the vGPUs of GPUs
        this driver does not serve are left out."""
        if self.serves is not None:
            found = [device for device in found if self.serves(device.parent_gpu)]
        self.known = {device.name: device for device in found}
        return found

    def still_there(self):
        """The remembered devices that are still what they were (a few reads each); a full read when nothing
        is remembered yet."""
        if not self.known:
            return self.devices()
        return self.remember([device for name, device in sorted(self.known.items()) if still_there(self.sysfs, device)])

    def current(self, names):
        if any(name not in self.known for name in names):
            self.devices()
        known = self.known
        return {name: known[name] for name in names if name in known and still_there(self.sysfs, known[name])}

    def nodes(self, device):
        return vfio_nodes(self.sysfs, device)
