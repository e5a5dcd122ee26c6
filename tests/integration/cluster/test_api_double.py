"""The API server double (tests/fakes/kmock_serve.py) answers as a real API server where the product
and the tests lean on it: create with dry run, selectors (list and live watch), patch types, memory
bounds. Raw HTTP, so what is asserted is exactly what a client gets."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import pytest

from cluster_helpers import NODES, default_state

PODS = "v1/pods"
VMIS = "kubevirt.io/v1/virtualmachineinstances"
MERGE = "application/merge-patch+json"


def call(server, method, path, body=None, content_type="application/json"):
    """(status, decoded body) of one API request."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(server.url + path, data=data, method=method,
                                 headers={"Content-Type": content_type} if data is not None else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


def pod(name, node_name, labels=None):
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "ns", "labels": labels or {}},
            "spec": {"nodeName": node_name, "containers": [{"name": "c", "image": "busybox"}]}}


@pytest.fixture
def api(api_server):
    state = default_state()
    state["resources"][PODS] = {"kind": "Pod", "singular": "pod", "namespaced": True}
    state["resources"][VMIS] = {"kind": "VirtualMachineInstance", "singular": "virtualmachineinstance",
                                "namespaced": True, "selectableFields": ["status.nodeName"]}
    state["objects"].append({"resource": PODS, "namespace": "ns", "name": "p1", "body": pod("p1", "gpu-a")})
    api_server.reset(state)
    yield api_server
    api_server.control("limits", {"request_log": 20000, "object_versions": 200})


def test_create_dry_run_validates_and_answers_409_for_an_existing_name_and_stores_nothing(api):
    status, body = call(api, "POST", "/api/v1/namespaces/ns/pods?dryRun=All", pod("p1", "gpu-b"))
    assert (status, body["reason"], body["message"]) == (409, "AlreadyExists", 'pods "p1" already exists')
    status, body = call(api, "POST", "/api/v1/namespaces/ns/pods?dryRun=All", pod("p2", "gpu-b"))
    assert status == 201 and body["metadata"]["name"] == "p2" and body["metadata"]["uid"]
    assert "resourceVersion" not in body["metadata"]
    assert call(api, "GET", "/api/v1/namespaces/ns/pods/p2")[0] == 404
    status, body = call(api, "POST", "/api/v1/namespaces/ns/pods?dryRun=All", {"metadata": {}})
    assert (status, body["reason"]) == (422, "Invalid") and "name or generateName is required" in body["message"]
    status, body = call(api, "POST", "/api/v1/namespaces/other/pods", pod("p3", "gpu-b"))
    assert status == 400 and "namespace of the provided object does not match" in body["message"]
    status, body = call(api, "POST", "/api/v1/namespaces/ns/pods", pod("p3", "gpu-b"))
    assert status == 201 and api.get(PODS, "p3", "ns")["metadata"]["resourceVersion"] == body["metadata"][
        "resourceVersion"]


def test_unknown_field_selectors_are_refused_and_known_ones_select(api):
    status, body = call(api, "GET", "/apis/kubevirt.io/v1/kubevirts?fieldSelector=spec.nodeName%3Dgpu-a")
    assert (status, body["message"]) == (400, "field label not supported: spec.nodeName")
    status, body = call(api, "GET", "/api/v1/nodes?fieldSelector=spec.nodeName%3Dgpu-a")
    assert (status, body["message"]) == (400, "field label not supported: spec.nodeName")
    status, body = call(api, "GET", "/apis/kubevirt.io/v1/virtualmachineinstances?fieldSelector=status.nodeName%3Dx")
    assert status == 200 and body["items"] == []  # declared by the CRD's selectableFields
    call(api, "POST", "/api/v1/namespaces/ns/pods", pod("p2", "gpu-b", {"app": "x"}))
    status, body = call(api, "GET", "/api/v1/pods?fieldSelector=spec.nodeName%3Dgpu-b")
    assert [p["metadata"]["name"] for p in body["items"]] == ["p2"]
    status, body = call(api, "GET", "/api/v1/pods?fieldSelector=spec.nodeName!%3Dgpu-b")
    assert [p["metadata"]["name"] for p in body["items"]] == ["p1"]
    status, body = call(api, "GET", "/api/v1/pods?labelSelector=app%20in%20(x,y)")
    assert [p["metadata"]["name"] for p in body["items"]] == ["p2"]
    status, body = call(api, "GET", "/api/v1/nodes?labelSelector=!team")
    assert [n["metadata"]["name"] for n in body["items"]] == ["gpu-b"]


def watch_events(api, path, count):
    """The first `count` events of a watch on `path` (read in a thread), as (type, name)."""
    events = []
    req = urllib.request.Request(api.url + path)

    def read():
        with urllib.request.urlopen(req, timeout=10) as resp:
            for line in resp:
                event = json.loads(line)
                events.append((event["type"], event["object"]["metadata"]["name"]))
                if len(events) == count:
                    return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return reader, events


def wait_watches(api, count):
    for dummy in range(200):
        if api._ctl("watches") == count:  # pylint: disable=protected-access
            return
        threading.Event().wait(0.02)
    raise AssertionError("no watch opened")


def test_live_watch_events_honour_label_and_field_selectors(api):
    version = call(api, "GET", "/api/v1/nodes")[1]["metadata"]["resourceVersion"]
    reader, events = watch_events(api, "/api/v1/nodes?watch=true&labelSelector=team%3Dml&timeoutSeconds=5"
                                       "&resourceVersion=" + version, 3)
    pods, pod_events = watch_events(api, "/api/v1/pods?watch=true&fieldSelector=spec.nodeName%3Dgpu-b"
                                         "&timeoutSeconds=5&resourceVersion=" + version, 2)
    wait_watches(api, 2)
    call(api, "PATCH", "/api/v1/nodes/gpu-b", {"metadata": {"labels": {"other": "1"}}}, MERGE)   # not selected
    call(api, "PATCH", "/api/v1/nodes/gpu-a", {"metadata": {"labels": {"x": "1"}}}, MERGE)       # stays
    call(api, "PATCH", "/api/v1/nodes/gpu-b", {"metadata": {"labels": {"team": "ml"}}}, MERGE)   # enters
    call(api, "PATCH", "/api/v1/nodes/gpu-a", {"metadata": {"labels": {"team": None}}}, MERGE)   # leaves
    call(api, "POST", "/api/v1/namespaces/ns/pods", pod("p2", "gpu-a"))
    call(api, "POST", "/api/v1/namespaces/ns/pods", pod("p3", "gpu-b"))
    call(api, "DELETE", "/api/v1/namespaces/ns/pods/p3")
    reader.join(10)
    pods.join(10)
    assert events == [("MODIFIED", "gpu-a"), ("ADDED", "gpu-b"), ("DELETED", "gpu-a")]
    assert pod_events == [("ADDED", "p3"), ("DELETED", "p3")]


def test_patch_type_comes_from_the_content_type(api):
    path = "/apis/kubevirt.io/v1/namespaces/kubevirt/kubevirts/kubevirt"
    status, body = call(api, "PATCH", path, {"spec": {"x": 1}}, "application/strategic-merge-patch+json")
    assert (status, body["reason"]) == (415, "UnsupportedMediaType") and "merge-patch" in body["message"]
    status, body = call(api, "PATCH", path, {"spec": {"x": 1}}, "application/json")
    assert status == 415
    status, body = call(api, "PATCH", path, [{"op": "add", "path": "/spec/x", "value": 1}], "application/json-patch+json")
    assert status == 200 and body["spec"]["x"] == 1
    status, body = call(api, "PATCH", path, [{"op": "add", "path": "/spec/x", "value": 1}], MERGE)
    assert status == 400  # a JSON patch sent as a merge patch is refused, not guessed
    deployment = "/apis/apps/v1/namespaces/kubevirt/deployments/virt-operator"
    status, body = call(api, "PATCH", deployment, {"spec": {"template": {"spec": {"containers": [
        {"name": "virt-operator", "image": "new"}]}}}}, "application/strategic-merge-patch+json")
    assert status == 200 and [(c["name"], c["image"]) for c in body["spec"]["template"]["spec"]["containers"]] == [
        ("virt-operator", "new"), ("sidecar", "busybox")]  # merged on the key `name`
    status, body = call(api, "PATCH", deployment, {"spec": {"template": {"spec": {"containers": [
        {"name": "virt-operator", "image": "newer"}]}}}}, MERGE)
    assert status == 200 and len(body["spec"]["template"]["spec"]["containers"]) == 1  # RFC 7386 replaces lists


def test_memory_stays_bounded_over_many_requests(api):
    api.control("limits", {"request_log": 5, "object_versions": 3})
    for i in range(20):
        status, dummy = call(api, "PATCH", "/api/v1/nodes/gpu-b", {"metadata": {"labels": {"n": str(i)}}}, MERGE)
        assert status == 200
    assert len(api.log()) == 5
    versions = api._ctl("history?resource=%s&name=gpu-b" % NODES)  # pylint: disable=protected-access
    assert [v["metadata"]["labels"]["n"] for v in versions] == ["17", "18", "19"]
