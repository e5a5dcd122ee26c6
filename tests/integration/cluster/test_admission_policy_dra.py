"""The chart's own-node ResourceSlice policy (dra.enabled), its CEL evaluated with cel-python the way
tests/integration/cluster/test_admission_policy.py evaluates the Node policy (same evaluator)."""

from __future__ import annotations

import copy

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import slices
from chart_helpers import EXAMPLE_VALUES, NAME, NAMESPACE, render
from test_admission_policy import Policy

AGENT = "system:serviceaccount:%s:%s" % (NAMESPACE, NAME)


def of_kind(objects, kind):
    return [obj for obj in objects if obj["kind"] == kind]


def policy(*sets):
    args = ["--values", EXAMPLE_VALUES, "--set", "dra.enabled=true"]
    for item in sets:
        args += ["--set", item]
    found = [p for p in of_kind(render(*args), "ValidatingAdmissionPolicy")
             if p["metadata"]["name"].endswith("-own-resourceslices")]
    return Policy(found[0]) if found else None


def resource_slice(node, driver="vgpu.accelops.io"):
    body = slices.desired_slices(node, [], 1)[0]
    body["spec"]["driver"] = driver
    return body


def request(operation, new, old, username=AGENT, token_node="gpu-a"):
    extra = {"authentication.kubernetes.io/node-name": [token_node]} if token_node else {}
    return {"operation": operation, "resource": {"group": "resource.k8s.io", "version": "v1", "resource": "resourceslices"},
            "userInfo": {"username": username, "extra": extra}, "object": new, "oldObject": old}


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE", "DELETE"])
def test_the_agent_writes_the_slices_of_its_own_node(operation):
    mine = resource_slice("gpu-a")
    new, old = {"CREATE": (mine, None), "UPDATE": (mine, copy.deepcopy(mine)), "DELETE": (None, mine)}[operation]
    assert policy().admit(request(operation, new, old)) == (True, "allowed")


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE", "DELETE"])
def test_another_nodes_slices_are_denied_naming_them(operation):
    other = resource_slice("gpu-b")
    new, old = {"CREATE": (other, None), "UPDATE": (other, copy.deepcopy(other)), "DELETE": (None, other)}[operation]
    allowed, message = policy().admit(request(operation, new, old))
    assert not allowed and message == ("the node agent of node gpu-a may not write ResourceSlice "
                                       "gpu-b-vgpu.accelops.io-0 of another node")


def test_another_drivers_slices_and_tokens_without_a_node_are_denied():
    assert policy().admit(request("CREATE", resource_slice("gpu-a", "gpu.nvidia.com"), None))[1] == (
        "the node agent may write only ResourceSlices of the driver vgpu.accelops.io, not gpu.nvidia.com")
    assert not policy().admit(request("CREATE", resource_slice("gpu-a"), None, token_node=None))[0]
    assert policy().admit(request("CREATE", resource_slice("gpu-b"), None, username="system:admin"))[1] == "not matched"


def test_own_node_only_off_keeps_the_driver_check_and_no_policy_without_dra():
    relaxed = policy("admissionPolicy.ownNodeOnly=false")
    assert relaxed.admit(request("CREATE", resource_slice("gpu-b"), None, token_node=None)) == (True, "allowed")
    without = of_kind(render("--values", EXAMPLE_VALUES), "ValidatingAdmissionPolicy")
    assert without and not [p for p in without if p["metadata"]["name"].endswith("-own-resourceslices")]
