"""Two applies on one node at the same time serialize on the node lock (node_lock.py): real
processes, the first slowed by gpusim's VF enable latency while it holds the lock."""

from __future__ import annotations

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders.node_lock import lock_path
from ansible_collections.accelops.vgpu.tests.reliability import cli_runs
from ansible_collections.accelops.vgpu.tests.reliability.assertions import one_line_naming
from ansible_collections.accelops.vgpu.tests.reliability.module_runs import run_module

PFS = ("0000:41:00.0", "0000:42:00.0")
LAYOUT = [{"devices": "all", "profiles": {"L40S-12Q": 4}}]
LATENCY_MS = "1500"


@pytest.fixture(scope="module")
def pyz(tmp_path_factory):
    return cli_runs.build(tmp_path_factory.mktemp("node-cli"))


@pytest.fixture
def first(gpusim_node, pyz, tmp_path):
    """An apply that holds the node lock (it is inside its slow VF enable) when the test starts."""
    node = gpusim_node("l40s:2")
    node.ctl("latency", LATENCY_MS)
    config = cli_runs.write_layout(tmp_path, LAYOUT)
    apply = cli_runs.Apply(pyz, node, config)
    assert cli_runs.wait_until(lambda: node.state()["pfs"][0]["driver"] == "pci-pf-stub"), "apply never started"
    yield node, config, apply
    if apply.proc.poll() is None:
        apply.kill()


pytestmark = pytest.mark.no_failure_path("concurrency cases: every write is the first apply's, and "
                                         "one_apply_worth_of_writes proves the second added none")


def one_apply_worth_of_writes(node):
    """Exactly the writes of one apply: one VF enable per PF and 4 types per PF, nothing twice."""
    ok = [e for e in node.log() if e["result"] == "ok"]
    enables = sorted(e["path"].split("/")[3] for e in ok if e["path"].endswith("sriov_numvfs") and e["value"] != "0")
    types = [e["path"] for e in ok if e["path"].endswith("current_vgpu_type")]
    assert enables == sorted(PFS)
    assert len(types) == len(set(types)) == 8


def test_a_second_apply_waits_for_the_first_and_then_changes_nothing(first, pyz):
    node, config, apply = first
    second = cli_runs.Apply(pyz, node, config, "--lock-timeout", "120")
    assert apply.wait() == 0, apply.stderr
    assert second.wait() == 0, second.stderr
    assert [line for line in second.stdout.splitlines() if not line.endswith("unchanged")] == []
    one_apply_worth_of_writes(node)


def test_a_second_apply_that_cannot_wait_fails_in_one_line_naming_the_holder(first, pyz):
    node, config, apply = first
    second = cli_runs.Apply(pyz, node, config, "--lock-timeout", "0.5")
    assert second.wait() == 2
    message = second.stderr.strip()
    one_line_naming(message, lock_path(node.root))
    assert "pid %d" % apply.proc.pid in message
    assert apply.wait() == 0, apply.stderr
    one_apply_worth_of_writes(node)


def test_a_module_shares_the_lock_with_the_node_cli(first):
    node, dummy, apply = first
    run = run_module("sriov_vfs", {"devices": ["all"], "wait_timeout": 1, "sysfs_root": node.root,
                                   "dev_root": node.dev_root}, env=node.env)
    assert run.failed
    one_line_naming(run.message, lock_path(node.root))
    assert apply.wait() == 0, apply.stderr
    one_apply_worth_of_writes(node)
