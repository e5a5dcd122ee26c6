"""DELETE on the API server double (tests/fakes/kmock_serve.py) as kube-apiserver answers it, for
every resource it serves: DeleteOptions preconditions (409, nothing changed), dry run, propagation
policy, invalid options (422). Raw HTTP, so what is asserted is exactly what a client gets."""

from __future__ import annotations

import pytest

from cluster_helpers import default_state
from test_api_double import MERGE, PODS, VMIS, call, pod

SLICES = "resource.k8s.io/v1/resourceslices"
# resource -> (collection path, a body to create, the kind as the Conflict message names it)
CASES = {
    PODS: ("/api/v1/namespaces/ns/pods", pod("victim", "gpu-a"), "Pod"),
    VMIS: ("/apis/kubevirt.io/v1/namespaces/ns/virtualmachineinstances",
           {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "metadata": {"name": "victim"}},
           "VirtualMachineInstance.kubevirt.io"),
    SLICES: ("/apis/resource.k8s.io/v1/resourceslices",
             {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "victim"},
              "spec": {"driver": "vgpu.accelops.io", "nodeName": "gpu-a",
                       "pool": {"name": "gpu-a", "generation": 1, "resourceSliceCount": 1}, "devices": []}},
             "ResourceSlice.resource.k8s.io"),
}


@pytest.fixture
def api(api_server):
    state = default_state()
    state["resources"][PODS] = {"kind": "Pod", "singular": "pod", "namespaced": True}
    state["resources"][VMIS] = {"kind": "VirtualMachineInstance", "singular": "virtualmachineinstance",
                                "namespaced": True}
    state["resources"][SLICES] = {"kind": "ResourceSlice", "singular": "resourceslice", "namespaced": False}
    state["objects"].append({"resource": PODS, "namespace": "ns", "name": "p1", "body": pod("p1", "gpu-a")})
    api_server.reset(state)
    return api_server


def options(**fields):
    return dict({"apiVersion": "v1", "kind": "DeleteOptions"}, **fields)


@pytest.mark.parametrize("resource", sorted(CASES))
def test_delete_preconditions_are_checked_for_every_resource(api, resource):
    collection, body, kind = CASES[resource]
    status, created = call(api, "POST", collection, body)
    assert status == 201
    path, uid, first = collection + "/victim", created["metadata"]["uid"], created["metadata"]["resourceVersion"]
    status, changed = call(api, "PATCH", path, {"metadata": {"labels": {"by": "someone-else"}}}, MERGE)
    current = changed["metadata"]["resourceVersion"]
    assert status == 200 and current != first

    status, answer = call(api, "DELETE", path, options(preconditions={"resourceVersion": first}))
    assert (status, answer["reason"], answer["message"]) == (409, "Conflict", (
        'Operation cannot be fulfilled on %s "victim": the ResourceVersion in the precondition (%s) does not match '
        'the ResourceVersion in record (%s). The object might have been modified' % (kind, first, current)))
    group = resource.rsplit("/", 2)[0] if resource.count("/") == 2 else ""
    assert answer["details"] == {"name": "victim", "group": group, "kind": kind.split(".")[0]}
    status, answer = call(api, "DELETE", path, options(preconditions={"uid": "not-" + uid, "resourceVersion": current}))
    assert (status, answer["reason"], answer["message"]) == (409, "Conflict", (
        'Operation cannot be fulfilled on %s "victim": the UID in the precondition (not-%s) does not match the UID '
        'in record (%s). The object might have been deleted and then recreated' % (kind, uid, uid)))
    status, answer = call(api, "DELETE", path, options(preconditions={"resourceVersion": first}, dryRun=["All"]))
    assert status == 409                                   # checked before the dry run answers
    assert call(api, "GET", path) == (200, changed)        # three refusals changed nothing

    status, answer = call(api, "DELETE", path, options(preconditions={"uid": uid, "resourceVersion": current}))
    assert status == 200 and answer["metadata"]["uid"] == uid
    assert call(api, "GET", path)[0] == 404
    status, answer = call(api, "DELETE", path, options(preconditions={"uid": uid}))
    assert (status, answer["reason"]) == (404, "NotFound")


def test_a_race_lost_between_list_and_delete_is_a_conflict_and_an_unconditional_delete_wins(api):
    collection, body, dummy = CASES[SLICES]
    version = call(api, "POST", collection, body)[1]["metadata"]["resourceVersion"]
    api.conflict(count=1, patch={"metadata": {"labels": {"by": "someone-else"}}})
    status, answer = call(api, "DELETE", collection + "/victim", options(preconditions={"resourceVersion": version}))
    assert (status, answer["reason"]) == (409, "Conflict")
    assert call(api, "GET", collection + "/victim")[1]["metadata"]["labels"] == {"by": "someone-else"}
    assert call(api, "DELETE", collection + "/victim")[0] == 200       # no precondition: deleted whatever changed
    assert call(api, "GET", collection + "/victim")[0] == 404


def test_delete_dry_run_from_the_body_or_the_query_stores_nothing(api):
    assert call(api, "DELETE", "/api/v1/namespaces/ns/pods/p1", options(dryRun=["All"]))[0] == 200
    assert call(api, "DELETE", "/api/v1/namespaces/ns/pods/p1?dryRun=All")[0] == 200
    assert call(api, "GET", "/api/v1/namespaces/ns/pods/p1")[0] == 200
    # with a body the options come from the body only (handlers/delete.go): the query's dryRun is not read
    assert call(api, "DELETE", "/api/v1/namespaces/ns/pods/p1?dryRun=All", options())[0] == 200
    assert call(api, "GET", "/api/v1/namespaces/ns/pods/p1")[0] == 404


@pytest.mark.parametrize("path, body, message", [
    ("/api/v1/nodes/gpu-b", options(propagationPolicy="Sideways"),
     'DeleteOptions.meta.k8s.io "" is invalid: propagationPolicy: Unsupported value: "Sideways": supported values: '
     '"Foreground", "Background", "Orphan", "nil"'),
    ("/api/v1/nodes/gpu-b?propagationPolicy=Sideways", None, "propagationPolicy: Unsupported value"),
    ("/api/v1/nodes/gpu-b", options(propagationPolicy="Orphan", orphanDependents=True),
     "orphanDependents and deletionPropagation cannot be both set"),
    ("/api/v1/nodes/gpu-b", options(dryRun=["Some"]),
     'DeleteOptions.meta.k8s.io "" is invalid: dryRun: Unsupported value: []string{"Some"}: supported values: "All"'),
])
def test_invalid_delete_options_are_refused_before_anything_happens(api, path, body, message):
    status, answer = call(api, "DELETE", path, body)
    assert (status, answer["reason"]) == (422, "Invalid") and message in answer["message"]
    assert call(api, "GET", "/api/v1/nodes/gpu-b")[0] == 200


@pytest.mark.parametrize("policy, finalizer, dependent_stays", [
    (None, None, False), ("Background", None, False), ("Foreground", "foregroundDeletion", False),
    ("Orphan", "orphan", True)])
def test_the_propagation_policy_decides_what_happens_to_dependents(api, policy, finalizer, dependent_stays):
    owner = call(api, "POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-c"}})[1]
    collection, body, dummy = CASES[SLICES]
    body = dict(body, metadata={"name": "victim", "ownerReferences": [
        {"apiVersion": "v1", "kind": "Node", "name": "gpu-c", "uid": owner["metadata"]["uid"]}]})
    assert call(api, "POST", collection, body)[0] == 201
    status, answer = call(api, "DELETE", "/api/v1/nodes/gpu-c", options(propagationPolicy=policy) if policy else None)
    assert status == 200 and answer["metadata"].get("finalizers") == ([finalizer] if finalizer else None)
    assert call(api, "GET", "/api/v1/nodes/gpu-c")[0] == 404
    status, dependent = call(api, "GET", collection + "/victim")
    assert status == (200 if dependent_stays else 404)
    if dependent_stays:
        assert "ownerReferences" not in dependent["metadata"]
    assert sorted(n["metadata"]["name"] for n in call(api, "GET", "/api/v1/nodes")[1]["items"]) == ["gpu-a", "gpu-b"]


def test_finalizers_defer_the_delete_until_the_last_one_is_removed(api):
    collection, body, dummy = CASES[SLICES]
    call(api, "POST", collection, dict(body, metadata={"name": "victim", "finalizers": ["example.com/keep"]}))
    status, answer = call(api, "DELETE", collection + "/victim", options())
    assert status == 200 and answer["metadata"]["deletionTimestamp"]      # 200: handlers/delete.go, not 202
    assert call(api, "DELETE", collection + "/victim", options(orphanDependents=False))[0] == 202
    assert call(api, "GET", collection + "/victim")[0] == 200
    assert call(api, "PATCH", collection + "/victim", {"metadata": {"finalizers": None}}, MERGE)[0] == 200
    assert call(api, "GET", collection + "/victim")[0] == 404


def test_background_deletion_keeps_dependents_while_a_finalizer_keeps_their_owner(api):
    """The garbage collector deletes dependents of a gone owner only: one that still exists with a deletionTimestamp
    (a finalizer pending) is a solid owner (kube-controller-manager garbagecollector.go classifyReferences)."""
    owner = call(api, "POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": "gpu-d", "finalizers": ["example.com/keep"]}})[1]
    collection, body, dummy = CASES[SLICES]
    body = dict(body, metadata={"name": "victim", "ownerReferences": [
        {"apiVersion": "v1", "kind": "Node", "name": "gpu-d", "uid": owner["metadata"]["uid"]}]})
    assert call(api, "POST", collection, body)[0] == 201
    status, answer = call(api, "DELETE", "/api/v1/nodes/gpu-d", options(propagationPolicy="Background"))
    assert status == 200 and answer["metadata"]["deletionTimestamp"]
    assert call(api, "GET", collection + "/victim")[0] == 200              # the owner still exists
    assert call(api, "PATCH", "/api/v1/nodes/gpu-d", {"metadata": {"finalizers": None}}, MERGE)[0] == 200
    assert call(api, "GET", "/api/v1/nodes/gpu-d")[0] == 404
    assert call(api, "GET", collection + "/victim")[0] == 404              # now it is collected
