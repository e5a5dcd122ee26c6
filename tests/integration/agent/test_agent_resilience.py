"""The agent across API server outages, restarts, 410s, node reboots, config updates and resyncs."""

from __future__ import annotations

import json
import os
import subprocess
import time

from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders.node_lock import node_lock
from ansible_collections.accelops.vgpu.tests.integration.agent.agent_helpers import (
    CONFIG_LABEL, CONFIGS, NODE_PYTHON, NODES, PROFILE, STATE_LABEL, Cluster, agent_state, wait_for)
from ansible_collections.accelops.vgpu.tests.integration.agent.test_agent import node_matches
from ansible_collections.accelops.vgpu.tests.integration.cluster.cluster_helpers import ApiServer
from ansible_collections.accelops.vgpu.tests.integration.cluster.cluster_helpers import node as node_object

CONFIG = {"version": "v1", "vgpu-configs": {"default": [{"devices": "all", "vgpu-devices": {"L40S-24Q": 2}}]}}


def api_requests(log, since=0.0, until=None):
    return [r for r in log if r["time"] >= since and (until is None or r["time"] <= until)]


def test_outage_503s_and_a_410_are_survived_with_a_bounded_request_rate(gpusim_node, cluster, start_agent):
    node = gpusim_node("l40s:1")
    agent = start_agent(node, cluster.api)
    agent.wait("success", "default")

    # an outage of 3 s: every watch dropped, every request answered 503; a relabel lands meanwhile
    cluster.api.clear_log()
    started = time.time()
    cluster.api.control("drop-watches", {"unavailable_s": 3})
    cluster.select("L40S-12Q")
    agent.forget_status()
    agent.wait("success", "L40S-12Q")
    outage = api_requests(cluster.api.log(), started, started + 3)
    assert 1 <= len(outage) <= 4, outage  # backoff 1 s, 2 s: never a hot loop
    resumed = [r for r in cluster.api.log() if r["watch"]]
    assert resumed and resumed[-1]["resourceVersion"] is not None  # resumed from where it was, no relist
    assert not [r for r in api_requests(cluster.api.log(), started) if r["path"] == "/api/v1/nodes" and not r["watch"]]

    # 410: the agent is cut off, a change lands, the history is compacted -> relist, converge
    cluster.api.clear_log()
    cluster.api.control("drop-watches", {"unavailable_s": 1.5})
    cluster.select("default")
    cluster.api.control("compact")
    agent.forget_status()
    agent.wait("success", "default")
    log = cluster.api.log()
    lists = [i for i, r in enumerate(log) if r["path"] == "/api/v1/nodes" and not r["watch"]]
    assert lists, "no relist after the 410: %s" % log
    assert [r for r in log[lists[0]:] if r["watch"]], "no watch after the relist"
    assert node_matches(agent.pyz, node, "default")
    assert len(log) <= 15, log


def test_a_restarted_api_server_is_found_again_and_its_node_reconciled(gpusim_node, start_agent, tmp_path):
    state = tmp_path / "state.json"
    state.write_text(json.dumps(agent_state()))
    server = ApiServer.start("--state", str(state))
    try:
        cluster = Cluster(server)
        node = gpusim_node("l40s:1")
        agent = start_agent(node, server, RESYNC_INTERVAL=600)
        agent.wait("success", "default")
        stored = cluster.node()
        server.stop()
        time.sleep(3)  # connection refused meanwhile: the agent backs off
        labels = dict(stored["metadata"]["labels"], **{CONFIG_LABEL: "L40S-12Q"})
        stored["metadata"]["labels"] = labels
        restarted = agent_state()
        restarted["objects"][0]["body"] = stored
        state.write_text(json.dumps(restarted))
        server = ApiServer.start("--state", str(state), "--port", str(server.port), "--resource-version", "5000")
        cluster = Cluster(server)
        agent.forget_status()
        agent.wait("success", "L40S-12Q")
        assert cluster.profile_labels() == {PROFILE + "L40S-12Q": "4"}
        log = server.log()
        assert log[0]["watch"] and log[0]["resourceVersion"] not in (None, "5000")  # its old version: 410
        assert not log[1]["watch"]  # relisted
        first = log[0]["time"]
        assert len(api_requests(log, first, first + 5)) <= 10, log
    finally:
        server.stop()


def test_after_a_node_reboot_a_restarted_agent_puts_the_layout_back(gpusim_node, cluster, start_agent, pyz):
    node = gpusim_node("l40s:2")
    agent = start_agent(node, cluster.api)
    agent.wait("success", "default")
    assert agent.stop() == 0  # SIGTERM: a clean exit
    node.ctl("reboot")
    assert not node_matches(pyz, node, "default")
    again = start_agent(node, cluster.api)
    again.wait("success", "default")
    assert node_matches(pyz, node, "default")
    states = [v["metadata"]["labels"].get(STATE_LABEL) for v in cluster.history()]
    assert states[-2:] == ["pending", "success"]


def test_a_configmap_update_is_applied(gpusim_node, cluster, start_agent, tmp_path):
    volume = tmp_path / "configmap"
    volume.mkdir()

    def publish(config, stamp):  # what the kubelet does: new ..<stamp> dir, atomic ..data swap
        data = volume / ("..%s" % stamp)
        data.mkdir()
        (data / "config.yaml").write_text(json.dumps(config))
        os.symlink(data.name, volume / "..data_tmp")
        os.rename(volume / "..data_tmp", volume / "..data")
        if not (volume / "config.yaml").is_symlink():
            os.symlink("..data/config.yaml", volume / "config.yaml")

    publish(CONFIG, "2026_11_23_00_00_00.1")
    node = gpusim_node("l40s:1")
    agent = start_agent(node, cluster.api, CONFIG_FILE=volume / "config.yaml")
    agent.wait("success", "default")
    assert cluster.profile_labels() == {PROFILE + "L40S-24Q": "2"}
    agent.forget_status()
    publish({"version": "v1", "vgpu-configs": {"default": [{"devices": "all", "vgpu-devices": {"L40S-12Q": 4}}]}},
            "2026_11_23_00_01_00.2")
    agent.wait("success", "default")
    assert cluster.profile_labels() == {PROFILE + "L40S-12Q": "4"}


def test_a_failed_layout_is_retried_after_the_resync_interval(gpusim_node, cluster, start_agent):
    node = gpusim_node("l40s:1")
    agent = start_agent(node, cluster.api, RESYNC_INTERVAL=2)
    agent.wait("success", "default")
    held = node.vfs(node.pfs()[0])[1]
    node.hold(held)
    agent.forget_status()
    cluster.select("L40S-12Q")
    agent.wait("failed", "L40S-12Q")
    node.release(held)
    agent.forget_status()
    agent.wait("success", "L40S-12Q", timeout=20)  # no relabel: the resync retried it
    assert len(cluster.events()) == 3  # applied, failed, applied: one Event each


def test_two_quick_changes_end_on_the_last_one(gpusim_node, cluster, start_agent, pyz):
    node = gpusim_node("l40s:2", latency_ms=300)  # a slow VF enable keeps the first apply busy
    agent = start_agent(node, cluster.api)
    agent.wait("success", "default")
    agent.forget_status()
    cluster.select("L40S-12Q")
    wait_for("the first change to start", lambda: cluster.state() == "pending", timeout=20, interval=0.02)
    cluster.select("default")
    wait_for("the last change", lambda: (agent.status() or {}).get("config") == "default", timeout=60)
    assert agent.status()["state"] == "success"
    assert node_matches(pyz, node, "default")
    assert cluster.profile_labels() == {PROFILE + "L40S-24Q": "4"}


def test_the_agent_waits_for_the_node_lock_of_another_apply(gpusim_node, cluster, start_agent, pyz):
    node = gpusim_node("l40s:1")
    agent = start_agent(node, cluster.api)
    agent.wait("success", "default")
    node.clear_log()
    with node_lock(node.root, timeout=5):  # the boot unit or a module applying right now
        agent.forget_status()
        cluster.select("L40S-12Q")
        time.sleep(2)
        assert node.log() == [] and agent.status() is None  # planned nothing, wrote nothing meanwhile
    agent.wait("success", "L40S-12Q")
    assert node_matches(pyz, node, "L40S-12Q")


def test_timed_out_watches_resume_from_the_bookmarked_version_without_relisting(gpusim_node, cluster, start_agent):
    state = agent_state()
    state["objects"].append({"resource": NODES, "name": "gpu-b", "body": node_object("gpu-b")})
    cluster.api.reset(state)
    cluster.api.control("watch-config", {"bookmark_interval": 0.3})
    node = gpusim_node("l40s:1")
    agent = start_agent(node, cluster.api, WATCH_TIMEOUT=1)
    agent.wait("success", "default")
    own_version = cluster.node()["metadata"]["resourceVersion"]
    # a write to another node moves the global resourceVersion on; only a BOOKMARK tells the agent
    cluster.api.control("patch", {"resource": NODES, "name": "gpu-b", "patch": {"metadata": {"labels": {"x": "1"}}}})
    current = cluster.api.get(NODES, "gpu-b")["metadata"]["resourceVersion"]
    assert int(current) > int(own_version)
    time.sleep(0.8)
    cluster.api.clear_log()
    node.clear_log()
    time.sleep(4)
    log = cluster.api.log()
    watches = [r for r in log if r["watch"]]
    assert 3 <= len(watches) <= 6 and len(watches) == len(log), log  # ~1 per timeoutSeconds, nothing else
    assert {r["resourceVersion"] for r in watches} == {current}  # resumed from the bookmark, not its own version
    assert node.log() == []


def test_bad_settings_exit_2_with_one_line(gpusim_node, cluster, start_agent):
    agent = start_agent(gpusim_node("l40s:1"), cluster.api, NODE_NAME=None)
    assert agent.proc.wait(timeout=60) == 2
    assert agent.output().strip() == "accelops-vgpu agent: NODE_NAME is required (or --node-name)"
    assert cluster.api.log() == []


def test_relabel_then_reboot_with_the_boot_unit_installed_keeps_the_agents_layout(
        gpusim_node, cluster, start_agent, pyz, tmp_path):
    """Both paths on one node: the boot unit pins the inventory's `default`, the agent was relabelled to
    L40S-12Q. After a reboot the unit's command (as vgpu_profiles installs it) re-applies L40S-12Q."""
    node = gpusim_node("l40s:2")
    etc = tmp_path / "etc" / "accelops-vgpu"
    etc.mkdir(parents=True)
    (etc / "layout.json").write_text("{}")     # the boot unit's layout: vgpu_profiles installed it here
    handover = etc / "agent-applied.json"
    agent = start_agent(node, cluster.api, HANDOVER_FILE=handover)
    agent.wait("success", "default")
    agent.forget_status()
    cluster.select("L40S-12Q")
    agent.wait("success", "L40S-12Q")
    assert agent.stop() == 0
    node.ctl("reboot")
    boot = subprocess.run([NODE_PYTHON, pyz, "apply", "--config", str(CONFIGS), "--selected", "default",
                           "--agent-applied", str(handover), "--sysfs-root", node.root, "--dev-root", node.dev_root,
                           "--retry-for", "30", "--state-file", str(tmp_path / "boot.json")],
                          capture_output=True, text=True, env=node.env, timeout=120, check=False)
    assert boot.returncode == 0, boot.stderr
    assert "the agent owns this node" in boot.stderr
    assert node_matches(pyz, node, "L40S-12Q") and not node_matches(pyz, node, "default")
    # without the agent's file (the node handed back to Ansible) the pinned selection applies again
    handover.unlink()
    node.ctl("reboot")
    boot = subprocess.run([NODE_PYTHON, pyz, "apply", "--config", str(CONFIGS), "--selected", "default",
                           "--agent-applied", str(handover), "--sysfs-root", node.root, "--dev-root", node.dev_root],
                          capture_output=True, text=True, env=node.env, timeout=120, check=False)
    assert boot.returncode == 0, boot.stderr
    assert node_matches(pyz, node, "default")
