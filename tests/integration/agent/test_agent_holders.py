"""The agent and the VMs it must not disturb (issue 25): a VM in its own mount namespace while the
agent sees the host's /dev elsewhere (as the DaemonSet mounts it at /host/dev), a VM that starts
during the operand wait, the operand wait after a failed pod list and after SIGTERM, a Node created
again or stripped of its labels, and a throttled API server. 0 writes on every failure path."""

from __future__ import annotations

import time
import urllib.request

from ansible_collections.accelops.vgpu.tests.integration.agent.agent_helpers import (
    NODE, NODES, PLUGIN_LABEL, PROFILE, STATE_LABEL, agent_state, wait_for)
from ansible_collections.accelops.vgpu.tests.integration.vfio_holders import (  # pylint: disable=unused-import
    NEEDS_ROOT, own_namespace_prefix, vfio_holders)  # noqa: F401 (vfio_holders is a fixture)

PAUSED = "paused-for-vgpu-change"
PLUGIN_APP = "nvidia-sandbox-device-plugin-daemonset"


def with_plugin_pod(labels=None):
    state = agent_state(dict({PLUGIN_LABEL: "true"}, **(labels or {})))
    state["resources"]["v1/pods"] = {"kind": "Pod", "singular": "pod", "namespaced": True, "verbs": ["list"]}
    state["objects"].append({"resource": "v1/pods", "namespace": "gpu-operator", "name": "plugin-x", "body": {
        "apiVersion": "v1", "kind": "Pod", "spec": {"nodeName": NODE},
        "metadata": {"name": "plugin-x", "namespace": "gpu-operator", "labels": {"app": PLUGIN_APP}}}})
    return state


def delete_plugin_pod(cluster):
    req = urllib.request.Request(cluster.api.url + "/api/v1/namespaces/gpu-operator/pods/plugin-x", method="DELETE")
    urllib.request.urlopen(req, timeout=10).close()


def pod_lists(cluster):
    return [r for r in cluster.api.log() if r["path"].endswith("/pods")]


@NEEDS_ROOT
def test_a_vm_in_its_own_mount_namespace_is_seen_by_an_agent_with_the_host_dev_elsewhere(
        gpusim_node, cluster, start_agent, vfio_holders, tmp_path):
    node = gpusim_node("l40s:1")
    host_dev = str(tmp_path / "host" / "dev")    # the DaemonSet's /host/dev: only the agent has it
    agent = start_agent(node, cluster.api, argv_prefix=own_namespace_prefix(node.dev_root, host_dev),
                        ACCELOPS_VGPU_DEV_ROOT=host_dev, RESYNC_INTERVAL=600)
    agent.wait("success", "default")
    held = node.vfs(node.pfs()[0])[0]
    holder = vfio_holders(node, held, alias=str(tmp_path / "pod-dev"))   # QEMU's own /dev
    assert not holder.fd_target().startswith(host_dev)
    node.clear_log()
    agent.forget_status()
    cluster.select("L40S-12Q")
    status = agent.wait("failed", "L40S-12Q")
    assert held in status["reason"] and "pid %d" % holder.pid in status["reason"], status
    assert node.log() == []


def test_a_vm_that_opens_a_vf_during_the_operand_wait_stops_the_change_before_any_write(
        gpusim_node, cluster, start_agent, vfio_holders):
    cluster.api.reset(with_plugin_pod())
    node = gpusim_node("l40s:1")
    delete_plugin_pod(cluster)                           # first apply: nothing to wait for
    agent = start_agent(node, cluster.api, OPERAND_NAMESPACE="gpu-operator", OPERAND_WAIT_TIMEOUT=60,
                        RESYNC_INTERVAL=600)
    agent.wait("success", "default")
    cluster.api.reset(with_plugin_pod(cluster.labels()))  # the plugin is back; same node, same labels
    agent.wait("success", "default")
    node.clear_log()
    agent.forget_status()
    cluster.select("L40S-12Q")
    wait_for("the pause", lambda: cluster.labels().get(PLUGIN_LABEL) == PAUSED, timeout=60)
    held = node.vfs(node.pfs()[0])[0]
    holder = vfio_holders(node, held)                    # a virt-launcher starts its VM meanwhile
    delete_plugin_pod(cluster)
    status = agent.wait("failed", "L40S-12Q")
    assert held in status["reason"] and "became held" in status["reason"] and "pid %d" % holder.pid in \
        status["reason"], status
    assert node.log() == []
    assert cluster.labels()[PLUGIN_LABEL] == "true"


def test_the_operand_wait_runs_also_when_an_earlier_try_paused_the_operands(gpusim_node, cluster, start_agent):
    cluster.api.reset(with_plugin_pod())
    cluster.api.control("fail", {"method": "GET", "plural": "pods", "count": 1, "status": 503})
    node = gpusim_node("l40s:1")
    agent = start_agent(node, cluster.api, OPERAND_NAMESPACE="gpu-operator", OPERAND_WAIT_TIMEOUT=60)
    wait_for("a retry after the failed pod list", lambda: len(pod_lists(cluster)) >= 3, timeout=30)
    assert cluster.labels()[PLUGIN_LABEL] == PAUSED
    assert node.writes() == [] and agent.status() is None   # still waiting for the plugin pod
    delete_plugin_pod(cluster)
    agent.wait("success", "default")
    assert node.writes() and cluster.labels()[PLUGIN_LABEL] == "true"


def test_sigterm_ends_the_operand_wait_at_once_without_writes(gpusim_node, cluster, start_agent):
    cluster.api.reset(with_plugin_pod())
    node = gpusim_node("l40s:1")
    agent = start_agent(node, cluster.api, OPERAND_NAMESPACE="gpu-operator", OPERAND_WAIT_TIMEOUT=120)
    wait_for("the pause", lambda: cluster.labels().get(PLUGIN_LABEL) == PAUSED, timeout=60)
    started = time.monotonic()
    assert agent.stop() == 0
    assert time.monotonic() - started < 10, agent.output()
    assert node.writes() == []
    assert cluster.labels()[PLUGIN_LABEL] == "true"          # put back on the way out
    assert "stopped (SIGTERM) while waiting" in agent.output()


def test_a_node_created_again_is_reconciled_before_the_resync(gpusim_node, cluster, start_agent):
    node = gpusim_node("l40s:1")
    agent = start_agent(node, cluster.api, RESYNC_INTERVAL=600)
    agent.wait("success", "default")
    checks = agent.status()["checks"]
    again = agent_state(cluster.labels())                   # the same labels, a new object
    again["objects"][0]["body"]["metadata"]["uid"] = "created-again"
    cluster.api.reset(again)
    # what the watch delivers next is the new object (the double sends no DELETED/ADDED on a reset:
    # another client's write to it stands in for the ADDED event)
    cluster.api.control("patch", {"resource": NODES, "name": NODE, "patch": {"metadata": {"annotations": {"x": "y"}}}})
    wait_for("a reconcile of the new Node", lambda: (agent.status() or {}).get("checks", 0) > checks, timeout=20)


def test_removed_labels_the_agent_owns_come_back_before_the_resync(gpusim_node, cluster, start_agent):
    node = gpusim_node("l40s:1")
    agent = start_agent(node, cluster.api, RESYNC_INTERVAL=600)
    agent.wait("success", "default")
    owned = dict((k, v) for k, v in cluster.labels().items() if k == STATE_LABEL or k.startswith(PROFILE))
    assert owned[STATE_LABEL] == "success" and len(owned) > 1
    cluster.relabel(**dict((key, None) for key in owned))
    wait_for("the labels back", lambda: all(cluster.labels().get(k) == v for k, v in owned.items()), timeout=20)
    assert node.writes() == [] or all(w["result"] == "ok" for w in node.writes())


def test_a_429_with_retry_after_delays_the_retry_at_least_that_long(gpusim_node, cluster, start_agent):
    node = gpusim_node("l40s:1")
    cluster.api.control("fail", {"method": "PATCH", "plural": "nodes", "count": 1, "status": 429, "retry_after": 4})
    agent = start_agent(node, cluster.api)
    agent.wait("success", "default", timeout=60)
    patches = [r["time"] for r in cluster.api.log() if r["method"] == "PATCH" and r["path"].endswith("/" + NODE)]
    assert len(patches) >= 2
    assert patches[1] - patches[0] >= 3.9, (patches, agent.output())  # our own backoff: 1-1.2 s
