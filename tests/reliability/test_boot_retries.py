"""The boot unit's apply (`accelops-vgpu apply --retry-for S --state-file F`, as accelops-vgpu.service
runs it) at a boot where the vGPU manager is not ready (gpusim: the nvidia driver not loaded yet): it
retries for a bounded time, writes nothing while it cannot, gives up with one journal line and leaves
state `failed`; when the driver comes within the bound a retry applies. A layout that conflicts with a
VM is no transient failure: not retried."""

from __future__ import annotations

import json
import threading

import pytest

from ansible_collections.accelops.vgpu.tests.reliability import cli_runs
from ansible_collections.accelops.vgpu.tests.reliability.assertions import one_line_naming

PF, HELD = "0000:41:00.0", "0000:41:00.4"
START = [{"devices": [PF], "profiles": {"L40S-24Q": 2}}]
NEEDS_THE_HELD_VF = [{"devices": [PF], "profiles": {"L40S-12Q": 4}}]


def boot_apply(pyz, node, config, state_file, retry_for):
    return cli_runs.run_verb(pyz, node, "apply", "--config", config, "--retry-for", str(retry_for),
                             "--state-file", str(state_file))


def booting(gpusim_node):
    """A node right after a reboot, its vGPU manager not up yet."""
    node = gpusim_node("l40s:1")
    node.ctl("reboot")
    node.ctl("driver", "unload")
    node.clear_log()
    return node


def test_gives_up_after_the_bound_without_a_write_and_says_so(gpusim_node, tmp_path, failure_writes):
    node = booting(gpusim_node)
    pyz = cli_runs.build(tmp_path)
    state = tmp_path / "boot-state.json"
    proc = boot_apply(pyz, node, cli_runs.write_layout(tmp_path, START), state, 3)
    writes = failure_writes.gpusim(node, keep=lambda e: e["result"] == "ok", what="gpusim writes while the boot unit retried")
    assert proc.returncode == 2 and writes == []
    last = proc.stderr.strip().splitlines()[-1]
    one_line_naming(last, PF)
    assert "giving up after" in last and "attempt 1 failed" in proc.stderr
    recorded = json.loads(state.read_text())
    assert recorded["state"] == "failed" and recorded["attempts"] >= 2 and PF in recorded["error"]


@pytest.mark.no_failure_path("a recovery case: the writes are the apply that succeeds once the manager is up")
def test_a_retry_applies_once_the_manager_is_up(gpusim_node, tmp_path):
    node = booting(gpusim_node)
    pyz = cli_runs.build(tmp_path)
    state = tmp_path / "boot-state.json"
    up = threading.Timer(3.0, node.ctl, ["driver", "load"])
    up.start()
    try:
        proc = boot_apply(pyz, node, cli_runs.write_layout(tmp_path, START), state, 60)
    finally:
        up.cancel()
    assert proc.returncode == 0, proc.stderr
    recorded = json.loads(state.read_text())
    assert recorded["state"] == "applied" and recorded["attempts"] >= 2
    assert cli_runs.run_verb(pyz, node, "assert", "--config", cli_runs.write_layout(tmp_path, START)).returncode == 0


def test_a_layout_that_needs_a_held_vf_is_not_retried(gpusim_node, tmp_path, failure_writes):
    node = gpusim_node("l40s:1")
    pyz = cli_runs.build(tmp_path)
    assert boot_apply(pyz, node, cli_runs.write_layout(tmp_path, START, "start.json"), tmp_path / "s0.json",
                      10).returncode == 0
    node.hold(HELD)
    node.clear_log()
    state = tmp_path / "boot-state.json"
    proc = boot_apply(pyz, node, cli_runs.write_layout(tmp_path, NEEDS_THE_HELD_VF), state, 60)
    assert proc.returncode == 2 and "attempt 1 failed" not in proc.stderr
    assert json.loads(state.read_text())["attempts"] == 1
    assert failure_writes.gpusim(node, keep=lambda e: "/%s/" % HELD in e["path"], what="writes on the held VF") == []
