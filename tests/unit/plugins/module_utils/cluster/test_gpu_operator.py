"""GPU Operator planning: ClusterPolicy leaves, OS-suffix rule, node label ownership."""

from __future__ import annotations

import json

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.cluster import gpu_operator as gpo

POLICY = {"metadata": {"name": "cluster-policy", "resourceVersion": "5"},
          "spec": {"sandboxWorkloads": {"enabled": False, "defaultWorkload": "container"},
                   "vgpuManager": {"enabled": False, "image": "vgpu-manager"},
                   "driver": {"enabled": True}}}


def test_policy_patch_carries_only_changed_leaves_and_the_resource_version():
    desired = gpo.policy_spec_from_params({"sandbox_workloads_enabled": True, "vgpu_device_manager_enabled": False,
                                           "vgpu_manager": {"enabled": True, "image": "vgpu-manager",
                                                            "version": "580.82.02", "repository": None}})
    plan = gpo.plan_cluster_policy(POLICY, desired)
    assert plan.patch == {"metadata": {"resourceVersion": "5"}, "spec": {
        "sandboxWorkloads": {"enabled": True}, "vgpuDeviceManager": {"enabled": False},
        "vgpuManager": {"enabled": True, "version": "580.82.02"}}}
    assert plan.before["vgpuManager"] == {"enabled": False, "image": "vgpu-manager", "version": None}
    assert "ClusterPolicy cluster-policy: sandboxWorkloads.enabled False -> True" in plan.changes


def test_policy_already_matching_plans_nothing():
    assert not gpo.plan_cluster_policy(POLICY, {"sandboxWorkloads": {"enabled": False}}).changed


@pytest.mark.parametrize("version", ["580.82.02-ubuntu24.04", "550.90.05-rhel9.4", "570.1-rhcos4.16"])
def test_version_with_os_suffix_is_rejected(version):
    with pytest.raises(gpo.GpuOperatorError, match=r"ClusterPolicy vgpuManager.version %s: ends in an OS tag; the "
                                                   r"GPU Operator appends it per node, give " % version):
        gpo.plan_cluster_policy(POLICY, {"vgpuManager": {"version": version}})


@pytest.mark.parametrize("version", ["580.82.02", "sha256:0123abcd", "R580-beta"])
def test_plain_versions_and_digests_pass(version):
    assert gpo.plan_cluster_policy(POLICY, {"vgpuManager": {"version": version}}).changed


def node(labels, rv="3"):
    return {"metadata": {"name": "gpu-a", "resourceVersion": rv, "labels": labels}}


def test_profile_labels_set_and_stale_ones_removed_foreign_kept():
    current = {"team": "ml", "accelops.io/vgpu.profile.L40S-48Q": "1", "nvidia.com/gpu.present": "true"}
    desired = {gpo.WORKLOAD_LABEL: "vm-vgpu", **gpo.profile_labels({"L40S-24Q": 2})}
    plan = gpo.plan_node_labels(node(current), desired, gpo.DEFAULT_PROFILE_PREFIX)
    assert plan.patch == {"metadata": {"resourceVersion": "3", "labels": {
        "accelops.io/vgpu.profile.L40S-24Q": "2", "accelops.io/vgpu.profile.L40S-48Q": None,
        gpo.WORKLOAD_LABEL: "vm-vgpu"}}}
    again = dict(current, **desired)
    del again["accelops.io/vgpu.profile.L40S-48Q"]
    assert not gpo.plan_node_labels(node(again), desired, gpo.DEFAULT_PROFILE_PREFIX).changed


def test_absent_removes_ours_but_not_a_workload_label_someone_else_set():
    current = {"team": "ml", "accelops.io/vgpu.profile.L40S-24Q": "2", gpo.WORKLOAD_LABEL: "vm-passthrough",
               gpo.SANDBOX_VALIDATOR_LABEL: "false"}
    desired = {gpo.WORKLOAD_LABEL: "vm-vgpu", gpo.SANDBOX_VALIDATOR_LABEL: "false"}
    plan = gpo.plan_node_labels(node(current), desired, gpo.DEFAULT_PROFILE_PREFIX, "absent", dict(desired))
    assert plan.patch["metadata"]["labels"] == {"accelops.io/vgpu.profile.L40S-24Q": None,
                                                gpo.SANDBOX_VALIDATOR_LABEL: None}


@pytest.mark.parametrize("labels, message", [
    ({"accelops.io/vgpu.profile.L40S 24Q": "1"}, "is not a valid Kubernetes label key"),
    ({"accelops.io/vgpu.profile." + "x" * 60: "1"}, "is not a valid Kubernetes label key"),
    ({"team": "a b"}, "label team value 'a b' is not a valid Kubernetes label value"),
])
def test_invalid_labels_fail_naming_the_node(labels, message):
    with pytest.raises(gpo.GpuOperatorError, match="Node gpu-a: .*" + message):
        gpo.plan_node_labels(node({}), labels, gpo.DEFAULT_PROFILE_PREFIX)


def test_the_vgpu_device_manager_deploy_switch_is_ours_only_while_it_holds_our_value():
    desired = gpo.node_desired_labels({"workload_config": "vm-vgpu", "vgpu_device_manager": False})
    assert desired == {gpo.WORKLOAD_LABEL: "vm-vgpu", gpo.VGPU_DEVICE_MANAGER_LABEL: "false"}
    set_by_us = gpo.plan_node_labels(node({}), desired, gpo.DEFAULT_PROFILE_PREFIX)
    assert set_by_us.patch["metadata"]["labels"][gpo.VGPU_DEVICE_MANAGER_LABEL] == "false"
    theirs = {gpo.VGPU_DEVICE_MANAGER_LABEL: "true"}
    removed = gpo.plan_node_labels(node(theirs), desired, gpo.DEFAULT_PROFILE_PREFIX, "absent", dict(desired))
    assert not removed.changed


def annotated(labels, switches):
    obj = node(labels)
    obj["metadata"]["annotations"] = {gpo.SWITCHES_ANNOTATION: json.dumps(switches)}
    return obj


def test_a_deploy_switch_we_set_is_recorded_and_released_when_no_longer_wanted():
    wanted = gpo.node_desired_labels({"workload_config": "vm-vgpu", "sandbox_validator": False})
    set_by_us = gpo.plan_node_labels(node({}), wanted, gpo.DEFAULT_PROFILE_PREFIX)
    meta = set_by_us.patch["metadata"]
    assert meta["labels"][gpo.SANDBOX_VALIDATOR_LABEL] == "false"
    assert json.loads(meta["annotations"][gpo.SWITCHES_ANNOTATION]) == {gpo.SANDBOX_VALIDATOR_LABEL: "false"}
    # the node is no longer all vendor-VFIO: the role stops asking for the switch and releases it
    now = annotated({gpo.WORKLOAD_LABEL: "vm-vgpu", gpo.SANDBOX_VALIDATOR_LABEL: "false"},
                    {gpo.SANDBOX_VALIDATOR_LABEL: "false"})
    plan = gpo.plan_node_labels(now, {gpo.WORKLOAD_LABEL: "vm-vgpu"}, gpo.DEFAULT_PROFILE_PREFIX,
                                release=[gpo.SANDBOX_VALIDATOR_LABEL])
    assert plan.patch["metadata"]["labels"] == {gpo.SANDBOX_VALIDATOR_LABEL: None}
    assert plan.patch["metadata"]["annotations"] == {gpo.SWITCHES_ANNOTATION: "{}"}
    assert plan.changes == ["Node gpu-a: remove %s" % gpo.SANDBOX_VALIDATOR_LABEL]


@pytest.mark.parametrize("labels, switches", [
    ({gpo.SANDBOX_VALIDATOR_LABEL: "false"}, {}),                                   # someone else set it
    ({gpo.SANDBOX_VALIDATOR_LABEL: "true"}, {gpo.SANDBOX_VALIDATOR_LABEL: "false"}),  # changed since
])
def test_a_switch_we_did_not_set_or_that_changed_since_stays(labels, switches):
    plan = gpo.plan_node_labels(annotated(labels, switches), {}, gpo.DEFAULT_PROFILE_PREFIX,
                                release=[gpo.SANDBOX_VALIDATOR_LABEL])
    assert gpo.SANDBOX_VALIDATOR_LABEL not in ((plan.patch or {}).get("metadata", {}).get("labels") or {})


def test_recording_is_idempotent():
    wanted = {gpo.SANDBOX_VALIDATOR_LABEL: "false"}
    now = annotated(dict(wanted), dict(wanted))
    now["metadata"]["annotations"][gpo.SWITCHES_ANNOTATION] = json.dumps(wanted, separators=(",", ":"))
    assert not gpo.plan_node_labels(now, wanted, gpo.DEFAULT_PROFILE_PREFIX).changed
