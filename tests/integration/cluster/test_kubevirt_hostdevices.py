"""kubevirt_hostdevices against the API server double, through the real kubernetes client."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from cluster_helpers import (COLLECTIONS, DEPLOYMENTS, FOREIGN_MDEV, FOREIGN_NIC, FOREIGN_T4, KUBEVIRT, MODULES,
                             INJECT_INVOCATION, RESOURCES, TOKEN, default_state, kubeconfig_dict, kubevirt_cr, run_module)

L40S = {"pci_vendor_selector": "10de:26b9", "resource_name": "nvidia.com/NVIDIA_L40S-24Q"}
L40S_ENTRY = {"pciVendorSelector": "10DE:26B9", "resourceName": "nvidia.com/NVIDIA_L40S-24Q"}
A10_MDEV = {"mdev_name_selector": "NVIDIA A10-4Q", "resource_name": "nvidia.com/NVIDIA_A10-4Q",
            "external_resource_provider": True}


def stored_cr(cluster):
    return cluster.get(KUBEVIRT, "kubevirt", "kubevirt")


def configuration(cluster):
    return stored_cr(cluster)["spec"]["configuration"]


def test_adds_then_removes_by_resource_name_keeping_foreign_entries(cluster, kubeconfig):
    args = {"kubeconfig": kubeconfig, "pci_host_devices": [L40S], "mediated_devices": [A10_MDEV]}
    rc, result = run_module("kubevirt_hostdevices", args)
    assert rc == 0 and result["changed"], result
    conf = configuration(cluster)
    assert conf["permittedHostDevices"]["pciHostDevices"] == [FOREIGN_T4, FOREIGN_NIC, L40S_ENTRY]
    assert conf["permittedHostDevices"]["mediatedDevices"] == [FOREIGN_MDEV, {
        "mdevNameSelector": "NVIDIA A10-4Q", "resourceName": "nvidia.com/NVIDIA_A10-4Q",
        "externalResourceProvider": True}]
    assert conf["developerConfiguration"]["featureGates"] == ["LiveMigration", "HostDevices"]
    assert conf["evictionStrategy"] == "LiveMigrate"
    assert result["kubevirt"] == {"name": "kubevirt", "namespace": "kubevirt", "version": "v1.9.0"}

    rc, again = run_module("kubevirt_hostdevices", args)
    assert rc == 0 and again["changed"] is False and again["changes"] == []

    rc, removed = run_module("kubevirt_hostdevices", {
        "kubeconfig": kubeconfig, "state": "absent", "pci_host_devices": [{"resource_name": L40S["resource_name"]}],
        "mediated_devices": [{"resource_name": A10_MDEV["resource_name"]}]})
    assert rc == 0 and removed["changed"]
    conf = configuration(cluster)
    assert conf["permittedHostDevices"] == {"pciHostDevices": [FOREIGN_T4, FOREIGN_NIC],
                                            "mediatedDevices": [FOREIGN_MDEV]}
    assert conf["developerConfiguration"]["featureGates"] == ["LiveMigration", "HostDevices"]


def test_exclusive_vendor_removes_other_nvidia_pci_entries(cluster, kubeconfig):
    rc, result = run_module("kubevirt_hostdevices", {"kubeconfig": kubeconfig, "pci_host_devices": [L40S],
                                                     "exclusive_pci_vendors": ["10DE"]})
    assert rc == 0 and result["changed"]
    assert configuration(cluster)["permittedHostDevices"]["pciHostDevices"] == [FOREIGN_NIC, L40S_ENTRY]


def test_conflict_on_first_write_is_retried_and_keeps_the_concurrent_change(cluster, kubeconfig):
    racer = {"spec": {"configuration": {"permittedHostDevices": {
        "pciHostDevices": [FOREIGN_T4, FOREIGN_NIC, {"pciVendorSelector": "15B3:101E", "resourceName": "mlx/vf"}]}}}}
    cluster.conflict(count=1, patch=racer)
    rc, result = run_module("kubevirt_hostdevices", {"kubeconfig": kubeconfig, "pci_host_devices": [L40S]})
    assert rc == 0 and result["changed"] and result["attempts"] == 2, result
    pci = configuration(cluster)["permittedHostDevices"]["pciHostDevices"]
    expected = ["nvidia.com/TU104GL_Tesla_T4", "intel.com/x710", "mlx/vf", "nvidia.com/NVIDIA_L40S-24Q"]
    assert [e["resourceName"] for e in pci] == expected
    patches = [w for w in cluster.writes() if w["method"] == "PATCH"]
    assert len(patches) == 2


def test_conflicts_beyond_the_retry_budget_fail_clearly(cluster, kubeconfig):
    cluster.conflict(count=3)
    rc, result = run_module("kubevirt_hostdevices", {"kubeconfig": kubeconfig, "pci_host_devices": [L40S],
                                                     "conflict_retries": 2})
    assert rc == 1
    assert result["msg"].startswith("KubeVirt kubevirt/kubevirt: conflict (HTTP 409): Operation cannot be fulfilled")
    assert result["msg"].endswith("(gave up after 3 attempts)")
    assert L40S_ENTRY not in configuration(cluster)["permittedHostDevices"]["pciHostDevices"]


@pytest.mark.parametrize("dry_run", ["server", "client"])
def test_check_mode_sends_no_mutating_request_and_predicts_changed(cluster, kubeconfig, dry_run):
    before = stored_cr(cluster)
    args = {"kubeconfig": kubeconfig, "pci_host_devices": [L40S], "dry_run": dry_run}
    rc, result = run_module("kubevirt_hostdevices", args, check=True, diff=True)
    assert rc == 0 and result["changed"] is True
    assert result["diff"]["after"]["permittedHostDevices"]["pciHostDevices"][-1] == L40S_ENTRY
    assert result["diff"]["before"]["featureGates"] == ["LiveMigration"]
    assert stored_cr(cluster) == before
    writes = cluster.writes()
    assert all(w["dryRun"] == "All" for w in writes), writes
    assert len(writes) == (1 if dry_run == "server" else 0)


def test_no_diff_key_without_diff_mode(cluster, kubeconfig):
    rc, result = run_module("kubevirt_hostdevices", {"kubeconfig": kubeconfig, "pci_host_devices": [L40S]})
    assert rc == 0 and "diff" not in result


def test_old_kubevirt_with_vendor_vfio_fails_unless_overridden(cluster, kubeconfig):
    state = default_state()
    state["objects"][0]["body"] = kubevirt_cr("v1.8.2")
    cluster.reset(state)
    args = {"kubeconfig": kubeconfig, "pci_host_devices": [L40S]}
    rc, result = run_module("kubevirt_hostdevices", args)
    assert rc == 1
    assert result["msg"] == ("KubeVirt kubevirt/kubevirt: KubeVirt v1.8.2 cannot serve nvidia-bound vGPU VFs "
                             "(needs KubeVirt >= 1.9.0); upgrade, or set skip_version_check if its virt-handler "
                             "carries PR #16890")
    assert cluster.writes() == []

    rc, plain = run_module("kubevirt_hostdevices", {"kubeconfig": kubeconfig, "pci_host_devices": [
        dict(L40S, vendor_vfio=False)]})
    assert rc == 0 and plain["changed"]

    rc, skipped = run_module("kubevirt_hostdevices", dict(args, skip_version_check=True))
    assert rc == 0 and skipped["changed"] is False  # the entry is there from the plain run
    assert "KubeVirt version check skipped (deployed: v1.8.2)" in str(skipped.get("warnings"))

    rc, lowered = run_module("kubevirt_hostdevices", dict(args, minimum_version="1.8.2"))
    assert rc == 0, lowered


def test_missing_crd_missing_cr_and_two_crs_are_one_line_each(cluster, kubeconfig):
    cluster.reset({"resources": {}, "objects": []})
    rc, result = run_module("kubevirt_hostdevices", {"kubeconfig": kubeconfig, "pci_host_devices": [L40S]})
    assert rc == 1 and result["msg"] == ("KubeVirt CRD kubevirts.kubevirt.io: not served by the API server "
                                         "(HTTP 404); is KubeVirt installed?")

    cluster.reset({"resources": RESOURCES, "objects": []})
    rc, result = run_module("kubevirt_hostdevices", {"kubeconfig": kubeconfig, "pci_host_devices": [L40S]})
    assert rc == 1 and result["msg"] == "KubeVirt */*: no KubeVirt CR found (is KubeVirt installed?)"

    rc, result = run_module("kubevirt_hostdevices", {"kubeconfig": kubeconfig, "name": "kubevirt",
                                                     "namespace": "kubevirt", "pci_host_devices": [L40S]})
    assert rc == 1 and result["msg"].startswith("KubeVirt kubevirt/kubevirt: not found (HTTP 404)")

    cluster.reset({"resources": RESOURCES, "objects": [
        {"resource": KUBEVIRT, "namespace": ns, "name": "kubevirt", "body": kubevirt_cr(namespace=ns)}
        for ns in ("kubevirt", "virt2")]})
    rc, result = run_module("kubevirt_hostdevices", {"kubeconfig": kubeconfig, "pci_host_devices": [L40S]})
    assert rc == 1 and result["msg"] == ("KubeVirt */*: 2 KubeVirt CRs found (kubevirt/kubevirt, virt2/kubevirt); "
                                         "set name and namespace to pick one")
    rc, result = run_module("kubevirt_hostdevices", {"kubeconfig": kubeconfig, "namespace": "virt2",
                                                     "pci_host_devices": [L40S]})
    assert rc == 0 and result["kubevirt"]["namespace"] == "virt2"
    assert "\n" not in result.get("msg", "")


def test_forbidden_patch_is_one_line_and_writes_nothing(cluster, kubeconfig):
    cluster.forbid("PATCH", "kubevirts")
    rc, result = run_module("kubevirt_hostdevices", {"kubeconfig": kubeconfig, "pci_host_devices": [L40S]})
    assert rc == 1
    assert result["msg"].startswith("KubeVirt kubevirt/kubevirt: forbidden (HTTP 403): kubevirts \"kubevirt\" is "
                                    "forbidden: User \"system:serviceaccount:test:ansible\" cannot patch")
    assert "\n" not in result["msg"]
    assert L40S_ENTRY not in configuration(cluster)["permittedHostDevices"]["pciHostDevices"]


@pytest.mark.parametrize("kubeconfig_arg, message", [
    ("/nonexistent/kubeconfig", "kubeconfig /nonexistent/kubeconfig: file not found"),
    ({"apiVersion": "v1", "kind": "Config", "users": [{"name": "u", "user": {"token": TOKEN}}]},
     "kubeconfig (dict): no context to use (current-context is not set and no context option was given)"),
])
def test_bad_kubeconfig_is_one_line(cluster, kubeconfig_arg, message):
    rc, result = run_module("kubevirt_hostdevices", {"kubeconfig": kubeconfig_arg, "pci_host_devices": [L40S]})
    raw = result["_raw"]
    assert rc == 1 and result["msg"].startswith(message) and "\n" not in result["msg"], result["msg"]
    assert TOKEN not in raw
    assert cluster.log() == []


def test_bad_selector_fails_before_any_write(cluster, kubeconfig):
    rc, result = run_module("kubevirt_hostdevices", {"kubeconfig": kubeconfig, "pci_host_devices": [
        {"pci_vendor_selector": "10de26b9", "resource_name": "nvidia.com/x"}]})
    assert rc == 1 and result["msg"] == ("pciHostDevices nvidia.com/x: pciVendorSelector '10DE26B9' is not "
                                         "VVVV:DDDD (e.g. 10DE:26B9)")
    assert cluster.writes() == []


def test_dict_kubeconfig_token_never_appears_in_output(cluster):
    args = {"kubeconfig": kubeconfig_dict(cluster.url), "pci_host_devices": [L40S]}
    # ask for the invocation (module args) in the result, as ansible-playbook -vvv does
    rc, result = run_module("kubevirt_hostdevices", dict(args, **INJECT_INVOCATION), diff=True)
    raw = result["_raw"]
    assert rc == 0 and result["changed"]
    assert TOKEN not in raw
    assert result["invocation"]["module_args"]["kubeconfig"]["users"][0]["user"]["token"] == "VALUE_SPECIFIED_IN_NO_LOG_PARAMETER"


def test_env_vars_configure_the_connection(cluster):
    rc, result = run_module("kubevirt_hostdevices", {"pci_host_devices": [L40S]},
                            env={"K8S_AUTH_HOST": cluster.url, "K8S_AUTH_API_KEY": TOKEN,
                                 "K8S_AUTH_VERIFY_SSL": "no"})
    assert rc == 0 and result["changed"], result


def test_unreachable_api_server_is_one_line(cluster):
    rc, result = run_module("kubevirt_hostdevices", {"host": "http://127.0.0.1:9", "pci_host_devices": [L40S]})
    assert rc == 1 and result["msg"].startswith("KubeVirt CRs: cannot reach the Kubernetes API: ")
    assert "\n" not in result["msg"]


def test_virt_handler_image_override_on_the_virt_operator_deployment(cluster, kubeconfig):
    # fields the installed kubernetes client's model does not know (a newer API server's) must survive
    state = default_state()
    deployment = next(o for o in state["objects"] if o["name"] == "virt-operator")["body"]
    operator = deployment["spec"]["template"]["spec"]["containers"][0]
    operator["futureContainerField"] = {"mode": "x"}
    operator["env"][0]["futureEnvField"] = True
    cluster.reset(state)
    image = "registry.example.com/kubevirt/virt-handler:v1.8.2-sriov-vgpu"
    args = {"kubeconfig": kubeconfig, "virt_handler_image": image}
    rc, checked = run_module("kubevirt_hostdevices", args, check=True, diff=True)
    assert rc == 0 and checked["changed"] and checked["diff"]["after"]["virtHandlerImage"] == image
    assert all(w["dryRun"] == "All" for w in cluster.writes())
    rc, result = run_module("kubevirt_hostdevices", args)
    assert rc == 0 and result["changed"]
    assert "Deployment kubevirt/virt-operator: set VIRT_HANDLER_IMAGE=" + image in result["changes"]
    containers = cluster.get(DEPLOYMENTS, "virt-operator", "kubevirt")["spec"]["template"]["spec"]["containers"]
    assert containers[0]["env"][-1] == {"name": "VIRT_HANDLER_IMAGE", "value": image}
    assert containers[0]["env"][0]["name"] == "OPERATOR_IMAGE" and containers[1]["name"] == "sidecar"
    assert containers[0]["futureContainerField"] == {"mode": "x"} and containers[0]["env"][0]["futureEnvField"] is True
    assert {w["contentType"] for w in cluster.writes()} == {"application/json-patch+json"}
    rc, again = run_module("kubevirt_hostdevices", args)
    assert rc == 0 and again["changed"] is False
    rc, removed = run_module("kubevirt_hostdevices", dict(args, virt_handler_image=""))
    assert rc == 0 and removed["changed"]
    env = cluster.get(DEPLOYMENTS, "virt-operator", "kubevirt")["spec"]["template"]["spec"]["containers"][0]["env"]
    assert [e["name"] for e in env] == ["OPERATOR_IMAGE"] and env[0]["futureEnvField"] is True


@pytest.mark.parametrize("auth, scheme", [({"api_key": TOKEN}, "Bearer"),
                                          ({"username": "admin", "password": TOKEN}, "Basic")])
def test_explicit_host_credentials_and_impersonation_reach_the_server(cluster, auth, scheme):
    args = dict(auth, host=cluster.url, validate_certs=False, impersonate_user="alice",
                impersonate_groups=["vgpu-admins"], pci_host_devices=[L40S])
    rc, result = run_module("kubevirt_hostdevices", args)
    assert rc == 0 and result["changed"] and TOKEN not in result["_raw"]
    assert {(r["auth"], tuple(r["impersonate"])) for r in cluster.log()} == {(scheme, ("alice", "vgpu-admins"))}


def test_missing_kubernetes_library_is_named():
    payload = json.dumps({"ANSIBLE_MODULE_ARGS": {"pci_host_devices": [L40S]}})
    code = ("import sys, runpy; sys.modules['kubernetes'] = None; "
            "runpy.run_module('%skubevirt_hostdevices', run_name='__main__')" % MODULES)
    proc = subprocess.run([sys.executable, "-c", code], input=payload, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(COLLECTIONS)), timeout=60, check=False)
    result = json.loads(proc.stdout)
    assert proc.returncode == 1 and "Failed to import the required Python library (kubernetes)" in result["msg"]


HAND_WRITTEN = {"pciVendorSelector": "10DE:26B9", "resourceName": "nvidia.com/L40S-24Q"}


def with_hand_written_entry(cluster):
    """The CR a runbook leaves behind: the L40S VFs already permitted under another name."""
    state = default_state()
    state["objects"][0]["body"]["spec"]["configuration"]["permittedHostDevices"]["pciHostDevices"].append(HAND_WRITTEN)
    cluster.reset(state)


def test_a_hand_written_entry_for_the_same_vfs_fails_before_any_write(cluster, kubeconfig):
    with_hand_written_entry(cluster)
    for check in (True, False):
        rc, result = run_module("kubevirt_hostdevices", {"kubeconfig": kubeconfig, "pci_host_devices": [L40S]},
                                check=check)
        assert rc == 1 and cluster.writes() == []
        assert result["msg"] == (
            "KubeVirt kubevirt/kubevirt pciHostDevices: pciVendorSelector 10DE:26B9 is permitted as nvidia.com/L40S-24Q "
            "and would also be as nvidia.com/NVIDIA_L40S-24Q (two device plugins advertising the same devices); "
            "list nvidia.com/L40S-24Q in take_over to replace it")


def test_take_over_replaces_the_hand_written_entry_and_check_mode_shows_it(cluster, kubeconfig):
    with_hand_written_entry(cluster)
    args = {"kubeconfig": kubeconfig, "pci_host_devices": [L40S], "take_over": ["nvidia.com/L40S-24Q"]}
    rc, check = run_module("kubevirt_hostdevices", args, check=True, diff=True)
    assert rc == 0 and check["changed"] and all(w["dryRun"] == "All" for w in cluster.writes())
    assert HAND_WRITTEN in check["diff"]["before"]["permittedHostDevices"]["pciHostDevices"]
    assert check["diff"]["after"]["permittedHostDevices"]["pciHostDevices"] == [FOREIGN_T4, FOREIGN_NIC, L40S_ENTRY]
    assert HAND_WRITTEN in configuration(cluster)["permittedHostDevices"]["pciHostDevices"]
    rc, real = run_module("kubevirt_hostdevices", args, diff=True)
    assert rc == 0 and real["diff"] == check["diff"] and real["changes"] == check["changes"]
    assert "pciHostDevices: remove nvidia.com/L40S-24Q (taken over by nvidia.com/NVIDIA_L40S-24Q)" in real["changes"]
    assert configuration(cluster)["permittedHostDevices"]["pciHostDevices"] == [FOREIGN_T4, FOREIGN_NIC, L40S_ENTRY]
    rc, again = run_module("kubevirt_hostdevices", args)
    assert rc == 0 and not again["changed"]
