"""Holders the node sees only by what the kernel says (issue 25), on gpusim: a VM that opens a VF
while the apply waits (the agent's operand wait), or between two GPUs; a holder in its own mount
namespace that opened the node through a path the scanner does not have; a holder the scanner may
not inspect. Every failure names the VF and writes nothing to the GPU it holds (0 writes)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw import vgpu_types
from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout import vgpu_layout
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import vgpu_apply
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import Sysfs
from ansible_collections.accelops.vgpu.tests.reliability import cli_runs, node_lab
from ansible_collections.accelops.vgpu.tests.reliability.assertions import one_line_naming
from ansible_collections.accelops.vgpu.tests.reliability.module_runs import run_module
from ansible_collections.accelops.vgpu.tests.integration.vfio_holders import (  # pylint: disable=unused-import
    NEEDS_ROOT, NO_PTRACE, vfio_holders)  # noqa: F401 (vfio_holders is a fixture)

PF1, PF2 = "0000:41:00.0", "0000:42:00.0"
TYPED = "0000:41:00.4"                      # L40S-12Q after START
START = [{"devices": [PF1], "profiles": {"L40S-12Q": 1}}, {"devices": [PF2], "profiles": {}}]
TARGET = [{"devices": "all", "profiles": {"L40S-24Q": 2}}]   # clears TYPED, types .4/.5 on both GPUs
needs_root = NEEDS_ROOT


@pytest.fixture
def lab(gpusim_node, monkeypatch, tmp_path):
    node = gpusim_node("l40s:2")
    for name, value in node_lab.environment(node).items():
        monkeypatch.setenv(name, value)
    lab = node_lab.Lab(node, tmp_path)
    node_lab.run_layout(lab, layout=START, enable_vfs=True)
    node.clear_log()
    return lab


def gpu_writes(lab, pf):
    bus = pf.split(":")[1]
    return [e for e in lab.attempts() if e["path"].startswith("bus/pci/devices/0000:%s:" % bus)]


def test_a_vm_that_opens_a_vf_during_the_wait_before_changes_stops_the_apply_before_any_write(
        lab, vfio_holders, failure_writes):
    # the agent's before_changes pauses the operands and waits: a virt-launcher opens TYPED meanwhile
    with pytest.raises(vgpu_apply.HeldSincePlan) as caught:
        vgpu_apply.apply(lab.engine, vgpu_layout.from_layout(TARGET), lock_timeout=10,
                         before_changes=lambda: vfio_holders(lab.node, TYPED))
    message = str(caught.value)
    one_line_naming(message, TYPED)
    assert "nothing was written to GPU %s" % PF1 in message and "changed: none" in message
    assert failure_writes.gpusim(lab.node, what="writes after a VF became held during the wait") == []
    assert vgpu_types.read_current(lab.sysfs, TYPED) == 1153       # still L40S-12Q


class HoldAfter(Sysfs):
    """Sysfs whose n-th successful write starts a VM on `vf` (between two GPUs' changes)."""

    def __init__(self, node, nth, start):
        super().__init__(node.root)
        self.nth, self.start = nth, start

    def write(self, rel, value):
        super().write(rel, value)
        if self.writes == self.nth:
            self.start()


def test_a_vm_that_opens_a_vf_of_the_next_gpu_stops_that_gpu_before_its_first_write(
        lab, vfio_holders, failure_writes, tmp_path):
    pf2_vf = "0000:42:00.4"
    # PF1: clear .4, set .4 and .5 (3 writes); then PF2 would set .4 and .5
    sysfs = HoldAfter(lab.node, 3, lambda: vfio_holders(lab.node, pf2_vf))
    lab.engine = vgpu_apply.NodeEngine(sysfs, lab.runner, lab.node.dev_root, "/proc", cache_dir=str(tmp_path))
    with pytest.raises(vgpu_apply.HeldSincePlan) as caught:
        node_lab.run_layout(lab, layout=TARGET)
    one_line_naming(str(caught.value), pf2_vf)
    assert caught.value.done == [PF1] and caught.value.not_done == [PF2]
    assert caught.value.result == {"changed": True, "gpus_changed": [PF1], "gpus_not_changed": [PF2]}
    assert "changed: %s; not changed: %s" % (PF1, PF2) in str(caught.value)
    on_pf2 = failure_writes.gpusim(lab.node, keep=lambda e: e in gpu_writes(lab, PF2),
                                   what="writes to %s after its VF became held" % PF2)
    assert on_pf2 == [] and len(gpu_writes(lab, PF1)) == 3


@needs_root
def test_a_holder_in_its_own_mount_namespace_is_seen_through_the_modules_engine(
        lab, vfio_holders, failure_writes, tmp_path):
    holder = vfio_holders(lab.node, TYPED, alias=str(tmp_path / "alias"))
    target = holder.fd_target()
    assert target.startswith(str(tmp_path / "alias")) and not os.path.exists(target)  # only in its namespace
    with pytest.raises(vgpu_layout.LayoutError) as caught:
        node_lab.run_layout(lab, layout=TARGET)
    one_line_naming(str(caught.value), TYPED)
    assert "pid %d" % holder.pid in str(caught.value)
    assert failure_writes.gpusim(lab.node, what="writes while a VM in another mount namespace held %s" % TYPED) == []


@pytest.fixture(scope="module")
def pyz(tmp_path_factory):
    return cli_runs.build(tmp_path_factory.mktemp("node-cli"))


@needs_root
def test_a_holder_in_its_own_mount_namespace_is_seen_through_the_cli(lab, vfio_holders, pyz, tmp_path, failure_writes):
    vfio_holders(lab.node, TYPED, alias=str(tmp_path / "alias"))
    proc = cli_runs.run_verb(pyz, lab.node, "apply", "--config", cli_runs.write_layout(tmp_path, TARGET))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    one_line_naming(proc.stderr.rstrip("\n"), TYPED)
    assert failure_writes.gpusim(lab.node, what="CLI writes while a VM in another mount namespace held %s" % TYPED) == []


@needs_root
def test_a_holder_of_another_uid_the_scanner_may_not_inspect_refuses_the_apply(
        lab, vfio_holders, pyz, tmp_path, failure_writes):
    """The scanner runs without CAP_SYS_PTRACE: it may not read the holder's fds (EACCES); the
    kernel's answer (the VF's VFIO group is busy: EBUSY) makes the VF held."""
    holder = vfio_holders(lab.node, TYPED, uid=65534)
    argv = cli_runs.argv(pyz, lab.node, "apply", "--config", cli_runs.write_layout(tmp_path, TARGET))
    unprivileged = NO_PTRACE + argv
    look = "import os, sys\ntry:\n os.readlink(sys.argv[1])\nexcept OSError as e:\n print(e.errno)"
    probe = subprocess.run(NO_PTRACE + [sys.executable, "-c", look, "/proc/%d/fd/3" % holder.pid],
                           capture_output=True, text=True, check=False)
    assert probe.stdout.strip() == str(errno.EACCES), probe      # really not allowed to look
    proc = subprocess.run(unprivileged, env=lab.node.env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    one_line_naming(proc.stderr.rstrip("\n"), TYPED)
    assert "EBUSY" in proc.stderr
    assert failure_writes.gpusim(lab.node, what="writes while an uninspectable process held %s" % TYPED) == []
    assert vgpu_types.read_current(lab.sysfs, TYPED) == 1153


@needs_root
@pytest.mark.parametrize("module,args", [
    ("vgpu_profile", {"layout": TARGET}),
    ("sriov_vfs", {"devices": [PF1], "state": "absent", "force": True}),
])
def test_a_holder_in_its_own_mount_namespace_is_seen_through_the_modules(
        lab, vfio_holders, tmp_path, failure_writes, module, args):
    holder = vfio_holders(lab.node, TYPED, alias=str(tmp_path / "alias"))
    roots = {"sysfs_root": lab.node.root, "dev_root": lab.node.dev_root, "proc_root": "/proc"}
    run = run_module(module, dict(args, **roots), env=lab.node.env)
    assert run.failed, run.stdout
    one_line_naming(run.message, TYPED)
    assert "pid %d" % holder.pid in run.message
    assert failure_writes.gpusim(lab.node, what="%s writes while a VM in another mount namespace held %s" % (module, TYPED)) == []


def test_a_vm_that_opens_a_vf_during_its_gpus_writes_stops_the_write_to_that_vf(
        lab, vfio_holders, failure_writes, tmp_path):
    """32.4: the check-then-write window is one VF wide. PF1's writes: clear .4, set .4, set .5; the racer
    opens .5's group as the first of them lands (the gpusim write log has it), after the GPU's own check."""
    racer_vf = "0000:41:00.5"
    started = []

    def race():
        assert [e["path"] for e in lab.node.log() if e["result"] == "ok"] == [
            "bus/pci/devices/%s/nvidia/current_vgpu_type" % TYPED]      # timed by the write log: the first write
        started.append(vfio_holders(lab.node, racer_vf))
    sysfs = HoldAfter(lab.node, 1, race)
    lab.engine = vgpu_apply.NodeEngine(sysfs, lab.runner, lab.node.dev_root, "/proc", cache_dir=str(tmp_path))
    with pytest.raises(vgpu_apply.HeldSincePlan) as caught:
        node_lab.run_layout(lab, layout=TARGET)
    one_line_naming(str(caught.value), racer_vf)
    assert started and "it was not written, nor anything after it on GPU %s" % PF1 in str(caught.value)
    assert caught.value.result == {"changed": True, "gpus_changed": [PF1], "gpus_not_changed": [PF2]}
    on_vf = failure_writes.gpusim(lab.node, keep=lambda e: e["path"].startswith("bus/pci/devices/%s/" % racer_vf),
                                  what="write attempts to %s after a VM opened it" % racer_vf)
    assert on_vf == [] and gpu_writes(lab, PF2) == []
    assert vgpu_types.read_current(lab.sysfs, racer_vf) == 0


def test_a_vm_that_opens_a_vf_after_the_sriov_plan_stops_the_vf_removal(lab, vfio_holders, failure_writes):
    """32.4 in sriov_vfs: each VF is asked again right before its PF's VFs are removed (force: not even the
    discarded types are cleared)."""
    from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import inuse
    from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import sriov

    holders = inuse.Holders(lab.sysfs, lab.node.dev_root, "/proc")
    plan = sriov.plan_vfs(lab.sysfs, lab.runner, [PF1], state="absent", force=True, held=holders)
    assert plan.changed and holders.counts["scans"] == 1
    holder = vfio_holders(lab.node, "0000:41:00.7")   # the VM starts between the plan and the removal
    with pytest.raises(sriov.SriovError) as caught:
        sriov.apply_vfs(lab.sysfs, lab.runner, plan, timeout=10)
    one_line_naming(str(caught.value), "0000:41:00.7")
    assert "since the plan" in str(caught.value) and "pid %d" % holder.pid in str(caught.value)
    assert failure_writes.gpusim(lab.node, what="writes after a VF of %s became held" % PF1) == []
    # the re-check probed each VF's group (no walk); only the busy one led to a walk, to name its pid
    assert holders.counts["scans"] == 2 and holders.counts["probes"] >= 32
    assert vgpu_types.read_current(lab.sysfs, TYPED) == 1153


THREAD_HOLDER = r"""
import ctypes, os, sys, threading, time
opened = threading.Event()

def vm():
    if ctypes.CDLL(None, use_errno=True).unshare(0x400) != 0:     # CLONE_FILES: a table of this thread's own
        raise OSError(ctypes.get_errno(), "unshare")
    os.open(sys.argv[1], os.O_RDWR)
    opened.set()
    time.sleep(300)

threading.Thread(target=vm, daemon=True).start()
opened.wait()
print("ready", flush=True)
sys.stdin.read()
"""


def test_a_vm_whose_descriptor_is_in_a_threads_own_table_is_named_and_refuses_the_apply(lab, failure_writes):
    """32.2: the VFIO fd lives only in /proc/PID/task/TID/fd (a thread after unshare(CLONE_FILES)); the scan
    reads every task's table, so the holder is named by its pid (not only guessed from the kernel's EBUSY)."""
    from ansible_collections.accelops.vgpu.tests.integration.vfio_holders import cdev_path

    holder = subprocess.Popen([sys.executable, "-c", THREAD_HOLDER, cdev_path(lab.node, TYPED)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        with pytest.raises(vgpu_layout.LayoutError) as caught:
            node_lab.run_layout(lab, layout=TARGET)
        one_line_naming(str(caught.value), TYPED)
        assert "pid %d" % holder.pid in str(caught.value)
        assert failure_writes.gpusim(lab.node, what="writes while a thread's own fd table held %s" % TYPED) == []
        assert vgpu_types.read_current(lab.sysfs, TYPED) == 1153
    finally:
        holder.kill()
        holder.wait()
