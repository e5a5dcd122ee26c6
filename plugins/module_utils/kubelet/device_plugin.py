# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The vGPUs a node offers the kubelet, one resource per profile, as plain data (standard library only).

Computed from the engine's own result (vgpu_apply.apply: which VF or mdev carries which type, after the
layout was applied and verified), so the agent's reconcile and the device plugin share one read of the node;
the only extra reads are per served device (its NUMA node, IOMMU group, VFIO cdev, and, for health, its
driver and current type), never a scan of the PCI bus.

- Resource names are the ones the collection already gives KubeVirt (vgpu_types.resource_name:
  `nvidia.com/NVIDIA_L40S-24Q`), so VM specs keep working when a cluster switches provider.
- Device IDs: the VF's PCI address (vendor-specific VFIO) or the mdev UUID.
- Allocate answers what KubeVirt's virt-launcher reads for an `externalResourceProvider: true` entry
  [kubevirt v1.9.0]: env `PCI_RESOURCE_<NAME>` (PCI addresses) or `MDEV_PCI_RESOURCE_<NAME>` (mdev UUIDs),
  NAME the resource name upper-cased with `/` and `.` turned into `_` (pkg/util/util.go:89-94, prefixes
  staging/src/kubevirt.io/api/core/v1/types.go:3672-3673), the value comma-separated
  (pkg/virt-launcher/virtwrap/device/hostdevice/addresspool.go:46-61); and the device nodes KubeVirt's own
  plugins hand out (pkg/virt-handler/device-manager/common.go:275-315): /dev/vfio/vfio, /dev/vfio/<IOMMU group>
  and, where the VF has them, its iommufd cdevs /dev/vfio/devices/vfioN, all `mrw`.
- Health: a VF whose device is gone, whose driver is not `nvidia` any more, or whose current type is not the
  one applied (a vGPU-manager restart resets the types) is Unhealthy; an mdev that is gone or changed type too.
  Whether a VM holds the vGPU does not matter: the kubelet keeps its own allocation accounting, so capacity
  never shrinks under running VMs.
- Allocate against a reconcile (issue 40): an Unhealthy vGPU, or one whose current type is no longer the one served,
  is refused (still_served), under the allocation record's lock, which the engine holds around each VF's re-check
  and write.
"""

from __future__ import annotations

import os
import threading
from collections import namedtuple

from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw import pci, programmed, vgpu_types
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.errors import AllocationError

PCI_PREFIX, MDEV_PREFIX = "PCI_RESOURCE", "MDEV_PCI_RESOURCE"   # KubeVirt's v1.PCIResourcePrefix, MDevResourcePrefix
VFIO_DEVICE, VFIO_DIR = "/dev/vfio/vfio", "/dev/vfio"
PCI, MDEV = "pci", "mdev"
NVIDIA_DRIVER = "nvidia"


class PluginDevice(namedtuple("PluginDevice", "id resource kind parent type_id healthy numa_nodes iommu_group cdevs")):
    """One vGPU the device plugin lists to the kubelet and hands out in Allocate (a DRA device is dra/devices.DraDevice).
    kind: pci (id = VF address) or mdev (id = UUID, parent = its VF/PF);
    type_id: the applied type (vendor-VFIO numeric ID, or mdev type directory name)."""


Allocation = namedtuple("Allocation", "envs device_specs mounts annotations")


def env_name(prefix, resource_name):
    """KubeVirt's ResourceNameToEnvVar: `nvidia.com/NVIDIA_L40S-24Q` -> `PCI_RESOURCE_NVIDIA_COM_NVIDIA_L40S-24Q`."""
    return "%s_%s" % (prefix, resource_name.upper().replace("/", "_").replace(".", "_"))


def _numa_nodes(sysfs, address):
    """[node] from the PCI function's numa_node; -1 or no attribute: no topology."""
    try:
        node = sysfs.read_int("%s/%s/numa_node" % (pci.PCI_DEVICES, address), -1)
    except (EngineError, OSError, ValueError):
        return ()
    return (node,) if node is not None and node >= 0 else ()


def _cdevs(sysfs, address):
    return tuple(n for n in sysfs.listdir("%s/%s/vfio-dev" % (pci.PCI_DEVICES, address)) if n.startswith("vfio"))


def _device(sysfs, resource, address, type_id, uuid=None):
    """One PluginDevice, Healthy: a VF (vendor-specific VFIO) or, with `uuid`, an mdev on `address`."""
    if uuid:
        group = sysfs.link_name("%s/%s/iommu_group" % (vgpu_types.MDEV_DEVICES, uuid))
        return PluginDevice(uuid, resource, MDEV, address, type_id, True, _numa_nodes(sysfs, address), group, ())
    group = sysfs.link_name("%s/%s/iommu_group" % (pci.PCI_DEVICES, address))
    return PluginDevice(address, resource, PCI, address, type_id, True, _numa_nodes(sysfs, address), group,
                        _cdevs(sysfs, address))


def devices_from_apply(sysfs, result, serves=None):
    """[PluginDevice] from an apply result (`gpus[].vgpus[]` and `resources[]`, read by node/hw/programmed.py), every one
    Healthy (just verified), in the result's GPU order; `serves(gpu address)`: whether this plugin serves that GPU's
    vGPUs (None: every GPU)."""
    order = dict((gpu.get("address"), n) for n, gpu in enumerate(result.get("gpus") or ()))
    devices = []
    for vgpu in sorted(programmed.programmed(*programmed.of_apply(result)), key=lambda v: order[v.gpu["address"]]):
        if not vgpu.gpu.get("pci_id") or (serves is not None and not serves(vgpu.gpu["address"])):
            continue
        devices.append(_device(sysfs, vgpu_types.resource_name(vgpu.type_name), vgpu.address,
                               vgpu.mdev_type if vgpu.uuid else vgpu.type_id, vgpu.uuid))
    return devices


def devices_programmed(sysfs, found, gpus=None, serves=None):
    """[PluginDevice] of the vGPUs sysfs shows programmed, each as healthy as the node says now: what the plugin
    serves when no apply succeeded since the agent started (a layout refused because a VM holds a VF).

    `found`: the DRA driver's read of the node (kubelet/dra/devices.inventory, i.e. node/hw/programmed.py's answer
    for node facts: one entry per typed VF or mdev, with
    its parent GPU, type name and ID); `gpus`: the GPU addresses the layout selects (None: every GPU);
    `serves(gpu address)` as for devices_from_apply. Same devices, IDs and type IDs as devices_from_apply gives
    for the same node, so a later successful apply changes nothing the kubelet sees."""
    devices = []
    for vgpu in found:
        if (gpus is not None and vgpu.parent_gpu not in gpus) or (serves is not None and not serves(vgpu.parent_gpu)):
            continue
        type_id = vgpu.type_id
        if vgpu.mdev_uuid:
            type_id = None if type_id is None else "nvidia-%d" % type_id   # the mdev type's directory name
        device = _device(sysfs, vgpu_types.resource_name(vgpu.type_name), vgpu.address, type_id, vgpu.mdev_uuid)
        devices.append(device._replace(healthy=is_healthy(sysfs, device)))
    return devices


def is_healthy(sysfs, device):
    """Whether the vGPU is still what was applied (a few reads of this one device)."""
    if device.kind == MDEV:
        base = "%s/%s" % (vgpu_types.MDEV_DEVICES, device.id)
        return sysfs.isdir(base) and sysfs.link_name(base + "/mdev_type") == device.type_id
    base = "%s/%s" % (pci.PCI_DEVICES, device.id)
    if not sysfs.isdir(base) or sysfs.link_name(base + "/driver") != NVIDIA_DRIVER:
        return False
    try:
        return vgpu_types.read_current(sysfs, device.id) == device.type_id
    except (EngineError, OSError, ValueError):   # an unreadable attribute is no healthy vGPU
        return False


def check_health(sysfs, devices):
    """The same devices with `healthy` as the node says now."""
    return [d._replace(healthy=is_healthy(sysfs, d)) for d in devices]


def allocate(resource, devices, ids):
    """The Allocation for one container asking `ids` of `resource`; AllocationError names an unknown ID."""
    by_id = dict((d.id, d) for d in devices)
    chosen = []
    for device_id in ids:
        if device_id not in by_id:
            raise AllocationError("resource %s: no vGPU %s on this node" % (resource, device_id))
        chosen.append(by_id[device_id])
    specs, seen = [(VFIO_DEVICE, VFIO_DEVICE, "mrw")], {VFIO_DEVICE}
    for device in chosen:
        nodes = (["%s/%s" % (VFIO_DIR, device.iommu_group)] if device.iommu_group else []) + \
            ["%s/devices/%s" % (VFIO_DIR, cdev) for cdev in device.cdevs]
        for node in nodes:
            if node not in seen:
                seen.add(node)
                specs.append((node, node, "mrw"))
    kinds = set(d.kind for d in chosen) or {PCI}
    prefix = MDEV_PREFIX if kinds == {MDEV} else PCI_PREFIX
    return Allocation({env_name(prefix, resource): ",".join(d.id for d in chosen)}, specs, [], {})


class CurrentTypes:
    """The type a served vGPU carries now, as Allocate reads it (still_served): a VF's `current_vgpu_type` through a
    descriptor kept open per VF and read again from offset 0 (a sysfs attribute shows its value at each read from
    the start; a path walk costs a lookup per component, about 1 ms of P6's Allocate on gpusim's FUSE, a pread
    0.05 ms); an mdev's type link. A descriptor that fails (the VF went) is opened once more, then the error stands."""

    def __init__(self, sysfs):
        self.sysfs = sysfs
        self._fds, self._lock = {}, threading.Lock()

    def of(self, device):
        if device.kind == MDEV:
            return self.sysfs.link_name("%s/%s/mdev_type" % (vgpu_types.MDEV_DEVICES, device.id))
        with self._lock:
            for attempt in (1, 2):
                fd = self._fds.get(device.id)
                if fd is None:
                    path = os.path.join(self.sysfs.root, vgpu_types.vfio_dir(device.id), "current_vgpu_type")
                    fd = self._fds[device.id] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    return int(os.pread(fd, 64, 0).strip() or 0)
                except OSError:
                    os.close(self._fds.pop(device.id))
                    if attempt == 2:
                        raise
        return None

    def keep(self, ids):
        """Close the descriptors of the vGPUs not in `ids` (no longer served)."""
        with self._lock:
            for device_id in [i for i in self._fds if i not in ids]:
                os.close(self._fds.pop(device_id))


def still_served(types, resource, devices):
    """AllocationError unless each of `devices` is Healthy and still carries the type it is served with (`types`:
    CurrentTypes, one read each; None: not read). A reconcile marks the vGPUs it will change Unhealthy before its
    first write (VgpuDevicePlugin.withdraw) and retypes each under the allocation record's lock, which the Allocate
    holds around this check and its journal line: a VF is either recorded before its re-check (the reconcile
    stops) or refused here after its write."""
    for device in devices:
        if not device.healthy:
            raise AllocationError("resource %s: vGPU %s is Unhealthy (a reconcile is changing it, or it is not what "
                                  "was applied); not allocated" % (resource, device.id))
        if types is None:
            continue
        try:
            now = types.of(device)
        except (EngineError, OSError, ValueError) as exc:
            raise AllocationError("resource %s: vGPU %s: its current type cannot be read (%s); not allocated"
                                  % (resource, device.id, exc)) from None
        if now != device.type_id:
            raise AllocationError("resource %s: vGPU %s now has type %s, not the %s this resource serves (retyped "
                                  "by a reconcile); not allocated" % (resource, device.id, now, device.type_id))


class ResourceView:
    """What the device plugin server serves for one resource: its devices and its Allocate. `record(resource, ids,
    check)` (kubelet/pod_resources.AllocationRecord.add) records the allocation durably before Allocate answers,
    calling `check()` under the record's lock first; raising AllocationError fails the Allocate. `types`
    (CurrentTypes): each allocated vGPU's current type read again (still_served); None: not read."""

    def __init__(self, resource, devices, record=None, types=None):
        self.resource, self.devices, self.record, self.types = resource, list(devices), record, types

    def allocate(self, ids):
        allocation = allocate(self.resource, self.devices, ids)
        by_id = dict((d.id, d) for d in self.devices)
        chosen = [by_id[i] for i in ids]

        def check():
            still_served(self.types, self.resource, chosen)
        if self.record is not None:
            self.record(self.resource, list(ids), check)
        else:
            check()
        return allocation

    def __eq__(self, other):
        return isinstance(other, ResourceView) and (self.resource, self.devices) == (other.resource, other.devices)

    def __repr__(self):
        return "ResourceView(%r, %r)" % (self.resource, self.devices)


def resource_views(devices, record=None, types=None):
    """{resource name: ResourceView}, devices in ID order; `record`, `types`: see ResourceView."""
    grouped = {}
    for device in sorted(devices, key=lambda d: d.id):
        grouped.setdefault(device.resource, []).append(device)
    return dict((name, ResourceView(name, devs, record, types)) for name, devs in grouped.items())
