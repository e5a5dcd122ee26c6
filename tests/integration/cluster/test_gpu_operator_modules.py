"""gpu_operator_policy and node_labels against the API server double."""

from __future__ import annotations

from cluster_helpers import CLUSTER_POLICY, NODES, run_module

POLICY_ARGS = {"sandbox_workloads_enabled": True, "vgpu_device_manager_enabled": False,
               "vgpu_manager": {"enabled": True, "repository": "registry.example.com/nvidia", "version": "580.82.02"}}


def test_cluster_policy_fields_set_once_others_kept(cluster, kubeconfig):
    rc, result = run_module("gpu_operator_policy", dict(POLICY_ARGS, kubeconfig=kubeconfig))
    assert rc == 0 and result["changed"], result
    spec = cluster.get(CLUSTER_POLICY, "cluster-policy")["spec"]
    assert spec["sandboxWorkloads"] == {"enabled": True, "defaultWorkload": "container"}
    assert spec["vgpuManager"] == {"enabled": True, "image": "vgpu-manager", "repository": "registry.example.com/nvidia",
                                   "version": "580.82.02"}
    assert spec["vgpuDeviceManager"] == {"enabled": False, "config": {"default": "default"}}
    assert spec["operator"] == {"defaultRuntime": "containerd"}
    rc, again = run_module("gpu_operator_policy", dict(POLICY_ARGS, kubeconfig=kubeconfig))
    assert rc == 0 and again["changed"] is False


def test_cluster_policy_check_mode_and_os_suffix(cluster, kubeconfig):
    before = cluster.get(CLUSTER_POLICY, "cluster-policy")
    rc, result = run_module("gpu_operator_policy", dict(POLICY_ARGS, kubeconfig=kubeconfig), check=True, diff=True)
    assert rc == 0 and result["changed"] and result["diff"]["after"]["spec"]["sandboxWorkloads"] == {"enabled": True}
    assert cluster.get(CLUSTER_POLICY, "cluster-policy") == before
    assert all(w["dryRun"] == "All" for w in cluster.writes())
    cluster.clear_log()
    bad = dict(POLICY_ARGS, kubeconfig=kubeconfig, vgpu_manager={"version": "580.82.02-ubuntu24.04"})
    rc, result = run_module("gpu_operator_policy", bad)
    assert rc == 1 and result["msg"] == ("ClusterPolicy vgpuManager.version 580.82.02-ubuntu24.04: ends in an OS tag; "
                                         "the GPU Operator appends it per node, give 580.82.02")
    assert cluster.log() == []  # rejected before any request


def test_missing_cluster_policy_is_one_line(cluster, kubeconfig):
    rc, result = run_module("gpu_operator_policy", dict(POLICY_ARGS, kubeconfig=kubeconfig, name="nope"))
    assert rc == 1 and result["msg"].startswith("ClusterPolicy nope: not found (HTTP 404)")


def test_node_labels_present_then_absent_touch_only_ours(cluster, kubeconfig):
    args = {"kubeconfig": kubeconfig, "name": "gpu-a", "profiles": {"L40S-24Q": 2}, "sandbox_validator": False}
    rc, result = run_module("node_labels", args)
    assert rc == 0 and result["changed"], result
    labels = cluster.get(NODES, "gpu-a")["metadata"]["labels"]
    assert labels == {"kubernetes.io/hostname": "gpu-a", "team": "ml", "nvidia.com/gpu.workload.config": "vm-vgpu",
                      "accelops.io/vgpu.profile.L40S-24Q": "2", "nvidia.com/gpu.deploy.sandbox-validator": "false"}
    rc, again = run_module("node_labels", args)
    assert rc == 0 and again["changed"] is False
    rc, checked = run_module("node_labels", dict(args, state="absent"), check=True)
    assert rc == 0 and checked["changed"] and cluster.get(NODES, "gpu-a")["metadata"]["labels"] == labels
    rc, removed = run_module("node_labels", dict(args, state="absent"))
    assert rc == 0 and removed["changed"]
    assert cluster.get(NODES, "gpu-a")["metadata"]["labels"] == {"kubernetes.io/hostname": "gpu-a", "team": "ml"}


def test_node_label_conflict_is_retried_and_forbidden_is_one_line(cluster, kubeconfig):
    cluster.conflict(count=1, patch={"metadata": {"labels": {"other": "x"}}})
    rc, result = run_module("node_labels", {"kubeconfig": kubeconfig, "name": "gpu-b", "profiles": {"DC-48Q": 1}})
    assert rc == 0 and result["attempts"] == 2
    labels = cluster.get(NODES, "gpu-b")["metadata"]["labels"]
    assert labels["other"] == "x" and labels["accelops.io/vgpu.profile.DC-48Q"] == "1"
    cluster.forbid("PATCH", "nodes")
    rc, result = run_module("node_labels", {"kubeconfig": kubeconfig, "name": "gpu-b", "profiles": {"DC-24Q": 2}})
    assert rc == 1 and result["msg"].startswith("Node gpu-b: forbidden (HTTP 403): ")
