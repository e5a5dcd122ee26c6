"""Faults during an apply (gpusim): EIO on the n-th write, VFs that never appear, the driver
unloaded mid-apply, the apply process killed. Each failure is one line naming the device, a VF a
VM holds is never written, and the next run converges."""

from __future__ import annotations

import os

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw import vgpu_types
from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout import vgpu_layout
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import vgpu_apply
from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import Sysfs
from ansible_collections.accelops.vgpu.tests.reliability import cli_runs, node_lab
from ansible_collections.accelops.vgpu.tests.reliability.assertions import one_line_naming

PF1, PF2 = "0000:41:00.0", "0000:42:00.0"
HELD = "0000:41:00.4"
START = [{"devices": [PF1], "profiles": {"L40S-12Q": 1}}, {"devices": [PF2], "profiles": {}}]
TARGET = [{"devices": "all", "profiles": {"L40S-12Q": 4}}]  # keeps HELD, writes 3 + 4 types
TARGET_WRITES = 7
FAULTY_WRITES = (1, 3, 4, 7)  # first, last on the first GPU, first and last on the second


@pytest.fixture
def lab(gpusim_node, monkeypatch, tmp_path):
    """Two L40S with VFs, HELD typed L40S-12Q and held by a VM; empty write log."""
    node = gpusim_node("l40s:2")
    for name, value in node_lab.environment(node).items():
        monkeypatch.setenv(name, value)
    lab = node_lab.Lab(node, tmp_path)
    node_lab.run_layout(lab, layout=START, enable_vfs=True)
    node.hold(HELD)
    node.clear_log()
    return lab


def held_untouched(lab, failure_writes):
    """HELD keeps its type and no write was even attempted on it."""
    on_held = failure_writes.gpusim(lab.node, keep=lambda e: "/%s/" % HELD in e["path"],
                                    what="writes on the held VF " + HELD)
    assert on_held == []
    assert vgpu_types.read_current(lab.sysfs, HELD) == 1153  # L40S-12Q


def converges(lab, layout):
    """The next run succeeds and leaves the node matching the layout."""
    node_lab.run_layout(lab, layout=layout, enable_vfs=True)
    assert vgpu_apply.check(lab.engine, vgpu_layout.from_layout(layout)) == []


def planned_writes(lab, layout):
    """The current_vgpu_type paths an apply of `layout` writes, in order (from a check-mode plan)."""
    result = vgpu_apply.apply(lab.engine, vgpu_layout.from_layout(layout), check_mode=True)
    return [vgpu_types.vfio_dir(v["address"]) + "/current_vgpu_type"
            for gpu in result["gpus"] for v in gpu["vgpus"] if v["before"] != v["after"]]


@pytest.mark.parametrize("nth", FAULTY_WRITES)
def test_eio_on_the_nth_type_write_then_the_next_run_converges(lab, nth, failure_writes):
    paths = planned_writes(lab, TARGET)
    assert len(paths) == TARGET_WRITES
    lab.node.ctl("fail-next", paths[nth - 1], "EIO")
    with pytest.raises(EngineError) as caught:
        node_lab.run_layout(lab, layout=TARGET)
    one_line_naming(str(caught.value), paths[nth - 1].split("/")[3])  # the VF's address
    assert [(e["path"], e["result"]) for e in lab.attempts()] == [(p, "ok") for p in paths[:nth - 1]] + [
        (paths[nth - 1], "error")]
    converges(lab, TARGET)
    held_untouched(lab, failure_writes)


def test_eio_while_enabling_vfs_is_retried_and_converges(gpusim_node, monkeypatch, tmp_path, failure_writes):
    """sriov-manage fails on an EIO from sriov_numvfs; the engine's check-and-retry recovers in the same run:
    the failed GPU's enable is retried once, the other GPU's is not repeated, no vGPU type is touched."""
    node = gpusim_node("l40s:2")
    for name, value in node_lab.environment(node).items():
        monkeypatch.setenv(name, value)
    lab = node_lab.Lab(node, tmp_path)
    numvfs = "bus/pci/devices/%s/sriov_numvfs" % PF2
    node.ctl("fail-next", numvfs, "EIO")
    assert node_lab.run_sriov(lab, devices=[PF1, PF2]) == [PF1, PF2]
    assert [e["result"] for e in node.log() if e["path"] == numvfs] == ["error", "ok"]
    assert [e["result"] for e in node.log() if e["path"] == "bus/pci/devices/%s/sriov_numvfs" % PF1] == ["ok"]
    typed = failure_writes.gpusim(node, what="vGPU writes while enabling",
                                  keep=lambda e: e["path"].startswith("bus/pci/devices/") and "/nvidia/" in e["path"])
    assert typed == [], typed
    converges(lab, TARGET)


def test_vfs_that_never_appear_fail_clearly_without_writes(lab, tmp_path, monkeypatch, failure_writes):
    """A sriov-manage that exits 0 without enabling anything (vGPU 17.2, domain brief 1.5)."""
    lab.node.ctl("reboot")  # VFs gone; HELD's VM with them
    lab.node.clear_log()
    fake = tmp_path / "lying-tools"
    fake.mkdir()
    (fake / "sriov-manage").write_text("#!/bin/sh\necho \"Enabling VFs on $2\"\nexit 0\n")
    os.chmod(fake / "sriov-manage", 0o755)
    monkeypatch.setenv("PATH", "%s:%s" % (fake, os.environ["PATH"]))
    with pytest.raises(EngineError) as caught:
        node_lab.run_sriov(lab, devices=[PF1])
    one_line_naming(str(caught.value), PF1)
    assert failure_writes.gpusim(lab.node, what="gpusim writes while VFs never appeared") == []
    monkeypatch.setenv("PATH", lab.node.env["PATH"])
    converges(lab, TARGET)


@pytest.fixture(scope="module")
def pyz(tmp_path_factory):
    return cli_runs.build(tmp_path_factory.mktemp("node-cli"))


class UnloadDriverAfter(Sysfs):
    """Sysfs that unloads the simulated nvidia driver right after its n-th successful write (and
    clears the write log then: what it holds afterwards is what the engine did once the driver went)."""

    def __init__(self, node, nth):
        super().__init__(node.root)
        self.node, self.nth = node, nth

    def write(self, rel, value):
        super().write(rel, value)
        if self.writes == self.nth:
            self.node.ctl("driver", "unload")
            self.node.clear_log()


def test_driver_unloaded_mid_apply_then_the_next_run_converges(gpusim_node, monkeypatch, tmp_path, failure_writes):
    node = gpusim_node("l40s:2")
    for name, value in node_lab.environment(node).items():
        monkeypatch.setenv(name, value)
    lab = node_lab.Lab(node, tmp_path)
    node_lab.run_layout(lab, layout=START, enable_vfs=True)  # no VM holds a VF: unloading would be EBUSY
    lab.engine = vgpu_apply.NodeEngine(UnloadDriverAfter(node, 2), lab.runner, node.dev_root, "/proc", str(tmp_path))
    with pytest.raises(EngineError) as caught:
        node_lab.run_layout(lab, layout=TARGET)
    # the driver accepted the second write (.6), then went away: the next VF (.7) is where it fails
    one_line_naming(str(caught.value), "0000:41:00.7")
    landed = failure_writes.gpusim(node, keep=lambda e: e["result"] == "ok", what="writes after the driver went")
    assert landed == [], landed
    node.ctl("driver", "load")
    lab = node_lab.Lab(node, tmp_path)
    converges(lab, TARGET)


def test_apply_killed_mid_apply_then_the_next_run_converges(gpusim_node, monkeypatch, pyz, tmp_path, failure_writes):
    """SIGKILL while the apply (with sriov-manage) enables the second GPU's VFs; a VM holds a VF of the first."""
    node = gpusim_node("l40s:2")
    for name, value in node_lab.environment(node).items():
        monkeypatch.setenv(name, value)
    lab = node_lab.Lab(node, tmp_path)
    node_lab.run_layout(lab, layout=START[:1], enable_vfs=True)  # VFs on PF1 only
    node.hold(HELD)
    node.clear_log()
    node.ctl("latency", "1500")
    config = cli_runs.write_layout(tmp_path, TARGET)
    apply = cli_runs.Apply(pyz, node, config)
    assert cli_runs.wait_until(lambda: node.state()["pfs"][1]["driver"] == "pci-pf-stub")
    apply.kill()
    node.ctl("latency", "0")
    again = cli_runs.Apply(pyz, node, config)
    assert again.wait() == 0, again.stderr
    assert _matches(pyz, node, config)
    held_untouched(lab, failure_writes)


def _matches(pyz, node, config):
    return cli_runs.run_verb(pyz, node, "assert", "--config", config).returncode == 0
