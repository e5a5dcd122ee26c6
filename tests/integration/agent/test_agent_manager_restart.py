"""Issue 24: a vGPU-manager restart (gpusim `manager-restart`: GPUs stay bound, every VF again without a
type) is noticed by the agent's probe and the layout put back within 10 s, long before the resync."""

from __future__ import annotations

import time
import urllib.request

from ansible_collections.accelops.vgpu.tests.fakes.registry import free_port
from ansible_collections.accelops.vgpu.tests.integration.agent.agent_helpers import wait_for

L40S_24Q = "1155"


def typed(node):
    """VFs per GPU that carry L40S-24Q."""
    return [sum(node.read("bus/pci/devices/%s/nvidia/current_vgpu_type" % vf) == L40S_24Q for vf in node.vfs(pf))
            for pf in node.pfs()]


def test_a_manager_restart_is_noticed_and_the_layout_back_within_10_s(gpusim_node, cluster, start_agent):
    node = gpusim_node("l40s:2")
    port = free_port()
    agent = start_agent(node, cluster.api, RESYNC_INTERVAL=600, METRICS_PORT=port, METRICS_BIND_ADDRESS="127.0.0.1")
    agent.wait("success", "default")
    assert typed(node) == [2, 2]     # default: 2 x L40S-24Q per GPU
    events = len(cluster.events())
    node.clear_log()
    time.sleep(10)      # idle: at most 2 sysfs reads per GPU per 10 s (gpusim counts them), no writes
    reads = node.reads()
    assert 2 <= sum(reads.values()) <= 2 * 2 and node.log() == [], reads
    assert set(reads) <= set("bus/pci/devices/%s/nvidia/current_vgpu_type" % node.vfs(pf)[1] for pf in node.pfs())

    node.ctl("manager-restart")
    restarted = time.monotonic()
    assert typed(node) == [0, 0] and len(node.vfs(node.pfs()[0])) == 32
    wait_for("the layout back", lambda: typed(node) == [2, 2], timeout=10.0, interval=0.05)
    assert time.monotonic() - restarted < 10.0
    wait_for("the agent's success after the restart",
             lambda: (agent.status() or {}).get("manager_restarts") == 1 and agent.status()["state"] == "success")
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=5) as response:
        metrics = response.read().decode()
    assert "accelops_vgpu_agent_manager_restarts_total 1" in metrics.splitlines()
    assert "vGPUs of config default gone on GPU(s) %s (vGPU manager restarted?); re-applying" % (
        ", ".join(node.pfs())) in agent.output()
    assert len(cluster.events()) == events + 2     # the restart (Warning), then the apply
    assert cluster.state() == "success"


def test_a_failing_re_apply_after_a_restart_is_retried_before_the_resync(gpusim_node, cluster, start_agent):
    node = gpusim_node("l40s:1")
    agent = start_agent(node, cluster.api, RESYNC_INTERVAL=600, MANAGER_PROBE_INTERVAL=1)
    agent.wait("success", "default")
    pf = node.pfs()[0]
    node.ctl("driver", "unload")       # the manager's stop: the module is gone, no VF is ready
    agent.wait("failed", "default", timeout=20)
    node.ctl("driver", "load")          # ... and its start: VFs back (autoprobe), no types
    agent.forget_status()
    agent.wait("success", "default", timeout=30)    # retried within seconds, not after RESYNC_INTERVAL
    assert typed(node) == [2] and len(node.vfs(pf)) == 32
