#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: vgpu_profile
short_description: Program NVIDIA vGPU profiles on a GPU node, per VF or mdev, idempotently
version_added: 0.1.0
description:
  - Creates the vGPUs a layout asks for on the node's NVIDIA GPUs and removes the ones it does not.
  - Vendor-specific VFIO GPUs (vGPU 17+, Ada/Hopper/Blackwell) are typed per SR-IOV VF through
    C(nvidia/current_vgpu_type); legacy mdev GPUs (T4 on the PF, A2/A16 on each VF) get mdevs with
    deterministic UUIDs. The framework is detected per GPU.
  - Per-VF difference, not "clear all" - VFs that already have a wanted profile are kept, only
    unwanted vGPUs are cleared, free VFs are filled in VF order.
  - A vGPU that a VM holds (an open VFIO device node) or that a prepared DRA claim uses (under
    O(kubelet_dir)) is never changed; a layout that needs it changed fails naming it (the claim), before
    any write. The whole layout is validated before the first write.
  - VFs must be enabled first (M(accelops.vgpu.sriov_vfs)), or by this module with O(enable_vfs).
  - Can also install the files that re-apply the layout at boot (O(boot_files)) in the same run.
  - Takes the node's apply lock, shared with the other node modules and the node CLI.
extends_documentation_fragment:
  - accelops.vgpu.node_roots
options:
  config:
    description:
      - An NVIDIA vgpu-device-manager config (C(version=v1), C(vgpu-configs)) as data, unchanged from
        the files the GPU Operator uses. Read YAML files on the controller with
        C(lookup('ansible.builtin.file', 'vgpu.yaml') | from_yaml).
      - GPU indices in C(devices) count NVIDIA GPUs (not VFs) in PCI address order. An entry whose
        profiles a GPU does not offer is skipped for that GPU (so one config serves A2 and A16 boards
        with the same PCI ID); the last matching entry wins.
    type: dict
  config_file:
    description:
      - Path on the node of a vgpu-device-manager config or layout file in JSON (YAML only when
        PyYAML is installed on the node).
    type: path
  selected:
    description:
      - Name of the config in O(config) or O(config_file) to apply. Optional when there is only one.
    type: str
  layout:
    description:
      - The simple form - a list of entries, each selecting GPUs and naming profile counts per GPU.
    type: list
    elements: dict
    suboptions:
      devices:
        description:
          - V(all), or a list of PCI addresses of GPUs (PFs) and GPU indices.
        type: raw
        default: all
      device_filter:
        description:
          - Only GPUs with this PCI ID, C(0x26B910DE) (device, vendor) or C(10de:26b9); a list matches any.
        type: raw
      profiles:
        description:
          - Profile name (short C(L40S-24Q) or full C(NVIDIA L40S-24Q)) to the number of vGPUs per GPU.
        type: dict
        required: true
  mixed_size:
    description:
      - Allow profiles of different framebuffer sizes on one GPU. Without it such a layout fails
        before any write.
      - A GPU that gets different sizes is put into mixed-size (heterogeneous) mode with
        C(nvidia-smi vgpu -i <PF> -shm 1) unless C(nvidia-smi vgpu -i <PF> -ghm) reports it on. The
        driver switches the mode only on a GPU without vGPUs, so its existing vGPUs are cleared
        first and re-created after the switch; a vGPU a VM holds makes the task fail instead.
    type: bool
    default: false
  state:
    description:
      - V(present) programs the layout.
      - V(absent) removes every vGPU of the GPUs the layout selects, except those a VM holds
        (reported as warnings); profile counts are ignored.
    type: str
    choices: [present, absent]
    default: present
  lock_timeout:
    description:
      - Seconds to wait for the node's apply lock.
    type: float
    default: 120
  enable_vfs:
    description:
      - Enable the maximum number of SR-IOV VFs on selected GPUs that have none (what the node CLI's
        C(apply) does at boot), through the same engine as M(accelops.vgpu.sriov_vfs) with its method
        V(auto), verified in sysfs; then program the layout. The layout is checked against what such a
        GPU offers before its VFs are enabled (the driver's C(nvidia-smi vgpu -s), else the collection's
        GPU catalog, else the task fails), so a layout that cannot fit writes nothing.
      - GPUs that already have VFs keep their count; other VF counts, C(method=sysfs) and O(state=absent)
        for VFs are M(accelops.vgpu.sriov_vfs)'s.
      - Without it a selected GPU without VFs fails the task, naming it, before any write.
      - Also enables the VFs of a claim-time GPU (recorded by the node agent under O(kubelet_dir)) that has none,
        typing none of them (a reboot removes VFs; DRA claims type them); without it such a GPU only gets a warning.
    type: bool
    default: false
  wait_timeout:
    description:
      - With O(enable_vfs), seconds to wait for enabled VFs to be ready.
    type: float
    default: 120
  take_over:
    description:
      - A GPU passed through (bound to a driver other than C(nvidia), such as C(vfio-pci) for whole-GPU
        passthrough, or to none while C(nvidia) is loaded) is left alone; C(devices=all) and device filters
        skip it (RV(reserved), a warning each) and an entry naming it (address or index) fails before any write.
      - PCI addresses listed here are GPUs the module may take anyway; with O(enable_vfs), C(sriov-manage)
        rebinds such a GPU to C(nvidia). Refused, before any write, while a process holds its VFIO group (a
        passthrough VM) or a VF of it, or a prepared DRA claim uses one.
    type: list
    elements: str
    default: []
  sriov_manage_path:
    description:
      - With O(enable_vfs), the absolute path of NVIDIA's C(sriov-manage), for example
        C(/run/nvidia/driver/usr/lib/nvidia/sriov-manage) on GPU Operator nodes. Default finds C(/usr/lib/nvidia/sriov-manage),
        then C(sriov-manage) on C(PATH), else VFs are enabled through C(sriov_numvfs).
    type: path
  boot_files:
    description:
      - Files on the node that re-apply the layout at boot (the layout, the node CLI, the systemd unit),
        compared in the same run. A file is up to date when it is a regular file owned by root:root
        with the expected content and mode.
      - An entry with O(boot_files[].content), O(boot_files[].layout), O(boot_files[].node_cli) or O(boot_files[].unit) is installed by the module
        when it is missing or differs (after the layout is applied; not in check mode), written to a
        temporary file beside it and renamed over it, parent directories created with mode C(0755). An entry
        with only O(boot_files[].checksum) is looked at, never written (RV(boot_files_outdated)).
      - With O(state=absent) the listed files are removed (after the vGPUs), whatever their content.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: Absolute path on the node.
        type: path
        required: true
      mode:
        description: Mode, octal, as a string (V('0644')).
        type: str
        required: true
      content:
        description: The file's content (text, written as UTF-8).
        type: str
      layout:
        description:
          - The file is the layout this run applies, O(config) as JSON (4-space indent, sorted keys), what
            the node CLI reads at boot. Needs O(config).
        type: bool
        default: false
      node_cli:
        description:
          - The file is the node CLI C(accelops-vgpu), a zipapp built on the node from the engine this
            module runs (the same bytes C(tools/build-node-cli.py --without-agent) builds from the same
            collection), so no file is transferred. It carries the node engine alone (C(apply), C(assert),
            C(export), C(idle)); the node agent runs from its image (M(accelops.vgpu.agent_image)).
        type: bool
        default: false
      unit:
        description:
          - The file is the systemd unit C(accelops-vgpu.service) that re-applies the layout at boot and after
            every restart of the vGPU manager, built by the module - its C(ExecStart) is the node CLI's C(apply)
            with this run's O(selected), roots and options, reading the O(boot_files[].layout) entry's file with the
            O(boot_files[].node_cli) entry's CLI (both entries are needed, with node-absolute paths, and O(selected)).
          - "C(After=) and C(PartOf=) each vGPU manager unit and C(WantedBy=multi-user.target) and them (a restart of
            the manager re-applies the layout), C(Before=) the units that must not start before the layout is in place."
          - Its content is, byte for byte, what the C(accelops.vgpu.vgpu_profiles) role wrote when it templated the unit
            on the controller, so the nodes it converged keep their unit file - for values without characters
            systemd reads specially. Those are escaped for systemd (C(%%), C($$), double quotes with backslash
            escapes); a control character in any value, an O(selected) that is no vgpu-device-manager config name
            (letters, digits, C(-), C(_), C(.), at most 63) and an invalid unit name fail the task before any write.
        type: dict
        suboptions:
          manager_units:
            description: The vGPU manager's units.
            type: list
            elements: str
            default: [nvidia-vgpud.service, nvidia-vgpu-mgr.service]
          before_units:
            description: Units that start after the layout is applied (the kubelet publishes the devices).
            type: list
            elements: str
            default: [kubelet.service]
          retry_for:
            description:
              - Seconds the boot apply retries while it fails (the vGPU manager not ready yet), with backoff;
                C(TimeoutStartSec) is 300 s more.
            type: int
            default: 300
          agent_applied:
            description:
              - The node agent's handover file - while it exists the unit applies it instead of O(selected).
            type: path
            default: /etc/accelops-vgpu/agent-applied.json
          state_file:
            description: Where the unit records its last outcome (applied, retrying, failed).
            type: path
            default: /run/accelops-vgpu/boot-state.json
      checksum:
        description: Only look at the file - SHA-1 (hex) of its expected content.
        type: str
      own_directory:
        description: When the file is removed (O(state=absent), or O(boot_files[].remove)), also remove its directory once it is empty.
        type: bool
        default: false
      remove:
        description:
          - The file is removed where it exists, with either O(state) (after the layout is applied, before the other
            files are installed; not in check mode), and reported in RV(boot_files_removed) - a file that must not stay, such as the node agent's
            C(agent-applied.json) when a play takes the node back. Takes none of O(boot_files[].content),
            O(boot_files[].layout), O(boot_files[].node_cli), O(boot_files[].unit), O(boot_files[].checksum); O(boot_files[].mode) is required all the
            same and not used.
          - A path may be named once in O(boot_files).
        type: bool
        default: false
  boot_files_root:
    description:
      - Install (and remove) the O(boot_files) below this directory instead of the node's C(/) - a chroot, an image
        root, a simulated node. Their paths as given, and those written into the unit, stay node-absolute;
        the paths returned are where the files are.
      - An absolute path; missing, it is created (mode C(0755)) - a path that is not a directory fails the module
        before anything is written.
    type: path
    default: /
  boot_unit:
    description:
      - The systemd unit among O(boot_files) that re-applies the layout at boot (C(accelops-vgpu.service)).
      - With O(state=present), after the files - C(systemctl daemon-reload) when a boot file was written in
        this run, C(enable) unless C(is-enabled) says C(enabled), C(start) unless C(is-active) says
        C(active) (an active unit is not restarted). With O(state=absent), before the files are removed -
        C(stop) while active, C(disable) while enabled; C(daemon-reload) after the removal.
      - C(is-enabled) and C(is-active) only read, so check mode asks them too and reports the same actions.
      - Unset, systemd is left alone (containers, image builds).
    type: str
  publish_facts:
    description:
      - Also return RV(gpus) and RV(resources) as the host facts C(vgpu_profiles_gpus) and
        C(vgpu_profiles_resources) (what the C(accelops.vgpu.vgpu_profiles) role publishes for the
        cluster roles; cached where a fact cache is configured), so no C(set_fact) task is needed.
    type: bool
    default: false
  mig_mode_order:
    description:
      - MIG-backed profiles (C(H100-1-20C), C(H200X-3-71C); Hopper) put the GPU into MIG mode, create one
        MIG GPU instance per vGPU, then type the VFs. Mixing them with time-sliced profiles on one GPU
        is refused.
      - A time-sliced layout on a GPU in MIG mode takes it out of MIG mode in the same run - vGPUs cleared,
        GPU instances destroyed, VFs disabled, C(nvidia-smi -i <PF> -mig 0), as many VFs enabled again,
        then the types set, each step verified (diff and check mode show it as one change). Refused before
        any write while a VM holds a VF of that GPU.
      - V(after-vfs) sets MIG mode (C(nvidia-smi -i <PF> -mig 1)) once the VFs exist; V(before-vfs) sets it
        before the VFs are enabled, which only applies where this run enables them (the node CLI). Which
        order the driver needs is unconfirmed (docs/design.md).
    type: str
    choices: [after-vfs, before-vfs]
    default: after-vfs
  mig_compute_instances:
    description:
      - Create a compute instance in every new GPU instance (C(nvidia-smi mig -cgi <IDs> -C)), as
        mig-parted does. Whether MIG-backed vGPUs need one on the host is unconfirmed.
    type: bool
    default: true
  mig_gi_cleanup:
    description:
      - V(destroy) removes GPU instances the layout no longer needs (their compute instance first);
        V(keep) leaves them. A GPU instance a kept vGPU occupies is never touched.
    type: str
    choices: [destroy, keep]
    default: destroy
attributes:
  check_mode:
    support: full
    description:
      - Plans and validates everything, writes nothing, reports the same C(changed) (also where VFs
        are still to be enabled, and for boot files that would be installed).
  diff_mode:
    support: full
    description:
      - Per GPU, per VF (or parent/mdev UUID) the profile before and after (C(vfs) C(disabled) ->
        C(enabled) and the profiles, where O(enable_vfs) enables them); for MIG-backed layouts also
        C(mig) with the MIG mode and the GPU instances before and after; C(boot_files) with each
        outdated file's SHA-1 before and after (null when missing).
notes:
  - Resource names follow Harvester, C(nvidia.com/) plus the full type name with whitespace, C(/) and
    C(.) replaced by C(_).
seealso:
  - module: accelops.vgpu.sriov_vfs
author:
  - accelops.vgpu contributors (@accelops)
"""

EXAMPLES = r"""
- name: Two L40S-24Q per L40S
  accelops.vgpu.vgpu_profile:
    layout:
      - device_filter: "0x26B910DE"
        profiles:
          L40S-24Q: 2

- name: Apply the 'default' config of a vgpu-device-manager file kept next to the playbook
  accelops.vgpu.vgpu_profile:
    config: "{{ lookup('ansible.builtin.file', 'vgpu-configs.yaml') | from_yaml }}"
    selected: default

- name: Mixed sizes on the first GPU
  accelops.vgpu.vgpu_profile:
    layout:
      - devices: ["0000:41:00.0"]
        profiles: {L40S-24Q: 1, L40S-12Q: 2}
    mixed_size: true

- name: Four MIG-backed H100-1-20C per H100 (MIG mode, four 1g.20gb GPU instances, four VFs)
  accelops.vgpu.vgpu_profile:
    config:
      version: v1
      vgpu-configs:
        h100-4x20:
          - devices: all
            device-filter: "0x233110DE"
            vgpu-devices: {"H100-1-20C": 4}
    selected: h100-4x20

- name: Enable the VFs where needed, program two L40S-24Q per GPU, install the boot re-apply files
  accelops.vgpu.vgpu_profile:
    config: "{{ vdm_config }}"
    selected: l40s-2x24q
    enable_vfs: true
    boot_files:
      - {path: /etc/accelops-vgpu/layout.json, mode: "0644", layout: true}
      - {path: /usr/local/bin/accelops-vgpu, mode: "0755", node_cli: true}
      - {path: /etc/systemd/system/accelops-vgpu.service, mode: "0644", unit: {before_units: [kubelet.service]}}
    boot_unit: accelops-vgpu.service

- name: Remove every vGPU no VM uses
  accelops.vgpu.vgpu_profile:
    layout: [{profiles: {}}]
    state: absent
"""

RETURN = r"""
gpus_changed:
  description:
    - When a VF or mdev became held by a VM after the plan (rescanned before each GPU's first write), the GPUs
      (PF addresses) already changed before the task failed.
  returned: on that failure
  type: list
  elements: str
  sample: ["0000:41:00.0"]
gpus_not_changed:
  description: On the same failure, the GPUs not written (the one whose VF became held, and those after it).
  returned: on that failure
  type: list
  elements: str
  sample: ["0000:42:00.0"]
gpus:
  description: One entry per GPU (PF) the layout selects, with every vGPU slot before and after.
  returned: always
  type: list
  elements: dict
  sample:
    - address: "0000:41:00.0"
      model: L40S
      framework: vendor-vfio
      pci_id: "10de:26b9"
      vgpus:
        - {address: "0000:41:00.4", before: null, after: L40S-24Q, type_id: 1155}
  contains:
    mig:
      description:
        - Only on GPUs with MIG-backed profiles, the MIG state after the task ran.
        - C(mode) (V(enabled)) and C(gpu_instances), the GPU instance profile names (V(1g.20gb)), one per vGPU.
      returned: when the GPU has MIG-backed profiles
      type: dict
reserved:
  description:
    - GPUs the layout selected (V(all) or a device filter) that are passed through and were left alone, each with
      C(address), C(driver) (the one it is bound to, null when none) and C(reason), as in
      M(accelops.vgpu.sriov_vfs)'s RV(accelops.vgpu.sriov_vfs#module:reserved).
  returned: always
  type: list
  elements: dict
  sample: [{address: "0000:42:00.0", driver: vfio-pci, reason: "bound to vfio-pci, not to the vGPU host driver nvidia"}]
resources:
  description: One entry per profile in use on the selected GPUs, what KubeVirt needs to expose it.
  returned: always
  type: list
  elements: dict
  sample:
    - profile: L40S-24Q
      type_name: NVIDIA L40S-24Q
      resource_name: nvidia.com/NVIDIA_L40S-24Q
      pci_vendor_selector: "10DE:26B9"
      framework: vendor-vfio
      count: 2
boot_files_outdated:
  description: The paths of O(boot_files) that were missing or differed in content, mode or owner when the module looked.
  returned: always
  type: list
  elements: str
  sample: ["/etc/accelops-vgpu/layout.json"]
boot_files_installed:
  description: The paths of O(boot_files) the module wrote (in check mode, would write).
  returned: always
  type: list
  elements: str
  sample: ["/etc/accelops-vgpu/layout.json"]
boot_files_removed:
  description:
    - The paths of O(boot_files) the module removed (in check mode, would remove) - every one that existed with
      O(state=absent), those with O(boot_files[].remove) with O(state=present).
  returned: always
  type: list
  elements: str
  sample: ["/etc/systemd/system/accelops-vgpu.service"]
boot_unit_actions:
  description: The C(systemctl) commands run for O(boot_unit) (in check mode, that would run), in order.
  returned: always
  type: list
  elements: str
  sample: ["systemctl daemon-reload", "systemctl enable accelops-vgpu.service", "systemctl start accelops-vgpu.service"]
ansible_facts:
  description: With O(publish_facts), RV(gpus) and RV(resources) as host facts.
  returned: when O(publish_facts) is true
  type: dict
  contains:
    vgpu_profiles_gpus:
      description: RV(gpus).
      type: list
      elements: dict
    vgpu_profiles_resources:
      description: RV(resources).
      type: list
      elements: dict
vfs_enabled:
  description:
    - The GPUs (PF addresses) whose VFs this run enabled (empty in check mode) - by O(enable_vfs), or again
      after taking the GPU out of MIG mode (see O(mig_mode_order)).
  returned: always
  type: list
  elements: str
  sample: ["0000:41:00.0"]
"""

import os

from ansible.module_utils.basic import AnsibleModule
# first: the collection files imported after it are compiled once, not twice (see payload_imports.py)
from ansible_collections.accelops.vgpu.plugins.module_utils import payload_imports  # noqa: F401  pylint: disable=unused-import
from ansible_collections.accelops.vgpu.plugins.module_utils import cli_zipapp
from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout import vgpu_layout
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import mig, vgpu_apply
from ansible_collections.accelops.vgpu.plugins.module_utils.node.boot import boot_entries, boot_files, boot_unit, boot_unit_file, handover
from ansible_collections.accelops.vgpu.plugins.module_utils.node.module_glue import (
    NodeContext, addresses, engine_errors, exit_with_diff, node_argspec)

LAYOUT_ENTRY = dict(devices=dict(type="raw", default="all"), device_filter=dict(type="raw"),
                    profiles=dict(type="dict", required=True))
UNIT = dict(manager_units=dict(type="list", elements="str", default=list(boot_unit_file.MANAGER_UNITS)),
            before_units=dict(type="list", elements="str", default=list(boot_unit_file.BEFORE_UNITS)),
            retry_for=dict(type="int", default=boot_unit_file.RETRY_FOR),
            agent_applied=dict(type="path", default=os.path.join(handover.NODE_DIR, handover.FILE_NAME)),
            state_file=dict(type="path", default=boot_unit_file.STATE_FILE))
BOOT_FILE = dict(path=dict(type="path", required=True), mode=dict(type="str", required=True),
                 content=dict(type="str"), layout=dict(type="bool", default=False),
                 node_cli=dict(type="bool", default=False), unit=dict(type="dict", options=UNIT),
                 checksum=dict(type="str"),
                 own_directory=dict(type="bool", default=False), remove=dict(type="bool", default=False))


def main():
    module = AnsibleModule(
        argument_spec=node_argspec(
            config=dict(type="dict"), config_file=dict(type="path"), selected=dict(type="str"),
            layout=dict(type="list", elements="dict", options=LAYOUT_ENTRY),
            mixed_size=dict(type="bool", default=False), lock_timeout=dict(type="float", default=120.0),
            state=dict(type="str", default="present", choices=["present", "absent"]),
            enable_vfs=dict(type="bool", default=False), wait_timeout=dict(type="float", default=vgpu_apply.WAIT_TIMEOUT),
            sriov_manage_path=dict(type="path"), publish_facts=dict(type="bool", default=False),
            take_over=dict(type="list", elements="str", default=[]),
            boot_unit=dict(type="str"), boot_files_root=dict(type="path", default="/"),
            boot_files=dict(type="list", elements="dict", options=BOOT_FILE, default=[]),
            mig_mode_order=dict(type="str", default="after-vfs", choices=list(mig.MODE_ORDERS)),
            mig_compute_instances=dict(type="bool", default=True),
            mig_gi_cleanup=dict(type="str", default="destroy", choices=list(mig.GI_CLEANUPS))),
        mutually_exclusive=[("config", "config_file", "layout")],
        required_one_of=[("config", "config_file", "layout")],
        supports_check_mode=True)
    params = module.params
    node = NodeContext(module)
    present = params["state"] == "present"
    with engine_errors(module):
        files = boot_entries.entries(params["boot_files"], params, cli_zipapp.shipped, present)
        if present:
            boot_files.validate(files)  # bad input writes nothing
        else:
            boot_files.validate_removal(files)
        if params["config_file"]:
            entries = vgpu_layout.from_file(params["config_file"], params["selected"])
        else:
            entries = vgpu_layout.entries(params["config"], params["selected"], params["layout"])
        options = mig.MigOptions(params["mig_mode_order"], params["mig_compute_instances"], params["mig_gi_cleanup"])
        engine = vgpu_apply.NodeEngine(node.sysfs, node.runner, node.dev_root, node.proc_root,
                                       sriov_manage_path=params["sriov_manage_path"], mig_options=options,
                                       kubelet_dir=node.kubelet_dir,
                                       take_over=addresses(params["take_over"], "take_over"))
        result = vgpu_apply.apply(engine, entries,
                                  state=params["state"], mixed_size=params["mixed_size"],
                                  check_mode=module.check_mode, lock_timeout=params["lock_timeout"],
                                  enable_vfs=params["enable_vfs"], wait_timeout=params["wait_timeout"])
        boot = boot_unit.converge(node.runner, params["boot_unit"], files, present, module.check_mode)
    for warning in result["warnings"]:
        module.warn(warning)
    diff = result["diff"]
    if boot["diff"]["before"] or boot["diff"]["after"]:
        diff["before"]["boot_files"], diff["after"]["boot_files"] = boot["diff"]["before"], boot["diff"]["after"]
    fields = dict(boot_files_outdated=boot["outdated"], boot_files_installed=boot["installed"],
                  boot_files_removed=boot["removed"], boot_unit_actions=boot["actions"])
    if params["publish_facts"]:
        fields["ansible_facts"] = {"vgpu_profiles_gpus": result["gpus"], "vgpu_profiles_resources": result["resources"]}
    exit_with_diff(module, result["changed"] or boot["changed"], diff, gpus=result["gpus"], resources=result["resources"],
                   vfs_enabled=result["vfs_enabled"], reserved=result["reserved"], **fields)


if __name__ == "__main__":
    main()
