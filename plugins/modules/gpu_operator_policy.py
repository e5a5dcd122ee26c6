#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_operator_policy
short_description: Set the NVIDIA GPU Operator ClusterPolicy fields for vGPU virtual machines
version_added: 0.1.0
description:
  - Sets C(sandboxWorkloads), C(vgpuManager) and C(vgpuDeviceManager.enabled) of the cluster-scoped
    ClusterPolicy (C(nvidia.com/v1)) with a merge patch guarded by the C(resourceVersion) that was read.
  - Only the options that are set are managed; every other field of the ClusterPolicy is left alone.
  - O(vgpu_manager.version) is the driver version WITHOUT the OS suffix; the operator appends
    C(-<os tag>) per node (push the image as C(<version>-<os>)). A version ending in an OS tag fails
    before any request.
  - For Ada, Hopper and Blackwell (vendor-specific VFIO) set O(vgpu_device_manager_enabled=false), because the
    vGPU device manager only creates mdev devices. The sandbox validator's C(vgpu-devices) step also
    counts mdevs only (unconfirmed at runtime); turn it off on those nodes with
    M(accelops.vgpu.node_labels) O(accelops.vgpu.node_labels#module:sandbox_validator=false).
author:
  - accelops.vgpu contributors (@accelops)
extends_documentation_fragment:
  - accelops.vgpu.k8s_auth
  - accelops.vgpu.k8s_write
options:
  name:
    description: Name of the ClusterPolicy.
    type: str
    default: cluster-policy
  sandbox_workloads_enabled:
    description: C(sandboxWorkloads.enabled); V(true) lets nodes labelled C(vm-vgpu) run VM workloads.
    type: bool
  sandbox_workloads_mode:
    description: C(sandboxWorkloads.mode).
    type: str
    choices: [kubevirt, kata]
  sandbox_workloads_default_workload:
    description: C(sandboxWorkloads.defaultWorkload), the workload of nodes without the workload label.
    type: str
    choices: [container, vm-passthrough, vm-vgpu]
  vgpu_manager:
    description: C(vgpuManager) fields; unset suboptions are not managed.
    type: dict
    suboptions:
      enabled:
        description: C(vgpuManager.enabled).
        type: bool
      repository:
        description: Private registry path of the vGPU manager image, for example C(registry.example.com/nvidia).
        type: str
      image:
        description: Image name, for example C(vgpu-manager).
        type: str
      version:
        description: Driver version without the OS suffix (for example C(580.82.02)) or a C(sha256:) digest.
        type: str
  vgpu_device_manager_enabled:
    description: C(vgpuDeviceManager.enabled); V(false) on vendor-specific VFIO clusters (it is mdev-only).
    type: bool
"""

EXAMPLES = r"""
- name: VM workloads with a privately built vGPU manager, no mdev device manager
  accelops.vgpu.gpu_operator_policy:
    sandbox_workloads_enabled: true
    vgpu_manager:
      enabled: true
      repository: registry.example.com/nvidia
      image: vgpu-manager
      version: "580.82.02"
    vgpu_device_manager_enabled: false
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
changes:
  description: One line per changed field.
  returned: always
  type: list
  elements: str
attempts:
  description: Read-merge-write attempts made (more than 1 after HTTP 409 conflicts).
  returned: always
  type: int
diff:
  description: Before and after of the managed fields.
  returned: diff mode
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.accelops.vgpu.plugins.module_utils.cluster.gpu_operator import run_cluster_policy
from ansible_collections.accelops.vgpu.plugins.module_utils.cluster.k8s_args import cluster_argspec
from ansible_collections.accelops.vgpu.plugins.module_utils.cluster.k8s_client import run_cluster_module


def argspec():
    return cluster_argspec(
        name={"type": "str", "default": "cluster-policy"},
        sandbox_workloads_enabled={"type": "bool"},
        sandbox_workloads_mode={"type": "str", "choices": ["kubevirt", "kata"]},
        sandbox_workloads_default_workload={"type": "str", "choices": ["container", "vm-passthrough", "vm-vgpu"]},
        vgpu_manager={"type": "dict", "options": {
            "enabled": {"type": "bool"}, "repository": {"type": "str"},
            "image": {"type": "str"}, "version": {"type": "str"}}},
        vgpu_device_manager_enabled={"type": "bool"},
    )


def main():
    module = AnsibleModule(argument_spec=argspec(), supports_check_mode=True)
    run_cluster_module(module, run_cluster_policy, missing_required_lib("kubernetes"))


if __name__ == "__main__":
    main()
