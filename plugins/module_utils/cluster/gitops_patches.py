# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The cluster-side changes of the agent path as manifests a GitOps repo carries, computed from the layouts alone
(no node is read): a kustomize JSON 6902 patch that appends the vGPU resources to the KubeVirt CR's
`permittedHostDevices` (and the HostDevices feature gate), and the GPU Operator ClusterPolicy patch that turns its
own vgpuDeviceManager off. Role kubevirt_vgpu does the same live from the nodes' facts; this is for clusters whose
KubeVirt CR lives in Git.

Only what the layout determines is generated: vendor-specific VFIO GPUs (Ada, Hopper, Blackwell: one
pciHostDevices entry per PCI ID, the KubeVirt device plugin finds the VFs by it). A layout entry without a
device-filter names no PCI ID, and mdev GPUs need the driver's mdev type names (NVIDIA or GRID prefix, by driver
branch): both fail naming the layout, pointing to role kubevirt_vgpu.

Append-only (`add .../-`): entries already in the CR (another vendor's NIC, a foreign GPU) stay, as the role keeps
them; the CR must have the lists (`permittedHostDevices: {pciHostDevices: []}`, `featureGates: []`), since JSON
Patch cannot create a list only when it is missing.
"""

from __future__ import annotations

from ansible_collections.accelops.vgpu.plugins.module_utils.cluster import kubevirt
from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.pci import (
    NVIDIA_VENDOR, PciAddressError, parse_id_filter, vendor_selector)
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.vgpu_types import resource_name

# Device IDs (vendor 10de, gpu_models.NVIDIA_MODELS) whose vGPUs are SR-IOV VFs typed through current_vgpu_type
# (vendor-specific VFIO, vGPU 17+): Ada (L40S, L40, L4, L20), Hopper (H100, H200, GH200), Blackwell (B200, RTX PRO
# 6000). The rest of the table (A2/A16, A10, A40, T4) are mdev GPUs. Source: NVIDIA vGPU 17 release notes, domain
# brief section 9.
VENDOR_VFIO_DEVICES = frozenset(("26b9", "26b5", "27b8", "26ba", "2331", "2330", "2336", "2321", "2335", "233b",
                                 "2342", "2348", "2901", "2bb5"))
MDEV_DEVICES = frozenset(("25b6", "2236", "2235", "1eb8"))
KUBEVIRT_PATH = "/spec/configuration"


class GitopsPatchError(EngineError):
    """A layout the patches cannot be computed from; the message names it."""


def _pci_ids(device_filter, where):
    filters = device_filter if isinstance(device_filter, list) else [device_filter]
    ids = []
    for value in filters:
        try:   # the engine's parser: 0x<device><vendor> (VDM) or vvvv:dddd, as the nodes read it
            vendor, device = parse_id_filter(value)
        except PciAddressError:
            raise GitopsPatchError("%s: device-filter %r is not a PCI ID 0x<device><vendor>" % (where, value)) from None
        if vendor != NVIDIA_VENDOR:
            raise GitopsPatchError("%s: device-filter %r is not an NVIDIA GPU" % (where, value))
        if device in MDEV_DEVICES:
            raise GitopsPatchError("%s: device-filter %r is an mdev GPU; its mediatedDevices entry needs the "
                                   "driver's mdev type name: use role kubevirt_vgpu (it reads the nodes)"
                                   % (where, value))
        if device not in VENDOR_VFIO_DEVICES:
            raise GitopsPatchError("%s: device-filter %r is a GPU model this collection does not know" % (where, value))
        ids.append(vendor_selector(vendor, device))
    return ids


def resources_of(document):
    """[{"name": layout label, "resources": [vgpu_profile-style resource dicts]}] from a VDM document."""
    layouts = []
    for label, entries in sorted(((document or {}).get("vgpu-configs") or {}).items()):
        resources = []
        for index, entry in enumerate(entries or []):
            where = "layout %s entry %d" % (label, index + 1)
            if "device-filter" not in entry:
                raise GitopsPatchError("%s has no device-filter: the GPU model (PCI ID) cannot be told from the "
                                       "layout; add one, or use role kubevirt_vgpu (it reads the nodes)" % where)
            for selector in _pci_ids(entry["device-filter"], where):
                for profile, count in sorted((entry.get("vgpu-devices") or {}).items()):
                    type_name = "NVIDIA " + profile
                    resources.append({"profile": profile, "type_name": type_name,
                                      "resource_name": resource_name(type_name), "pci_vendor_selector": selector,
                                      "framework": "vendor-vfio", "count": count})
        layouts.append({"name": "layout " + label, "resources": resources})
    return layouts


def kubevirt_pci_entries(document, naming="model", provider="kubevirt"):
    """The pciHostDevices entries (KubeVirt spelling) the layouts need; GitopsPatchError when KubeVirt cannot
    serve them (several profiles of one GPU model with naming=profile). naming=model (the agent path's choice: a
    relabel changes the profile, not the resource) is one resource per GPU model. provider=agent (the chart's
    devicePlugin.enabled: the agent's device plugin serves every vGPU) is one `externalResourceProvider: true`
    entry per profile the layouts name, as role kubevirt_vgpu writes with kubevirt_vgpu_provider: agent (same
    planner); it needs naming=profile."""
    plan = kubevirt.plan_cluster_resources(resources_of(document), naming=naming, provider=provider)
    if plan["errors"]:
        raise GitopsPatchError("; ".join(plan["errors"]))
    entries = [kubevirt.pci_entry(e["resource_name"], e["pci_vendor_selector"], e.get("external_resource_provider"))
               for e in plan["pci_host_devices"]]
    kubevirt.validate_entries(kubevirt.PCI, entries, "present")
    return sorted(entries, key=lambda e: e["resourceName"])


def kubevirt_patch(document, naming="model", feature_gate=True, provider="kubevirt"):
    """JSON 6902 operations (a kustomize `patches:` entry's patch) appending the entries and the feature gate."""
    ops = [{"op": "add", "path": KUBEVIRT_PATH + "/permittedHostDevices/pciHostDevices/-", "value": entry}
           for entry in kubevirt_pci_entries(document, naming, provider)]
    if feature_gate and ops:
        ops.append({"op": "add", "path": KUBEVIRT_PATH + "/developerConfiguration/featureGates/-",
                    "value": kubevirt.HOST_DEVICES_GATE})
    return ops


def cluster_policy_patch():
    """A merge patch of the GPU Operator's ClusterPolicy: its vgpuDeviceManager off (the agent manages layouts)."""
    return {"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {"name": "cluster-policy"},
            "spec": {"vgpuDeviceManager": {"enabled": False}}}
