"""A simulated GPU node in a known, partly used state, and the engine calls the modules make on it.

    l40s:3,t4:1,nic:1,nvme:1   PFs 0000:41:00.0 .. 0000:46:00.0 (see tests/gpusim/README.md)
    0000:41:00.0  L40S, 32 VFs, VFs .4 and .5 are L40S-24Q, VF 0000:41:00.4 held by a VM
    0000:42:00.0  L40S, 32 VFs, VF .4 is L40S-48Q
    0000:43:00.0  L40S, 32 VFs, no vGPU
    0000:44:00.0  T4 (mdev on the PF), 0000:45:00.0 X710 NIC (0 VFs), 0000:46:00.0 NVMe (no SR-IOV)

The `run_*` functions take the same path as the modules (node lock, plan, then apply), so an input
the planner wrongly accepts shows up as writes in the gpusim log.
"""

from __future__ import annotations

import os

from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw import vgpu_types
from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout import vgpu_layout
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import sriov, vgpu_apply
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders.node_lock import node_lock
from ansible_collections.accelops.vgpu.plugins.module_utils.runner import CommandRunner
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import Sysfs

SPEC = "l40s:3,t4:1,nic:1,nvme:1"
PF_HELD, PF_FREE, PF_EMPTY, PF_T4, PF_NIC, PF_NVME = (
    "0000:41:00.0", "0000:42:00.0", "0000:43:00.0", "0000:44:00.0", "0000:45:00.0", "0000:46:00.0")
HELD_VF, SECOND_VF, TYPED_VF = "0000:41:00.4", "0000:41:00.5", "0000:42:00.4"
INITIAL_LAYOUT = [{"devices": [PF_HELD], "profiles": {"L40S-24Q": 2}},
                  {"devices": [PF_FREE], "profiles": {"L40S-48Q": 1}},
                  {"devices": [PF_EMPTY], "profiles": {}}]
LOCK_TIMEOUT = 10.0


class Lab:
    """The engine objects on one gpusim node (its fake tools must be first on PATH)."""

    def __init__(self, node, cache_dir):
        self.node = node
        self.sysfs = Sysfs(node.root)
        self.runner = CommandRunner(timeout=60)
        self.engine = vgpu_apply.NodeEngine(self.sysfs, self.runner, node.dev_root, "/proc", cache_dir=str(cache_dir))

    def prepare(self):
        """Enable VFs, program INITIAL_LAYOUT, let a VM hold HELD_VF; then an empty write log."""
        run_layout(self, layout=INITIAL_LAYOUT, enable_vfs=True)
        self.node.hold(HELD_VF)
        self.node.clear_log()
        return self

    def restore(self):
        """Back to INITIAL_LAYOUT after a case that wrote (a bug); the held VF keeps its type."""
        run_layout(self, layout=INITIAL_LAYOUT, mixed_size=True)
        self.node.clear_log()

    def vgpu_type(self, vf):
        return vgpu_types.read_current(self.sysfs, vf)

    def attempts(self):
        """Every write attempt the simulated kernel saw (ok or refused)."""
        return self.node.log()


def environment(node):
    """Variables the engine needs in-process: GPUSIM_ROOT and the fake tools first on PATH."""
    return {"GPUSIM_ROOT": node.env["GPUSIM_ROOT"], "PATH": node.env["PATH"]}


def run_sriov(lab, devices="all", num_vfs="max", state="present", method="auto", force=False):
    """What accelops.vgpu.sriov_vfs does (real run)."""
    with node_lock(lab.sysfs.root, LOCK_TIMEOUT):
        plan = sriov.plan_vfs(lab.sysfs, lab.runner, devices, num_vfs, state, method, force, held=lab.engine.held)
        return sriov.apply_vfs(lab.sysfs, lab.runner, plan, timeout=10, retries=2, retry_delay=0.1)


def run_layout(lab, config=None, selected=None, layout=None, mixed_size=False, state="present", enable_vfs=False):
    """What accelops.vgpu.vgpu_profile does with config/layout (enable_vfs: the node CLI's apply)."""
    entries = vgpu_layout.entries(config, selected, layout)
    return vgpu_apply.apply(lab.engine, entries, state=state, mixed_size=mixed_size, lock_timeout=LOCK_TIMEOUT,
                            enable_vfs=enable_vfs)


def run_config_file(lab, path, selected=None, files=None, tmp_path=None):
    """What accelops.vgpu.vgpu_profile does with config_file; `files` are written below tmp_path first."""
    for name, content in (files or {}).items():
        with open(os.path.join(str(tmp_path), name), "w", encoding="utf-8") as handle:
            handle.write(content)
    real = path.format(tmp=tmp_path)
    entries = vgpu_layout.from_file(real, selected)
    return vgpu_apply.apply(lab.engine, entries, lock_timeout=LOCK_TIMEOUT)


RUNNERS = {"sriov": run_sriov, "layout": run_layout, "config_file": run_config_file}
