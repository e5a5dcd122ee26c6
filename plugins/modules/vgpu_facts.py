#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: vgpu_facts
short_description: Discover the GPUs, SR-IOV virtual functions and vGPUs of a node
version_added: 0.1.0
description:
  - Reads sysfs and returns the node's GPUs (PCI base class 0x03), the virtual functions (VFs) of those GPUs
    and the mediated devices (mdevs), with the vGPU framework in use, the vGPU types set and creatable,
    and which VFs and mdevs a running VM holds or a prepared DRA claim uses (under O(kubelet_dir)).
  - Read-only. Works on a live C(/sys) and on a copy of one; attributes that are missing or unreadable
    are reported as V(null).
author:
  - accelops.vgpu contributors (@accelops)
extends_documentation_fragment:
  - accelops.vgpu.node_roots
attributes:
  check_mode:
    support: full
    description: Runs unchanged in check mode; it never changes anything.
  diff_mode:
    support: none
    description: Changes nothing, so there is nothing to diff.
  facts:
    support: full
    description: Returns everything as RV(ansible_facts.vgpu).
options: {}
notes:
  - The driver keeps only the numeric ID of the vGPU type set on a VF; RV(ansible_facts.vgpu.vfs[].vgpu_type)
    names it when a creatable list of the same GPU still shows that ID, when M(accelops.vgpu.vgpu_profile)
    recorded the name on this node, or when C(nvidia-smi vgpu -s -v) lists it.
seealso:
  - module: accelops.vgpu.sriov_vfs
"""

EXAMPLES = r"""
- name: Discover GPUs and vGPUs
  accelops.vgpu.vgpu_facts:

- name: Show the vendor-specific VFIO GPUs
  ansible.builtin.debug:
    msg: "{{ ansible_facts.vgpu.gpus | selectattr('framework', 'equalto', 'vendor-vfio') | map(attribute='address') }}"

- name: Refuse to continue while a VM holds a VF
  ansible.builtin.assert:
    that: ansible_facts.vgpu.vfs | selectattr('held') | list | length == 0
"""

RETURN = r"""
ansible_facts:
  description: Facts added to the host.
  returned: always
  type: dict
  contains:
    vgpu:
      description: The node's GPUs, VFs and mdevs.
      type: dict
      contains:
        gpus:
          description: Every GPU that is not a VF, in address order.
          type: list
          elements: dict
          sample:
            - address: "0000:41:00.0"
              vendor: "10de"
              device: "26b9"
              pci_id: "10de:26b9"
              model: L40S
              framework: vendor-vfio
              driver: nvidia
              iommu_group: "10"
              sriov_totalvfs: 32
              sriov_numvfs: 32
              vfs: ["0000:41:00.4", "0000:41:00.5"]
              mdev_types: []
              mig_mode: null
              gpu_instances: []
              reserved: null
              held_whole: null
              held: false
              holders: []
          contains:
            reserved:
              description:
                - Why the collection leaves this GPU alone, null when it does not. A GPU bound to a driver other
                  than C(nvidia) (V(vfio-pci) for whole-GPU passthrough), or to none while C(nvidia) is loaded, is
                  never unbound, rebound or given VFs or vGPUs by V(all); see M(accelops.vgpu.vgpu_profile)'s
                  O(accelops.vgpu.vgpu_profile#module:take_over).
              type: str
              sample: bound to vfio-pci, not to the vGPU host driver nvidia (reserved for whole-GPU passthrough)
            held_whole:
              description:
                - The DRA claim this collection's DRA driver gave the GPU whole to (V(by)) and the step its record is
                  at (V(step), V(bound) once prepared), null otherwise. Such a GPU is held, not reserved; no module
                  gives it VFs or rebinds it until the claim is unprepared.
              type: dict
            held:
              description: Whether a process holds the GPU's own VFIO group (a VM it is passed through to).
              type: bool
            holders:
              description: The processes (pids) or other holders of the GPU's own VFIO group.
              type: list
              elements: raw
            mig_mode:
              description:
                - V(enabled) or V(disabled) on GPUs with MIG (H100, H200), from C(nvidia-smi); null on GPUs
                  without MIG or when nvidia-smi is missing.
              type: str
            gpu_instances:
              description:
                - The MIG GPU instances (C(nvidia-smi mig -lgi)) with C(id), C(profile_id), C(name) (V(1g.20gb))
                  and C(placement) (V(start:size)).
              type: list
              elements: dict
            framework:
              description:
                - V(vendor-vfio) when its VFs have C(nvidia/) (vGPU 17 and later on Ada, Hopper, Blackwell),
                  V(mdev) when it or its VFs are mdev parents, V(none) otherwise (also before SR-IOV is enabled).
              type: str
            model:
              description: Model name from the collection's table of PCI IDs, V(null) when unknown.
              type: str
            mdev_types:
              description: mdev types when the GPU itself is an mdev parent (Turing and older).
              type: list
              elements: dict
        vfs:
          description: Every VF of those GPUs.
          type: list
          elements: dict
          sample:
            - address: "0000:41:00.4"
              pf: "0000:41:00.0"
              iommu_group: "42"
              driver: nvidia
              vgpu_type_id: 1155
              vgpu_type: NVIDIA L40S-24Q
              gpu_instance_id: 0
              creatable_types: [{id: 1155, name: NVIDIA L40S-24Q}]
              mdev_types: []
              mdevs: []
              held: true
              holders: [4242]
          contains:
            vgpu_type_id:
              description: Type ID in C(nvidia/current_vgpu_type), V(0) for none, V(null) without C(nvidia/).
              type: int
            vgpu_type:
              description: Full name of that type when known.
              type: str
            gpu_instance_id:
              description:
                - The MIG GPU instance the VF's MIG-backed vGPU occupies (the driver's C(nvidia/gpu_instance_id));
                  0 for time-sliced types, null without a vGPU.
              type: int
            creatable_types:
              description: Types the VF can take right now (the list shrinks as siblings get types).
              type: list
              elements: dict
            mdev_types:
              description: Types of an mdev parent VF with their available instances.
              type: list
              elements: dict
            held:
              description:
                - Whether a process (a VM) holds the VF or an mdev on it open, in any mount namespace (matched by
                  the open file's device number).
                - Also V(true) when a process could not be inspected and the kernel reports the VFIO group busy or
                  cannot be asked (fail closed).
              type: bool
            holders:
              description:
                - "The pids holding it; a holder that is not a process we could name is a string saying why
                  (C(VFIO group N is open in a process this scan may not inspect ...), C(unknown: ...))."
              type: list
              elements: raw
        mdevs:
          description: Every mediated device.
          type: list
          elements: dict
          sample:
            - uuid: 5c8f3b52-0c1c-4a4b-9f5e-0000000000aa
              parent: "0000:51:00.4"
              type: nvidia-742
              type_name: NVIDIA A2-1B
              iommu_group: "77"
              held: false
              holders: []
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.accelops.vgpu.plugins.module_utils.node import module_glue
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import facts, mig, vgpu_apply


def main():
    module = AnsibleModule(argument_spec=module_glue.node_argspec(), supports_check_mode=True)
    node = module_glue.NodeContext(module)
    with module_glue.engine_errors(module):
        smi = mig.Smi(node.runner)
        found = facts.gather(node.sysfs, node.held(), vgpu_apply.TypeNames(node.sysfs, node.runner),
                             lambda pf: mig.facts(smi, pf), node.held_whole())
    module.exit_json(changed=False, ansible_facts={"vgpu": found})


if __name__ == "__main__":
    main()
