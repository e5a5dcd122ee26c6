#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: sriov_vfs
short_description: Enable or disable SR-IOV virtual functions on GPUs and other PCI devices
version_added: 0.1.0
description:
  - Sets the number of SR-IOV virtual functions (VFs) of physical functions (PFs), such as NVIDIA GPUs
    before vGPU profiles are programmed on their VFs, or a network card.
  - Plans every selected PF first and writes nothing unless the whole plan is valid.
  - Changing an existing non-zero count (to zero, or to another count, which the kernel only allows
    through zero) destroys the existing VFs. The module refuses when a VM holds one of them or a prepared
    DRA claim uses one (under O(kubelet_dir)), and when one has a vGPU type or an mdev unless O(force=true).
  - Changed PFs are applied in parallel; the module then waits until C(sriov_numvfs) is right and every
    VF is ready (its C(virtfn) link exists; on NVIDIA GPUs also its C(nvidia/) directory or its
    C(mdev_supported_types)).
  - Only one apply runs on a node at a time; a second one waits for the node lock up to O(wait_timeout).
  - A PF passed through (an NVIDIA GPU bound to a driver other than C(nvidia), e.g. C(vfio-pci) for whole-GPU
    passthrough, or with no driver while C(nvidia) is loaded; any other PF bound to C(vfio-pci), C(pci-stub),
    C(pci-pf-stub) or to no driver) is never unbound, rebound or given VFs. V(all) and ID filters skip it
    (RV(reserved), and a warning each); listing its address is an error, unless O(take_over) lists it.
author:
  - accelops.vgpu contributors (@accelops)
extends_documentation_fragment:
  - accelops.vgpu.node_roots
attributes:
  check_mode:
    support: full
    description: Plans and reports the same RV(ignore:changed) as a real run, without writing anything.
  diff_mode:
    support: full
    description: Shows the VF count of every PF that changes, before and after.
options:
  devices:
    description:
      - Which PFs to configure.
      - V(all) selects every SR-IOV capable GPU (PCI base class 0x03). Network cards, NVMe drives and other
        devices are never selected by V(all); name them by address or ID filter.
      - Otherwise a list of PCI addresses (V(0000:41:00.0) or V(41:00.0)) and vendor/device filters, in the
        form of NVIDIA vgpu-device-manager (V(0x26B910DE)) or lspci (V(10de:26b9)). A filter selects every
        SR-IOV PF with that ID.
      - A filter that matches nothing is accepted as long as the list as a whole selects a PF, so one list
        can serve nodes with different GPUs. A list selecting nothing, an unknown address, a VF, a device
        without SR-IOV, or a device selected twice is an error.
    type: list
    elements: str
    default: [all]
  num_vfs:
    description:
      - Number of VFs per selected PF when O(state=present), or V(max) for each PF's C(sriov_totalvfs).
      - More than C(sriov_totalvfs) is an error. With C(sriov-manage), only V(max) (or the same number) is
        possible, because the tool always enables all VFs.
      - Ignored when O(state=absent).
    type: raw
    default: max
  state:
    description:
      - V(present) sets O(num_vfs) VFs; V(absent) disables all VFs.
    type: str
    choices: [present, absent]
    default: present
  method:
    description:
      - How to change the VF count.
      - V(sriov_manage) runs NVIDIA's C(sriov-manage -e|-d <PF>) (C(/usr/lib/nvidia/sriov-manage) or on
        C(PATH)), which also binds the VFs to the C(nvidia) driver. Its exit status is not trusted; the
        result is checked in sysfs and the tool is retried up to three times.
      - V(sysfs) writes C(sriov_numvfs), going through zero when a count changes.
      - V(auto) uses V(sriov_manage) for NVIDIA PFs when the tool is found, V(sysfs) otherwise.
      - Where the tool is looked for is set by O(sriov_manage_path).
    type: str
    choices: [auto, sysfs, sriov_manage]
    default: auto
  force:
    description:
      - Allow discarding vGPU types and mdevs of VFs that a change of the VF count destroys.
      - Never discards a VF that a VM holds open or a prepared DRA claim uses; that is always an error.
    type: bool
    default: false
  sriov_manage_path:
    description:
      - Absolute path of NVIDIA's C(sriov-manage).
      - Default (unset) finds C(/usr/lib/nvidia/sriov-manage), then C(sriov-manage) on C(PATH).
      - With the NVIDIA GPU Operator the host driver root is mounted at C(/run/nvidia/driver), so the tool is
        C(/run/nvidia/driver/usr/lib/nvidia/sriov-manage).
      - When set and NVIDIA PFs may use it (O(method) V(auto) or V(sriov_manage)), it must be an executable
        file, else the module fails naming it before any write.
    type: path
  take_over:
    description:
      - PCI addresses of PFs passed through (see the description) that the module may treat as its own
        anyway; C(sriov-manage) then rebinds such an NVIDIA GPU to C(nvidia) to enable its VFs.
      - Refused, before any write, while a process holds the PF's VFIO group (a passthrough VM) or one of its
        VFs, or a prepared DRA claim uses one.
    type: list
    elements: str
    default: []
  wait_timeout:
    description:
      - Seconds to wait for the node lock, and for the VFs of each PF to be ready after the change.
      - A PF that loses its driver (its C(driver) link vanishes, e.g. the NVIDIA driver is unloaded) while
        its VFs are enabled fails at once, naming it, instead of waiting out this timeout.
    type: int
    default: 120
notes:
  - Writes to C(sriov_numvfs) block while the kernel creates the VFs; on real GPUs this takes seconds per PF.
seealso:
  - module: accelops.vgpu.vgpu_facts
"""

EXAMPLES = r"""
- name: Enable all VFs on every SR-IOV GPU of the node
  accelops.vgpu.sriov_vfs:
    devices: all

- name: Enable the VFs of the L40S GPUs only
  accelops.vgpu.sriov_vfs:
    devices: ["0x26B910DE"]

- name: Eight VFs on a network card, through sysfs
  accelops.vgpu.sriov_vfs:
    devices: ["0000:61:00.0"]
    num_vfs: 8
    method: sysfs

- name: Disable the VFs of one GPU, discarding the vGPU profiles on them
  accelops.vgpu.sriov_vfs:
    devices: ["0000:41:00.0"]
    state: absent
    force: true

- name: Configure the host's GPUs from a privileged container that mounts the host at /host
  accelops.vgpu.sriov_vfs:
    devices: all
    sysfs_root: /host/sys
    dev_root: /host/dev
    proc_root: /host/proc

- name: Enable VFs on a GPU Operator node, whose host driver root is mounted at /run/nvidia/driver
  accelops.vgpu.sriov_vfs:
    devices: all
    sriov_manage_path: /run/nvidia/driver/usr/lib/nvidia/sriov-manage
"""

RETURN = r"""
pfs:
  description: One entry per selected PF, in address order, also when the apply failed.
  returned: when the selection is valid
  type: list
  elements: dict
  contains:
    address:
      description: PCI address of the PF.
      type: str
      sample: "0000:41:00.0"
    before:
      description: VF count before the run.
      type: dict
      sample: {num_vfs: 0}
    after:
      description: VF count after the run (or after a real run, in check mode).
      type: dict
      sample: {num_vfs: 32}
    method:
      description: How the count is changed, V(sysfs) or V(sriov_manage).
      type: str
      sample: sriov_manage
    changed:
      description: Whether the VF count of this PF changes.
      type: bool
      sample: true
    discarded_profiles:
      description: VFs whose vGPU type or mdev O(force) discards.
      type: list
      elements: str
      sample: []
reserved:
  description: PFs O(devices) selected (V(all) or a filter) that are passed through and were left alone.
  returned: when the selection is valid
  type: list
  elements: dict
  sample:
    - address: "0000:42:00.0"
      driver: vfio-pci
      reason: bound to vfio-pci, not to the vGPU host driver nvidia (reserved for whole-GPU passthrough)
  contains:
    driver:
      description: The driver it is bound to (null when none); C(address) is the PF's PCI address.
      type: str
    reason:
      description: Why it was left alone.
      type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.accelops.vgpu.plugins.module_utils.node import module_glue
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import pod_allocations
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import sriov


def main():
    module = AnsibleModule(
        argument_spec=module_glue.node_argspec(
            devices=dict(type="list", elements="str", default=["all"]),
            num_vfs=dict(type="raw", default="max"),
            state=dict(type="str", choices=["present", "absent"], default="present"),
            method=dict(type="str", choices=list(sriov.METHODS), default="auto"),
            force=dict(type="bool", default=False),
            sriov_manage_path=dict(type="path"),
            wait_timeout=dict(type="int", default=120),
            take_over=dict(type="list", elements="str", default=[]),
        ),
        supports_check_mode=True,
    )
    params = module.params
    node = module_glue.NodeContext(module)
    with module_glue.engine_errors(module) as result, node.apply_lock(params["wait_timeout"]):
        plan = sriov.plan_vfs(node.sysfs, node.runner, params["devices"], params["num_vfs"], params["state"],
                              params["method"], params["force"], held=node.holders(),
                              sriov_manage_path=params["sriov_manage_path"],
                              take_over=module_glue.addresses(params["take_over"], "take_over"),
                              whole=node.held_whole())
        result["pfs"] = plan.as_list()
        result["reserved"] = [s.to_dict() for s in plan.skipped]
        for skipped in plan.skipped:
            module.warn(skipped.line())
        if not module.check_mode:
            sriov.apply_vfs(node.sysfs, node.runner, plan, timeout=params["wait_timeout"],
                            record=pod_allocations.record_path(node.kubelet_dir))
    module_glue.exit_with_diff(module, plan.changed, plan.diff(), **result)


if __name__ == "__main__":
    main()
