#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: kubevirt_hostdevices
short_description: Manage KubeVirt permitted host devices (vGPU resources) keyed by resourceName
version_added: 0.1.0
description:
  - Finds the KubeVirt CR (any namespace, or the one pinned by O(name) and O(namespace)) and manages
    entries of C(spec.configuration.permittedHostDevices.pciHostDevices) and C(.mediatedDevices)
    keyed by C(resourceName).
  - Entries with other resource names are never lost or reordered; ours are updated in place, new
    ones appended.
  - One device, one resource name. An entry with another resource name and the same C(pciVendorSelector)
    (compared case-insensitively) or C(mdevNameSelector) as one of ours would make KubeVirt run two device
    plugins for the same devices; the task fails before writing, naming both entries, unless that resource
    name is listed in O(take_over), which replaces the other entry (shown in C(changes) and the diff, also in
    check mode). The whole list is written guarded by the C(resourceVersion) that was read, and
    read, merged and written again when another writer got in between (HTTP 409).
  - What this collection wrote is its own. The annotation C(accelops.io/vgpu.owned-host-devices) on the CR
    lists the resource names it added (JSON, updated in the same write; an entry of ours that already
    matches is claimed in a metadata-only write). Such an entry that carries the selector of one of ours
    under another resource name (a fleet profile change, V(nvidia.com/NVIDIA_L40S-24Q) to
    V(nvidia.com/NVIDIA_L40S-12Q)) is replaced without O(take_over); with O(prune_owned) every listed
    entry no longer wanted goes. Entries the annotation does not list keep the rules above.
  - Adds the C(HostDevices) feature gate to C(spec.configuration.developerConfiguration.featureGates)
    when entries are present (other gates are kept; the gate is never removed).
  - Vendor-specific VFIO vGPU (C(nvidia)-bound virtual functions in O(pci_host_devices)) needs
    KubeVirt 1.9.0 or newer; an older deployed version fails unless O(skip_version_check) is set.
  - O(virt_handler_image) runs a patched virt-handler (for example one carrying KubeVirt PR 16890 on an
    older release) through the C(VIRT_HANDLER_IMAGE) environment variable of the virt-operator Deployment;
    unlike C(spec.imageRegistry) and C(spec.imageTag) of the CR, it leaves the other KubeVirt components alone.
author:
  - accelops.vgpu contributors (@accelops)
extends_documentation_fragment:
  - accelops.vgpu.k8s_auth
  - accelops.vgpu.k8s_write
options:
  name:
    description: Name of the KubeVirt CR. Without it, the only KubeVirt CR of the cluster is used.
    type: str
  namespace:
    description: Namespace of the KubeVirt CR. Without it, all namespaces are searched.
    type: str
  state:
    description:
      - V(present) adds or updates the listed entries; V(absent) removes the entries with the listed
        resource names (selectors are not needed then).
    type: str
    choices: [present, absent]
    default: present
  pci_host_devices:
    description: Entries of C(pciHostDevices), keyed by O(pci_host_devices[].resource_name).
    type: list
    elements: dict
    default: []
    suboptions:
      resource_name:
        description: The C(resourceName), for example C(nvidia.com/NVIDIA_L40S-24Q).
        type: str
        required: true
      pci_vendor_selector:
        description: C(VVVV:DDDD), for example C(10DE:26B9). Required with O(state=present).
        type: str
      external_resource_provider:
        description: Whether an external device plugin allocates the device (KubeVirt only permits it).
        type: bool
        default: false
      vendor_vfio:
        description:
          - Whether the entry serves C(nvidia)-bound vGPU virtual functions (vendor-specific VFIO), which
            needs KubeVirt 1.9.0 or newer. Set V(false) for plain C(vfio-pci) passthrough.
        type: bool
        default: true
  mediated_devices:
    description: Entries of C(mediatedDevices), keyed by O(mediated_devices[].resource_name).
    type: list
    elements: dict
    default: []
    suboptions:
      resource_name:
        description: The C(resourceName), for example C(nvidia.com/GRID_T4-1Q).
        type: str
        required: true
      mdev_name_selector:
        description: The mdev type's C(name), for example C(GRID T4-1Q). Required with O(state=present).
        type: str
      external_resource_provider:
        description: Whether an external device plugin (the NVIDIA sandbox device plugin) serves the device.
        type: bool
        default: false
  exclusive_pci_vendors:
    description:
      - PCI vendor IDs (for example V(10DE)) whose C(pciHostDevices) entries this task owns completely;
        entries of these vendors whose resource name is not listed are removed (with O(state=absent), all of
        them are). Entries of other vendors are never touched.
    type: list
    elements: str
    default: []
  exclusive_mdev_prefixes:
    description:
      - C(mdevNameSelector) prefixes (for example V(GRID ), V(NVIDIA )) whose C(mediatedDevices)
        entries this task owns completely, as O(exclusive_pci_vendors).
    type: list
    elements: str
    default: []
  take_over:
    description:
      - Resource names of entries written by others (by hand, another tool) that permit the same devices as
        one of ours (same C(pciVendorSelector) or C(mdevNameSelector)) and are to be replaced by ours, for
        example V(nvidia.com/L40S-24Q) from a runbook when migrating to this collection.
      - Only an entry that selects one of our devices is removed; a listed name whose entry selects other
        devices is left alone, and names not present are fine (the task stays idempotent after the take-over).
      - Ignored with O(state=absent).
    type: list
    elements: str
    default: []
  prune_owned:
    description:
      - Remove the entries this collection wrote in earlier runs (listed in the annotation
        C(accelops.io/vgpu.owned-host-devices)) that O(pci_host_devices) and O(mediated_devices) no longer list,
        for example the mdev type of an earlier profile. Set it where the task lists everything the collection
        permits (the C(kubevirt_vgpu) role does); leave it off where several tasks each list a part.
    type: bool
    default: false
  feature_gate:
    description: Add the C(HostDevices) feature gate when entries are present.
    type: bool
    default: true
  skip_version_check:
    description: Proceed with vendor-VFIO entries whatever KubeVirt version is deployed (a warning is shown).
    type: bool
    default: false
  virt_handler_image:
    description:
      - Image for virt-handler, set as C(VIRT_HANDLER_IMAGE) on the C(virt-operator) container of the
        O(virt_operator_deployment) Deployment in the KubeVirt CR's namespace; V("") removes the override.
      - Unset leaves the Deployment alone.
    type: str
  virt_operator_deployment:
    description: Name of the virt-operator Deployment (in the KubeVirt CR's namespace).
    type: str
    default: virt-operator
  minimum_version:
    description: The KubeVirt version vendor-VFIO entries need (from C(status.observedKubeVirtVersion)).
    type: str
    default: 1.9.0
"""

EXAMPLES = r"""
- name: Permit the L40S-24Q vGPU VFs of the vGPU nodes
  accelops.vgpu.kubevirt_hostdevices:
    kubeconfig: /etc/kubernetes/admin.conf
    pci_host_devices:
      - pci_vendor_selector: "10DE:26B9"
        resource_name: nvidia.com/NVIDIA_L40S-24Q
  delegate_to: localhost
  run_once: true

- name: Own all NVIDIA PCI entries (others' NVIDIA entries are removed, other vendors kept)
  accelops.vgpu.kubevirt_hostdevices:
    pci_host_devices:
      - {pci_vendor_selector: "10DE:2331", resource_name: nvidia.com/NVIDIA_H100-40C}
    exclusive_pci_vendors: ["10DE"]

- name: Migrate from a hand-written entry for the same VFs (it is removed in the same write)
  accelops.vgpu.kubevirt_hostdevices:
    pci_host_devices:
      - {pci_vendor_selector: "10DE:26B9", resource_name: nvidia.com/NVIDIA_L40S-24Q}
    take_over: [nvidia.com/L40S-24Q]

- name: Remove a mediated device resource
  accelops.vgpu.kubevirt_hostdevices:
    state: absent
    mediated_devices:
      - resource_name: nvidia.com/GRID_T4-1Q
"""

RETURN = r"""
changes:
  description:
    - "One line per change, for example C(pciHostDevices: add nvidia.com/NVIDIA_L40S-24Q) or
      C(pciHostDevices: remove nvidia.com/L40S-24Q (taken over by nvidia.com/NVIDIA_L40S-24Q))."
  returned: always
  type: list
  elements: str
attempts:
  description: Read-merge-write attempts made (more than 1 after HTTP 409 conflicts).
  returned: always
  type: int
kubevirt:
  description: The KubeVirt CR that was managed.
  returned: always
  type: dict
  contains:
    name: {description: Name of the CR., type: str, returned: always}
    namespace: {description: Namespace of the CR., type: str, returned: always}
    version: {description: Deployed KubeVirt version from the CR status., type: str, returned: always}
diff:
  description: Before and after of C(permittedHostDevices) lists, C(featureGates) and, with O(virt_handler_image), C(virtHandlerImage).
  returned: diff mode
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.accelops.vgpu.plugins.module_utils.cluster.k8s_args import cluster_argspec
from ansible_collections.accelops.vgpu.plugins.module_utils.cluster.k8s_client import run_cluster_module
from ansible_collections.accelops.vgpu.plugins.module_utils.cluster.kubevirt import run_hostdevices


def argspec():
    return cluster_argspec(
        name={"type": "str"},
        namespace={"type": "str"},
        state={"type": "str", "choices": ["present", "absent"], "default": "present"},
        pci_host_devices={"type": "list", "elements": "dict", "default": [], "options": {
            "resource_name": {"type": "str", "required": True},
            "pci_vendor_selector": {"type": "str"},
            "external_resource_provider": {"type": "bool", "default": False},
            "vendor_vfio": {"type": "bool", "default": True},
        }},
        mediated_devices={"type": "list", "elements": "dict", "default": [], "options": {
            "resource_name": {"type": "str", "required": True},
            "mdev_name_selector": {"type": "str"},
            "external_resource_provider": {"type": "bool", "default": False},
        }},
        exclusive_pci_vendors={"type": "list", "elements": "str", "default": []},
        exclusive_mdev_prefixes={"type": "list", "elements": "str", "default": []},
        take_over={"type": "list", "elements": "str", "default": []},
        prune_owned={"type": "bool", "default": False},
        feature_gate={"type": "bool", "default": True},
        skip_version_check={"type": "bool", "default": False},
        minimum_version={"type": "str", "default": "1.9.0"},
        virt_handler_image={"type": "str"},
        virt_operator_deployment={"type": "str", "default": "virt-operator"},
    )


def main():
    module = AnsibleModule(argument_spec=argspec(), supports_check_mode=True)
    run_cluster_module(module, run_hostdevices, missing_required_lib("kubernetes"))


if __name__ == "__main__":
    main()
