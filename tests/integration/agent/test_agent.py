"""`accelops-vgpu agent` as a real process: labels in, layouts on the simulated node, state out."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request

import pytest

from ansible_collections.accelops.vgpu.tests.integration.agent.agent_helpers import (
    CONFIG_LABEL, CONFIGS, NODE_PYTHON, PLUGIN_LABEL, PROFILE, REASON, STATE_LABEL, VALIDATOR_LABEL, agent_state,
    wait_for)


def node_matches(pyz, gpu_node, config):
    """`accelops-vgpu assert` (the node CLI, read-only) says the node carries `config`."""
    proc = subprocess.run([NODE_PYTHON, pyz, "assert", "--config", str(CONFIGS), "--selected", config,
                           "--sysfs-root", gpu_node.root, "--dev-root", gpu_node.dev_root],
                          capture_output=True, text=True, env=gpu_node.env, timeout=120, check=False)
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode == 0


def test_label_change_applies_the_config_and_relabelling_back_converges_back(gpusim_node, cluster, start_agent, pyz):
    node = gpusim_node("l40s:2")
    agent = start_agent(node, cluster.api)
    agent.wait("success", "default")  # no label: DEFAULT_VGPU_CONFIG, VFs enabled first
    assert cluster.state() == "success"
    assert cluster.profile_labels() == {PROFILE + "L40S-24Q": "4"}
    assert node_matches(pyz, node, "default")

    agent.forget_status()
    cluster.select("L40S-12Q")
    agent.wait("success", "L40S-12Q")
    assert cluster.profile_labels() == {PROFILE + "L40S-12Q": "8"}  # the stale 24Q label went
    assert node_matches(pyz, node, "L40S-12Q") and not node_matches(pyz, node, "default")
    states = [v["metadata"]["labels"].get(STATE_LABEL) for v in cluster.history()]
    assert states[-3:] == ["success", "pending", "success"]

    agent.forget_status()
    cluster.relabel(**{CONFIG_LABEL: None})  # label removed: back to the default
    agent.wait("success", "default")
    assert cluster.profile_labels() == {PROFILE + "L40S-24Q": "4"}
    assert node_matches(pyz, node, "default")
    assert REASON not in cluster.annotations()


def test_unknown_config_and_broken_file_fail_with_the_reason_and_write_nothing(gpusim_node, cluster, start_agent,
                                                                               tmp_path):
    node = gpusim_node("l40s:1")
    config = tmp_path / "vgpu.yaml"
    config.write_text('{"version": "v1", "vgpu-configs": {"default": [{"devices": "all", '
                      '"vgpu-devices": {"L40S-24Q": 2}}]}}')
    agent = start_agent(node, cluster.api, CONFIG_FILE=config)
    agent.wait("success", "default")
    node.clear_log()

    agent.forget_status()
    cluster.select("no-such-config")
    status = agent.wait("failed", "no-such-config")
    assert "'no-such-config' not present" in status["reason"]
    assert cluster.state() == "failed"
    assert cluster.annotations()[REASON] == status["reason"]
    assert "\n" not in status["reason"]

    agent.forget_status()
    config.write_text('{"version": "v1", "vgpu-configs": {')  # a broken edit of the ConfigMap
    cluster.select("default")
    status = agent.wait("failed", "default")
    assert str(config) in status["reason"] and "not valid YAML" in status["reason"]
    assert node.log() == []  # nothing written to sysfs by either failure
    assert agent.proc.poll() is None  # and no crash


def test_held_vf_fails_naming_it_then_release_and_relabel_succeed(gpusim_node, cluster, start_agent):
    node = gpusim_node("l40s:1")
    agent = start_agent(node, cluster.api, RESYNC_INTERVAL=600)
    agent.wait("success", "default")
    held = node.vfs(node.pfs()[0])[0]
    node.hold(held)
    node.clear_log()

    agent.forget_status()
    cluster.select("L40S-12Q")
    status = agent.wait("failed", "L40S-12Q")
    assert held in status["reason"] and "held by a VM" in status["reason"]
    assert cluster.annotations()[REASON] == status["reason"]
    assert node.log() == []

    node.release(held)
    agent.forget_status()
    cluster.select("default")  # relabel: back to what is applied (no pending, success)
    agent.wait("success", "default")
    agent.forget_status()
    cluster.select("L40S-12Q")
    agent.wait("success", "L40S-12Q")
    assert cluster.profile_labels() == {PROFILE + "L40S-12Q": "4"}


def test_sandbox_operands_are_paused_and_restored_also_when_the_apply_fails(gpusim_node, cluster, start_agent):
    cluster.api.reset(agent_state({PLUGIN_LABEL: "true", VALIDATOR_LABEL: "false"}))
    node = gpusim_node("l40s:1")
    agent = start_agent(node, cluster.api)
    agent.wait("success", "default")
    versions = [v["metadata"]["labels"] for v in cluster.history()]
    pending = [v for v in versions if v.get(STATE_LABEL) == "pending"]
    assert [v[PLUGIN_LABEL] for v in pending] == ["true", "paused-for-vgpu-change"]  # pending, then the pause
    assert versions[-1][STATE_LABEL] == "success"
    assert all(v[VALIDATOR_LABEL] == "false" for v in versions)  # "false" is not ours to touch
    assert cluster.labels()[PLUGIN_LABEL] == "true"

    held = node.vfs(node.pfs()[0])[0]
    node.hold(held)
    agent.forget_status()
    cluster.select("L40S-12Q")
    agent.wait("failed", "L40S-12Q")
    assert cluster.labels()[PLUGIN_LABEL] == "true"
    node.release(held)


def test_an_operand_label_owned_by_another_operation_fails_the_change(gpusim_node, cluster, start_agent):
    cluster.api.reset(agent_state({PLUGIN_LABEL: "paused-for-mig-change"}))
    node = gpusim_node("l40s:1")
    agent = start_agent(node, cluster.api)
    status = agent.wait("failed", "default")
    assert status["reason"] == "label %s=paused-for-mig-change is owned by another operation" % PLUGIN_LABEL
    assert cluster.labels()[PLUGIN_LABEL] == "paused-for-mig-change"
    assert node.writes() == []


def pod(name, app):
    meta = {"name": name, "namespace": "gpu-operator", "labels": {"app": app}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"nodeName": "gpu-a"}}


def test_with_operand_namespace_the_apply_waits_for_the_operand_pods_to_go(gpusim_node, cluster, start_agent):
    state = agent_state({PLUGIN_LABEL: "true"})
    state["resources"]["v1/pods"] = {"kind": "Pod", "singular": "pod", "namespaced": True, "verbs": ["list"]}
    state["objects"].append({"resource": "v1/pods", "namespace": "gpu-operator", "name": "plugin-x",
                             "body": pod("plugin-x", "nvidia-sandbox-device-plugin-daemonset")})
    state["objects"].append({"resource": "v1/pods", "namespace": "gpu-operator", "name": "other",
                             "body": pod("other", "nvidia-dcgm-exporter")})
    cluster.api.reset(state)
    node = gpusim_node("l40s:1")
    agent = start_agent(node, cluster.api, OPERAND_NAMESPACE="gpu-operator", OPERAND_WAIT_TIMEOUT=60)
    wait_for("the pause", lambda: cluster.labels().get(PLUGIN_LABEL) == "paused-for-vgpu-change", timeout=60)
    time.sleep(1.5)
    assert node.writes() == [] and agent.status() is None  # still waiting for the plugin pod
    req = urllib.request.Request(cluster.api.url + "/api/v1/namespaces/gpu-operator/pods/plugin-x", method="DELETE")
    urllib.request.urlopen(req, timeout=10).close()  # the DaemonSet controller removes it
    agent.wait("success", "default")
    assert node.writes() and cluster.labels()[PLUGIN_LABEL] == "true"
    lists = [r for r in cluster.api.log() if r["path"].endswith("/pods")]
    assert 1 <= len(lists) <= 8 and {r["fieldSelector"] for r in lists} == {"spec.nodeName=gpu-a"}


def test_operand_pods_that_do_not_go_fail_the_change_and_the_operands_come_back(gpusim_node, cluster, start_agent):
    state = agent_state({PLUGIN_LABEL: "true", VALIDATOR_LABEL: "true"})
    state["resources"]["v1/pods"] = {"kind": "Pod", "singular": "pod", "namespaced": True, "verbs": ["list"]}
    state["objects"].append({"resource": "v1/pods", "namespace": "gpu-operator", "name": "validator-x",
                             "body": pod("validator-x", "nvidia-sandbox-validator")})
    cluster.api.reset(state)
    node = gpusim_node("l40s:1")
    agent = start_agent(node, cluster.api, OPERAND_NAMESPACE="gpu-operator", OPERAND_WAIT_TIMEOUT=2)
    status = agent.wait("failed", "default")
    assert status["reason"] == ("timed out after 2 s waiting for the sandbox-validator pods (app=nvidia-sandbox-"
                                "validator in gpu-operator) on node gpu-a to terminate")
    assert node.writes() == []
    assert (cluster.labels()[PLUGIN_LABEL], cluster.labels()[VALIDATOR_LABEL]) == ("true", "true")


@pytest.mark.parametrize("spec,mig_profiles,sliced", [
    ("h100-pcie:1", {"H100-1-20C": 4}, {"H100-20C": 4}),
    ("h200:1", {"H200X-1-18C": 7}, {"H200X-35C": 4}),
])
def test_relabelling_across_mig_mode_converges_both_ways_without_a_human(
        gpusim_node, cluster, start_agent, tmp_path, spec, mig_profiles, sliced):
    """Issue 24: MIG-backed -> time-sliced needs the VFs off around `-mig 0`; the agent does it itself."""
    node = gpusim_node(spec)
    config = tmp_path / "vgpu.yaml"
    config.write_text(json.dumps({"version": "v1", "vgpu-configs": {
        "default": [{"devices": "all", "vgpu-devices": mig_profiles}],
        "sliced": [{"devices": "all", "vgpu-devices": sliced}]}}))
    agent = start_agent(node, cluster.api, CONFIG_FILE=config, RESYNC_INTERVAL=600)
    agent.wait("success", "default", timeout=120)
    assert node.state()["pfs"][0]["mig_mode"]

    for name, profiles, mig_mode in (("sliced", sliced, False), ("default", mig_profiles, True)):
        agent.forget_status()
        cluster.select(name)
        agent.wait("success", name, timeout=120)
        assert cluster.profile_labels() == dict((PROFILE + p, str(n)) for p, n in profiles.items())
        assert node.state()["pfs"][0]["mig_mode"] is mig_mode
        assert REASON not in cluster.annotations()


def test_the_agent_finishes_from_the_node_its_own_patch_returned_without_reading_it_again(
        gpusim_node, cluster, start_agent):
    """Issue 24: after pending (and the pause) the outcome patch is computed from the object the API
    server returned for our own patch; no GET of the Node after an apply, nor after a failure."""
    cluster.api.reset(agent_state({PLUGIN_LABEL: "true"}))
    node = gpusim_node("l40s:1")
    agent = start_agent(node, cluster.api, RESYNC_INTERVAL=600)
    agent.wait("success", "default")
    for config, state in (("L40S-12Q", "success"), ("no-such-config", "failed")):
        cluster.api.clear_log()
        agent.forget_status()
        cluster.select(config)
        agent.wait(state, config)
        gets = [r for r in cluster.api.log() if r["method"] == "GET" and r["path"] == "/api/v1/nodes/gpu-a"]
        assert gets == []
    assert cluster.profile_labels() == {PROFILE + "L40S-12Q": "4"}
    assert cluster.labels()[PLUGIN_LABEL] == "true" and cluster.state() == "failed"
