#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: vgpu_driver
short_description: Install, upgrade or remove the NVIDIA vGPU manager (host driver) from its runfile
version_added: 0.1.0
description:
  - Detects the NVIDIA host driver and installs or upgrades the vGPU manager from an
    C(NVIDIA-Linux-<arch>-<version>-vgpu-kvm.run) (or C(...-vgpu-kvm-aie.run)) runfile that is already on the node.
  - The installed version is read from C(<sysfs_root>/module/nvidia/version) when the C(nvidia) module is loaded,
    else from C(modinfo -F version nvidia). The driver counts as the vGPU-manager flavour when C(nvidia_vgpu_vfio)
    is loaded or the C(nvidia-vgpu-mgr) daemon is installed; any other driver (also of the same version) is replaced.
  - A runfile is accepted only when its name matches the pattern above, it starts with a makeself shell header,
    and its C(--version) output reports the version in its name. Otherwise the module fails before changing anything.
  - An install or upgrade stops the vGPU services, unloads C(nvidia_vgpu_vfio) and C(nvidia), runs the runfile
    non-interactively (C(--ui=none --no-questions --silent), plus C(--dkms) and O(installer_args)), loads the
    modules again and enables and starts the services. This takes the vGPU from every running VM, so
    before the first stop (install, upgrade and V(absent)) the module refuses, naming each holder, while a VM holds
    a VF or mdev of an NVIDIA GPU or C(nvidia_vgpu_vfio) has users (or when it cannot tell); stop or migrate the
    VMs first.
  - An install also refuses before any change when the running kernel's build tree
    (C(<modules_dir>/<release>/build), release from C(<proc_root>/sys/kernel/osrelease)) is missing, unless
    O(installer_args) names C(--kernel-source-path), and when O(dkms) is set but C(dkms) is not installed.
  - When a step fails after the first stop (a module still in use, the installer failing), the module restores
    what ran before (loads the modules that were loaded, starts the services that were active), reads the node
    again, and fails with one line naming the failed step and what was restored or is still missing.
  - Without a version change it only repairs the nouveau blacklist, loads missing modules and starts stopped services.
author:
  - accelops.vgpu contributors (@accelops)
options:
  state:
    description:
      - V(present) installs or upgrades the driver from O(runfile); V(absent) stops the services, unloads the
        modules and uninstalls the driver (with O(runfile) C(--uninstall) when given, else C(nvidia-uninstall)).
      - V(absent) leaves the nouveau blacklist file in place.
    type: str
    choices: [present, absent]
    default: present
  runfile:
    description:
      - Path of the vGPU-KVM runfile on the node. Required with O(state=present).
    type: path
  dkms:
    description:
      - Build the kernel modules with DKMS (C(--dkms)), so kernel updates rebuild them.
    type: bool
    default: false
  allow_downgrade:
    description:
      - Install a runfile older than the installed driver. Without it a downgrade fails.
    type: bool
    default: false
  installer_args:
    description:
      - Extra arguments for the runfile, appended after the non-interactive flags, for example C(--no-drm).
    type: list
    elements: str
    default: []
  blacklist_nouveau:
    description:
      - Write C(<modprobe_dir>/accelops-vgpu-blacklist-nouveau.conf) (mode 0644) that blacklists nouveau.
        A loaded nouveau module still needs a reboot.
    type: bool
    default: true
  modprobe_dir:
    description:
      - Directory for the blacklist file.
    type: path
    default: /etc/modprobe.d
  load_modules:
    description:
      - Load C(nvidia) and C(nvidia_vgpu_vfio) with C(modprobe) (after an install, and whenever one is not loaded),
        and check that the kernel then runs the runfile's version.
    type: bool
    default: true
  manage_services:
    description:
      - Enable and start O(services) with C(systemctl). Set to V(false) where there is no systemd (containers).
    type: bool
    default: true
  services:
    description:
      - The vGPU manager's systemd units.
    type: list
    elements: str
    default: [nvidia-vgpud.service, nvidia-vgpu-mgr.service]
  sysfs_root:
    description:
      - Directory that holds the node's sysfs (C(/host/sys) in a container, a simulated node in tests).
      - A directory that does not exist or has no C(bus/pci/devices) below it fails the task.
    type: path
    default: /sys
  proc_root:
    description:
      - Directory that holds the node's procfs; loaded modules are read from C(<proc_root>/modules), the running
        kernel from C(<proc_root>/sys/kernel/osrelease), the processes that hold VFIO devices from
        C(<proc_root>/<pid>/fd).
      - A directory that does not exist fails the task.
    type: path
    default: /proc
  dev_root:
    description:
      - Directory that holds the node's C(/dev) (VFIO device nodes VMs hold).
      - A directory that does not exist fails the task.
    type: path
    default: /dev
  kubelet_dir:
    description:
      - The kubelet's root directory (its C(--root-dir)). A vGPU that a DRA claim prepared there by the
        C(vgpu.accelops.io) driver uses counts as in use (the claim's VM may start any moment), so the driver is not
        stopped while one is prepared. Set it where the kubelet keeps another directory (k0s, MicroK8s).
      - When not set, C(/var/lib/kubelet), which may be absent. A directory that is set must exist, or the task fails.
    type: path
  modules_dir:
    description:
      - The node's C(/lib/modules); an install needs C(<modules_dir>/<running kernel>/build) (the kernel headers).
    type: path
    default: /lib/modules
  lock_timeout:
    description:
      - Seconds to wait for the node's apply lock, which the SR-IOV and profile modules take too.
    type: float
    default: 120.0
notes:
  - Check mode runs only read-only commands (C(<runfile> --version), C(modinfo), C(systemctl is-enabled/is-active)).
  - Diff mode shows the driver before and after (version, flavour, loaded modules, services), the planned actions
    and the restore a failure after the first stop would run (RV(on_failure)).
attributes:
  check_mode:
    support: full
    description: Runs only read-only commands and reports the same RV(ignore:changed) and RV(actions) as a real run.
  diff_mode:
    support: full
    description: Shows version, flavour, loaded modules and service states before and after, plus the planned actions.
"""

EXAMPLES = r"""
- name: Install or upgrade the vGPU manager
  accelops.vgpu.vgpu_driver:
    runfile: /root/NVIDIA-Linux-x86_64-570.124.03-vgpu-kvm.run
    dkms: true

- name: Remove it
  accelops.vgpu.vgpu_driver:
    state: absent
"""

RETURN = r"""
version:
  description: Driver version after the run (null after V(absent)).
  returned: always
  type: str
  sample: 570.124.03
previous_version:
  description: Driver version found before the run (loaded or installed), null when none.
  returned: always
  type: str
  sample: 550.54.16
on_failure:
  description: What a failure after the first stop restores, in order (empty when the run stops nothing).
  returned: always
  type: list
  elements: str
  sample: ["load nvidia", "load nvidia_vgpu_vfio", "start nvidia-vgpud.service", "start nvidia-vgpu-mgr.service"]
runfile_version:
  description: Version of O(runfile), null without one.
  returned: always
  type: str
actions:
  description: What the run did (or would do in check mode), in order.
  returned: always
  type: list
  elements: str
  sample: ["blacklist nouveau in /etc/modprobe.d/accelops-vgpu-blacklist-nouveau.conf", "install 570.124.03 from
    NVIDIA-Linux-x86_64-570.124.03-vgpu-kvm.run", "load nvidia", "load nvidia_vgpu_vfio"]
"""

from contextlib import nullcontext

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.accelops.vgpu.plugins.module_utils.node.module_glue import engine_errors, exit_with_diff
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders.node_lock import node_lock
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine.nvdriver import DEFAULT_SERVICES, DriverManager
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders.roots import check_kubelet_dir, check_roots
from ansible_collections.accelops.vgpu.plugins.module_utils.runner import FunctionRunner


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", choices=["present", "absent"], default="present"),
            runfile=dict(type="path"),
            dkms=dict(type="bool", default=False),
            allow_downgrade=dict(type="bool", default=False),
            installer_args=dict(type="list", elements="str", default=[]),
            blacklist_nouveau=dict(type="bool", default=True),
            modprobe_dir=dict(type="path", default="/etc/modprobe.d"),
            load_modules=dict(type="bool", default=True),
            manage_services=dict(type="bool", default=True),
            services=dict(type="list", elements="str", default=list(DEFAULT_SERVICES)),
            sysfs_root=dict(type="path", default="/sys"),
            proc_root=dict(type="path", default="/proc"),
            dev_root=dict(type="path", default="/dev"),
            modules_dir=dict(type="path", default="/lib/modules"),
            kubelet_dir=dict(type="path"),
            lock_timeout=dict(type="float", default=120.0),
        ),
        required_if=[("state", "present", ["runfile"])],
        supports_check_mode=True,
    )
    params = module.params
    with engine_errors(module) as result:
        check_roots(params["sysfs_root"], params["dev_root"], params["proc_root"])
        manager = DriverManager(FunctionRunner(module.run_command), params["sysfs_root"], params["modprobe_dir"],
                                params["proc_root"], params["dev_root"], params["modules_dir"],
                                check_kubelet_dir(params["kubelet_dir"]))
        # one writer per node: the driver swap must not race a profile or VF apply
        with node_lock(params["sysfs_root"], params["lock_timeout"]) if not module.check_mode else nullcontext():
            result.update(manager.apply(params, check_mode=module.check_mode))
    before, after = result.pop("before"), result.pop("after")
    after = dict(after, actions=result["actions"], on_failure=result["on_failure"])
    exit_with_diff(module, result.pop("changed"), {"before": before, "after": after}, **result)


if __name__ == "__main__":
    main()
