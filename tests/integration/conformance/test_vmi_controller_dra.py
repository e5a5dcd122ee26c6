"""The fake KubeVirt controller's DRA step (tests/fakes/vmi_controller.py) against the API server double: it must
allocate claims the way kube-scheduler's DynamicResources plugin does, or the conformance verdicts mean nothing."""

from __future__ import annotations

import json
import time
import urllib.request

import pytest

from ansible_collections.accelops.vgpu.tests.fakes.vmi_controller import DELETE_PROTECTION
from ansible_collections.accelops.vgpu.tests.integration.conformance.conformance_helpers import (
    CLAIMS, SLICES, VMIS, healthy_state, stored)

NS = "default"
PROFILE = 'device.attributes["vgpu.accelops.io"].profile == "%s"'


def claim(name, expression, count=1, device_class="vgpu.accelops.io"):
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name, "namespace": NS},
            "spec": {"devices": {"requests": [{"name": "vgpu", "exactly": {
                "deviceClassName": device_class, "count": count, "selectors": [{"cel": {"expression": expression}}]}}]}}}


def vmi(name, claim_name, node="gpu-a"):
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": name, "namespace": NS, "uid": "uid-" + name},   # seeded objects carry no uid
            "spec": {"nodeSelector": {"kubernetes.io/hostname": node},
                     "resourceClaims": [{"name": "vgpu", "resourceClaimName": claim_name}],
                     "domain": {"devices": {"gpus": [{"name": "g", "claimName": "vgpu", "requestName": "vgpu"}]}}}}


def seeded(cluster, pairs, state=None):
    """The healthy cluster (our driver publishing) plus claims and their VMIs."""
    state = state or healthy_state()
    state["resources"][CLAIMS]["verbs"].append("watch")
    for claim_body, vmi_body in pairs:
        state["objects"].append({"resource": CLAIMS, "namespace": NS, "name": claim_body["metadata"]["name"],
                                 "body": claim_body})
        if vmi_body:
            state["objects"].append({"resource": VMIS, "namespace": NS, "name": vmi_body["metadata"]["name"],
                                     "body": vmi_body})
    cluster.reset(state)


def until(test, timeout=10):
    deadline = time.monotonic() + timeout
    while True:
        value = test()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


def phase(cluster, name):
    return ((stored(cluster, VMIS, name, NS) or {}).get("status") or {}).get("phase")


def results(cluster, name):
    status = (stored(cluster, CLAIMS, name, NS) or {}).get("status") or {}
    return [(r["pool"], r["device"]) for r in ((status.get("allocation") or {}).get("devices") or {}).get("results") or []]


def delete(cluster, path):
    req = urllib.request.Request(cluster.url + path, method="DELETE")
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.load(resp)


def test_claims_get_distinct_devices_the_selectors_pick_reserved_for_the_vmi_with_delete_protection(
        cluster, controller):
    seeded(cluster, [(claim("c%d" % i, PROFILE % "L40S-24Q"), vmi("v%d" % i, "c%d" % i)) for i in range(2)]
           + [(claim("b", PROFILE % "A16-4Q"), vmi("vb", "b", node="gpu-b")),
              (claim("wrong", PROFILE % "A16-4Q"), vmi("vw", "wrong", node="gpu-a"))])   # no A16 on gpu-a
    controller()
    assert until(lambda: all(phase(cluster, n) == "Running" for n in ("v0", "v1", "vb"))), cluster.stored()
    assert phase(cluster, "vw") == "Pending" and results(cluster, "wrong") == []
    got = results(cluster, "c0") + results(cluster, "c1")
    assert sorted(got) == [("gpu-a/vgpu.accelops.io", "l40s-24q-0000-41-00-4"),     # slices.pool_name
                           ("gpu-a/vgpu.accelops.io", "l40s-24q-0000-41-00-5")]
    assert results(cluster, "b")[0][0] == "gpu-b/vgpu.accelops.io" and results(cluster, "b")[0][1].startswith("a16-4q-")
    stored_claim = stored(cluster, CLAIMS, "c0", NS)
    assert stored_claim["status"]["reservedFor"] == [{"resource": "pods", "name": "virt-launcher-v0", "uid": "uid-v0"}]
    assert stored_claim["status"]["allocation"]["nodeSelector"] == {"nodeSelectorTerms": [{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": ["gpu-a"]}]}]}
    assert stored_claim["metadata"]["finalizers"] == [DELETE_PROTECTION]


def test_no_free_device_leaves_the_claim_unallocated_and_the_vmi_unschedulable(cluster, controller):
    seeded(cluster, [(claim("big", PROFILE % "L40S-24Q", count=5), vmi("v", "big"))])
    controller()
    assert until(lambda: (stored(cluster, VMIS, "v", NS).get("status") or {}).get("conditions"))
    time.sleep(0.5)
    assert phase(cluster, "v") == "Pending" and results(cluster, "big") == []
    assert stored(cluster, VMIS, "v", NS)["status"]["conditions"][0]["message"] == (
        "0/3 nodes are available: 1 cannot allocate all claims, 2 node(s) didn't match Pod's node affinity/selector")


def test_a_cel_runtime_error_fails_the_allocation_with_the_error(cluster, controller):
    seeded(cluster, [(claim("c", 'device.attributes["vgpu.accelops.io"].noSuchAttribute == "x"'), vmi("v", "c"))])
    controller()
    assert until(lambda: (stored(cluster, VMIS, "v", NS).get("status") or {}).get("conditions"))
    message = stored(cluster, VMIS, "v", NS)["status"]["conditions"][0]["message"]
    assert "claim default/c, request vgpu: selector #0: CEL runtime error" in message
    assert results(cluster, "c") == []


@pytest.mark.parametrize("change, said", [
    (lambda body: body["spec"]["devices"].update(constraints=[{"requests": ["vgpu"], "matchAttribute":
                                                               "vgpu.accelops.io/parentGPU"}]),
     "claim default/c: constraints are not modelled by the test double"),
    (lambda body: body["spec"]["devices"]["requests"][0]["exactly"].update(adminAccess=True),
     "claim default/c, request vgpu: adminAccess is not modelled by the test double"),
])
def test_a_claim_with_constraints_or_admin_access_is_refused_never_allocated_as_if_plain(
        cluster, controller, change, said):
    body = claim("c", PROFILE % "L40S-24Q")
    change(body)
    seeded(cluster, [(body, vmi("v", "c"))])
    controller()
    assert until(lambda: (stored(cluster, VMIS, "v", NS).get("status") or {}).get("conditions"))
    assert said in stored(cluster, VMIS, "v", NS)["status"]["conditions"][0]["message"]
    assert phase(cluster, "v") == "Pending" and results(cluster, "c") == []


def test_only_the_newest_complete_generation_of_a_pool_is_allocated(cluster, controller):
    state = healthy_state()
    for item in state["objects"]:
        if item["resource"] == SLICES and item["body"]["spec"]["nodeName"] == "gpu-a":
            item["body"]["spec"]["pool"]["resourceSliceCount"] = 2   # the second slice is missing
    seeded(cluster, [(claim("c", PROFILE % "L40S-24Q"), vmi("v", "c"))], state)
    controller()
    assert until(lambda: (stored(cluster, VMIS, "v", NS).get("status") or {}).get("conditions"))
    assert results(cluster, "c") == [] and phase(cluster, "v") == "Pending"


def test_a_vmi_gone_releases_its_claim_and_a_claim_deleted_in_use_waits_for_it(cluster, controller):
    seeded(cluster, [(claim("c", PROFILE % "L40S-24Q"), vmi("v", "c"))])
    controller()
    assert until(lambda: phase(cluster, "v") == "Running")
    answer = delete(cluster, "/apis/resource.k8s.io/v1/namespaces/%s/resourceclaims/c" % NS)
    assert answer["metadata"]["deletionTimestamp"]          # delete protection: still there while in use
    time.sleep(0.4)
    assert results(cluster, "c") != []
    delete(cluster, "/apis/kubevirt.io/v1/namespaces/%s/virtualmachineinstances/v" % NS)
    assert until(lambda: stored(cluster, CLAIMS, "c", NS) is None)   # released, finalizer removed, gone


TEMPLATES = "resource.k8s.io/v1/resourceclaimtemplates"


def template_vmi(name, template, claim_name="vgpu"):
    body = vmi(name, None)
    body["spec"]["resourceClaims"] = [{"name": claim_name, "resourceClaimTemplateName": template}]
    body["spec"]["domain"]["devices"]["gpus"][0]["claimName"] = claim_name
    return body


def test_a_template_claim_is_made_for_the_launcher_pod_as_the_resourceclaim_controller_makes_it(cluster, controller):
    """kubernetes pkg/controller/resourceclaim/controller.go handleClaim: generateName <pod>-<claim>- (both cut in
    proportion past 57 characters), the pod its controlling owner, the template's labels and annotations plus
    pod-claim-name, the template's spec; one claim per pod claim, however often the controller passes."""
    state = healthy_state()
    state["resources"][TEMPLATES] = {"kind": "ResourceClaimTemplate", "singular": "resourceclaimtemplate",
                                     "namespaced": True, "verbs": ["get", "list"]}
    spec = claim("t", PROFILE % "L40S-24Q")["spec"]
    state["objects"].append({"resource": TEMPLATES, "namespace": NS, "name": "t", "body": {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "t", "namespace": NS},
        "spec": {"metadata": {"labels": {"team": "a"}, "annotations": {"note": "x"}}, "spec": spec}}})
    long_name = "a-rather-long-virtual-machine-name-for-the-test"
    seeded(cluster, [], state)
    for body in (template_vmi("short", "t"), template_vmi(long_name, "t", claim_name="a-long-claim-name-too"),
                 template_vmi("orphan", "missing")):
        req = urllib.request.Request(cluster.url + "/apis/kubevirt.io/v1/namespaces/%s/virtualmachineinstances" % NS,
                                     data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=10).close()
    ctl = controller()
    assert until(lambda: phase(cluster, "short") == "Running" and phase(cluster, long_name) == "Running")
    time.sleep(0.3)    # more passes: no second claim
    claims = [o for o in cluster.stored() if o.get("kind") == "ResourceClaim"]
    assert len(claims) == 2, claims
    by_pod = {c["metadata"]["ownerReferences"][0]["name"]: c for c in claims}
    short = by_pod["virt-launcher-short"]
    assert short["metadata"]["name"][:-5] == "virt-launcher-short-vgpu-"
    [owner] = short["metadata"]["ownerReferences"]
    assert owner == {"apiVersion": "v1", "kind": "Pod", "name": "virt-launcher-short",
                     "uid": stored(cluster, VMIS, "short", NS)["metadata"]["uid"], "controller": True,
                     "blockOwnerDeletion": True}
    assert short["metadata"]["labels"] == {"team": "a"}
    assert short["metadata"]["annotations"] == {"note": "x", "resource.kubernetes.io/pod-claim-name": "vgpu"}
    assert short["spec"] == spec and short["status"]["allocation"]["devices"]["results"][0]["pool"] == \
        "gpu-a/vgpu.accelops.io"
    pod, pod_claim = "virt-launcher-" + long_name, "a-long-claim-name-too"
    base = len(pod) + len(pod_claim) + 2
    assert by_pod[pod]["metadata"]["name"][:-5] == pod[:len(pod) * 57 // base] + "-" + pod_claim[
        :len(pod_claim) * 57 // base]
    orphan = stored(cluster, VMIS, "orphan", NS)
    assert orphan["status"]["phase"] == "Pending"
    assert 'resource claim template "missing": not found' in orphan["status"]["conditions"][0]["message"]
    assert ctl.errors == []
