"""Failure after a partial change: the node CLI's apply enables VFs on one GPU, then sriov-manage does
nothing for the second. The run fails naming that GPU, no vGPU type is written on either GPU (types
come only after every GPU's VFs are ready), and the next run converges from the half-changed node."""

from __future__ import annotations

import os

import pytest

from ansible_collections.accelops.vgpu.tests.reliability import cli_runs
from ansible_collections.accelops.vgpu.tests.reliability.assertions import one_line_naming

PF1, PF2 = "0000:41:00.0", "0000:42:00.0"
LAYOUT = [{"device_filter": "0x26B910DE", "profiles": {"L40S-24Q": 2}}]
# sriov-manage that does nothing (and says it did) for PF2, and is the simulator's own for the rest
STUCK_ON_PF2 = """#!/bin/sh
if [ "$2" = "%s" ]; then echo "Enabling VFs on $2"; exit 0; fi
exec %s "$@"
"""


@pytest.fixture(scope="module")
def pyz(tmp_path_factory):
    return cli_runs.build(tmp_path_factory.mktemp("node-cli"))


def test_vfs_enabled_on_one_gpu_then_the_other_fails_and_the_next_run_converges(
        gpusim_node, pyz, tmp_path, failure_writes):
    node = gpusim_node("l40s:2", fresh=True)
    stuck = tmp_path / "stuck-tools"
    stuck.mkdir()
    (stuck / "sriov-manage").write_text(STUCK_ON_PF2 % (PF2, os.path.join(node.tools_dir, "sriov-manage")))
    os.chmod(stuck / "sriov-manage", 0o755)
    config = cli_runs.write_layout(tmp_path, LAYOUT)
    env_path = node.env["PATH"]
    node.env["PATH"] = "%s:%s" % (stuck, env_path)
    try:
        failed = cli_runs.run_verb(pyz, node, "apply", "--config", config)
    finally:
        node.env["PATH"] = env_path
    assert failed.returncode == 2, failed.stdout + failed.stderr
    one_line_naming(failed.stderr.rstrip("\n"), PF2)
    written = failure_writes.gpusim(node, keep=lambda e: e["path"].endswith("/current_vgpu_type"),
                                    what="vGPU types written although enabling VFs failed")
    assert written == []
    assert [p["numvfs"] for p in node.state()["pfs"]] == [32, 0]  # the partial change: PF1 only
    again = cli_runs.run_verb(pyz, node, "apply", "--config", config)
    assert again.returncode == 0, again.stdout + again.stderr
    assert cli_runs.run_verb(pyz, node, "assert", "--config", config).returncode == 0
