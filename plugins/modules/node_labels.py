#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: node_labels
short_description: Label a Kubernetes node for vGPU workloads and its vGPU profiles
version_added: 0.1.0
description:
  - Sets C(nvidia.com/gpu.workload.config) (default V(vm-vgpu)) so the GPU Operator deploys its VM
    components on the node, and one label per vGPU profile, C(<profile_label_prefix><profile>=<count>)
    (default prefix C(accelops.io/vgpu.profile.), for example C(accelops.io/vgpu.profile.L40S-24Q=2)).
    KubeVirt sees one resource per GPU model, so VMs pick a profile by node affinity on this label.
  - Labels this module does not own are never touched. Ours are the profile labels (every label with
    O(profile_label_prefix); stale profiles are removed), O(labels), and the workload, sandbox
    validator and vGPU device manager labels while they hold the value this task sets.
  - V(absent) removes only ours.
author:
  - accelops.vgpu contributors (@accelops)
extends_documentation_fragment:
  - accelops.vgpu.k8s_auth
  - accelops.vgpu.k8s_write
options:
  name:
    description: Name of the node.
    type: str
    required: true
  state:
    description: V(present) sets our labels and removes stale profile labels; V(absent) removes ours.
    type: str
    choices: [present, absent]
    default: present
  workload_config:
    description: Value of C(nvidia.com/gpu.workload.config); empty to leave the label alone.
    type: str
    default: vm-vgpu
  profiles:
    description:
      - "vGPU profiles on the node and how many of each, for example C({\"L40S-24Q\": 2})."
      - Profile names must be valid label name parts (letters, digits, C(-), C(_), C(.)).
    type: dict
    default: {}
  profile_label_prefix:
    description: Prefix of the profile label keys (a DNS subdomain, C(/), then a name start).
    type: str
    default: accelops.io/vgpu.profile.
  sandbox_validator:
    description:
      - Set C(nvidia.com/gpu.deploy.sandbox-validator) to V(false) (or V(true)) on the node; unset leaves it alone.
      - V(false) is the workaround for vendor-specific VFIO nodes, where the validator's C(vgpu-devices) step
        waits for mdev devices that never appear (inferred from the GPU Operator code, unconfirmed at runtime).
    type: bool
  vgpu_device_manager:
    description:
      - Set C(nvidia.com/gpu.deploy.vgpu-device-manager) to V(false) (or V(true)) on the node; unset leaves it alone.
      - V(false) keeps the GPU Operator's vGPU device manager off a node whose vGPUs this collection programs;
        without a C(nvidia.com/vgpu.config) label it applies its default config, deleting and re-creating every
        vGPU, so the node would have two owners.
    type: bool
  release_deploy_switches:
    description:
      - Deploy switches (V(sandbox_validator), V(vgpu_device_manager)) no longer wanted on the node. Each is removed
        while it still holds the value this collection set, as recorded in the Node annotation
        C(accelops.io/vgpu.deploy-switches) (written whenever the module sets a switch); one set by someone
        else, or changed since, stays (so does one set before the annotation existed; remove it by hand once).
      - A switch also given as O(sandbox_validator) or O(vgpu_device_manager) is not released.
    type: list
    elements: str
    choices: [sandbox_validator, vgpu_device_manager]
    default: []
  labels:
    description: Further labels this task owns on the node.
    type: dict
    default: {}
"""

EXAMPLES = r"""
- name: Label an L40S node that carries two L40S-24Q vGPUs
  accelops.vgpu.node_labels:
    name: gpu-node-1
    profiles:
      L40S-24Q: 2
    sandbox_validator: false
  delegate_to: localhost
"""

RETURN = r"""
changes:
  description: One line per label set or removed.
  returned: always
  type: list
  elements: str
labels:
  description: The labels this task manages, as they are (or would be) after the run.
  returned: always
  type: dict
attempts:
  description: Read-merge-write attempts made (more than 1 after HTTP 409 conflicts).
  returned: always
  type: int
diff:
  description: Before and after of the managed labels.
  returned: diff mode
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.accelops.vgpu.plugins.module_utils.cluster.gpu_operator import run_node_labels
from ansible_collections.accelops.vgpu.plugins.module_utils.cluster.k8s_args import cluster_argspec
from ansible_collections.accelops.vgpu.plugins.module_utils.cluster.k8s_client import run_cluster_module


def argspec():
    return cluster_argspec(
        name={"type": "str", "required": True},
        state={"type": "str", "choices": ["present", "absent"], "default": "present"},
        workload_config={"type": "str", "default": "vm-vgpu"},
        profiles={"type": "dict", "default": {}},
        profile_label_prefix={"type": "str", "default": "accelops.io/vgpu.profile."},
        sandbox_validator={"type": "bool"},
        vgpu_device_manager={"type": "bool"},
        release_deploy_switches={"type": "list", "elements": "str", "default": [],
                                 "choices": ["sandbox_validator", "vgpu_device_manager"]},
        labels={"type": "dict", "default": {}},
    )


def main():
    module = AnsibleModule(argument_spec=argspec(), supports_check_mode=True)
    run_cluster_module(module, run_node_labels, missing_required_lib("kubernetes"))


if __name__ == "__main__":
    main()
