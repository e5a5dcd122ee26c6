"""The chart's ValidatingAdmissionPolicy, its CEL evaluated with cel-python against AdmissionRequest-shaped
activations (the API double cannot run CEL), following the API server's order: the matchConstraints (Node UPDATE),
then every matchCondition (false: the policy does not apply), the variables in order, then each validation
(false: denied with its message or messageExpression).

cel-python implements the CEL standard library; Kubernetes adds cel-go's string extensions, of which the policy
uses `<list>.join(separator)`: added here with cel-go's documented meaning."""

from __future__ import annotations

import copy

import celpy
import pytest

from chart_helpers import EXAMPLE_VALUES, NAME, NAMESPACE, by_kind, render

AGENT = "system:serviceaccount:%s:%s" % (NAMESPACE, NAME)
NODE_NAME_KEY = "authentication.kubernetes.io/node-name"


def _join(items, separator=celpy.celtypes.StringType("")):
    return celpy.celtypes.StringType(str(separator).join(str(item) for item in items))


class Policy:
    def __init__(self, policy):
        self.spec = policy["spec"]
        self.env = celpy.Environment()

    def _eval(self, expression, activation):
        program = self.env.program(self.env.compile(expression), functions={"join": _join})
        return program.evaluate(activation)

    def admit(self, request):
        """(allowed, message) for an AdmissionRequest dict (with object and oldObject)."""
        rule = self.spec["matchConstraints"]["resourceRules"][0]
        if request["operation"] not in rule["operations"] or request["resource"]["resource"] not in rule["resources"]:
            return True, "not matched"
        activation = {name: celpy.json_to_cel(request.get(name)) for name in ("object", "oldObject")}
        activation["request"] = celpy.json_to_cel({k: v for k, v in request.items() if k not in ("object", "oldObject")})
        for condition in self.spec.get("matchConditions", []):
            if not bool(self._eval(condition["expression"], activation)):
                return True, "not matched"
        variables = {}
        for variable in self.spec.get("variables", []):
            activation["variables"] = celpy.celtypes.MapType(variables)
            variables[celpy.celtypes.StringType(variable["name"])] = self._eval(variable["expression"], activation)
        activation["variables"] = celpy.celtypes.MapType(variables)
        for validation in self.spec["validations"]:
            result = self._eval(validation["expression"], activation)
            assert isinstance(result, celpy.celtypes.BoolType), (validation["expression"], result)
            if not result:
                message = validation.get("message")
                if "messageExpression" in validation:
                    message = str(self._eval(validation["messageExpression"], activation))
                return False, message
        return True, "allowed"


def node(name, labels=None, annotations=None):
    """A Node as the API server passes it to admission (object/oldObject)."""
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "uid": "uid-" + name, "resourceVersion": "41",
                         "labels": dict({"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                         "nvidia.com/vgpu.config": "l40s-2x24q",
                                         "nvidia.com/gpu.deploy.sandbox-device-plugin": "true"}, **(labels or {})),
                         "annotations": dict({"node.alpha.kubernetes.io/ttl": "0"}, **(annotations or {}))},
            "spec": {"podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24"]},
            "status": {"capacity": {"cpu": "64"}}}


def request(old, new, username=AGENT, token_node="gpu-a"):
    """An AdmissionRequest (admission.k8s.io/v1) for a PATCH of a Node, admitted as UPDATE."""
    extra = {"authentication.kubernetes.io/pod-name": ["%s-x7k2p" % NAME],
             "authentication.kubernetes.io/pod-uid": ["0f4b1a3e-5c1d-4c1f-9a55-2f0b8d3c6e11"]}
    if token_node is not None:
        extra[NODE_NAME_KEY] = [token_node]
        extra["authentication.kubernetes.io/node-uid"] = ["uid-" + token_node]
    return {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "kind": {"group": "", "version": "v1", "kind": "Node"},
            "resource": {"group": "", "version": "v1", "resource": "nodes"}, "name": new["metadata"]["name"],
            "operation": "UPDATE", "userInfo": {"username": username, "uid": "sa-uid",
                                                "groups": ["system:serviceaccounts",
                                                           "system:serviceaccounts:" + NAMESPACE,
                                                           "system:authenticated"], "extra": extra},
            "object": new, "oldObject": old, "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "UpdateOptions"}}


def changed(old, labels=None, annotations=None, spec=None):
    new = copy.deepcopy(old)
    for key, value in (labels or {}).items():
        if value is None:
            new["metadata"]["labels"].pop(key, None)
        else:
            new["metadata"]["labels"][key] = value
    for key, value in (annotations or {}).items():
        if value is None:
            new["metadata"]["annotations"].pop(key, None)
        else:
            new["metadata"]["annotations"][key] = value
    new["spec"].update(spec or {})
    return new


@pytest.fixture(scope="module")
def policy():
    return Policy(by_kind(render("--values", EXAMPLE_VALUES))["ValidatingAdmissionPolicy"])


@pytest.fixture(scope="module")
def fallback_policy():
    return Policy(by_kind(render("--values", EXAMPLE_VALUES, "--set", "admissionPolicy.ownNodeOnly=false"))
                  ["ValidatingAdmissionPolicy"])


GPU_A = node("gpu-a", labels={"nvidia.com/vgpu.config.state": "success", "accelops.io/vgpu.profile.L40S-24Q": "2"})


@pytest.mark.parametrize("labels, annotations", [
    ({"nvidia.com/vgpu.config.state": "pending"}, None),                                          # pending
    ({"nvidia.com/gpu.deploy.sandbox-device-plugin": "paused-for-vgpu-change"}, None),           # pause
    ({"nvidia.com/vgpu.config.state": "success", "accelops.io/vgpu.profile.L40S-24Q": None,
      "accelops.io/vgpu.profile.L40S-8Q": "6"}, {"accelops.io/vgpu.config.reason": None}),       # success
    ({"nvidia.com/vgpu.config.state": "failed"}, {"accelops.io/vgpu.config.reason": "VF 0000:41:00.4 is held"}),
    ({}, {}),                                                                                     # no change
])
def test_the_agent_may_write_its_own_keys_on_its_own_node(policy, labels, annotations):
    assert policy.admit(request(GPU_A, changed(GPU_A, labels, annotations))) == (True, "allowed")


@pytest.mark.parametrize("new, token_node, message", [
    (changed(node("gpu-b"), {"nvidia.com/vgpu.config.state": "failed"}), "gpu-a",
     "the node agent of node gpu-a may not change node gpu-b"),
    (changed(GPU_A, {"nvidia.com/vgpu.config": "l40s-6x8q"}), "gpu-a",
     "the node agent may not change the label(s) nvidia.com/vgpu.config of node gpu-a"),
    (changed(GPU_A, {"node-role.kubernetes.io/control-plane": "", "kubernetes.io/hostname": None}), "gpu-a",
     "the node agent may not change the label(s) node-role.kubernetes.io/control-plane, kubernetes.io/hostname "
     "of node gpu-a"),
    (changed(GPU_A, {"nvidia.com/gpu.deploy.sandbox-validator": "false"}), "gpu-a",
     "the node agent may set the operand deploy labels of node gpu-a only to true or paused-for-vgpu-change"),
    (changed(GPU_A, annotations={"node.alpha.kubernetes.io/ttl": "30"}), "gpu-a",
     "the node agent may not change the annotation(s) node.alpha.kubernetes.io/ttl of node gpu-a"),
    (changed(GPU_A, spec={"unschedulable": True}), "gpu-a",
     "the node agent may change only labels and annotations of node gpu-a (not its spec, finalizers or owner "
     "references)"),
    (changed(GPU_A, spec={"taints": [{"key": "x", "effect": "NoSchedule"}]}), "gpu-a",
     "the node agent may change only labels and annotations of node gpu-a (not its spec, finalizers or owner "
     "references)"),
    (changed(GPU_A, {"nvidia.com/vgpu.config.state": "pending"}), None,
     "the node agent's token names no node (authentication.kubernetes.io/node-name, Kubernetes >= 1.30 with "
     "ServiceAccountTokenPodNodeInfo); on clusters without it set admissionPolicy.ownNodeOnly=false"),
])
def test_everything_else_the_agent_asks_is_denied_naming_why(policy, new, token_node, message):
    old = GPU_A if new["metadata"]["name"] == "gpu-a" else node("gpu-b")
    assert policy.admit(request(old, new, token_node=token_node)) == (False, message)


def test_other_users_are_not_matched(policy):
    new = changed(node("gpu-b"), {"nvidia.com/vgpu.config": "l40s-6x8q"}, spec={"unschedulable": True})
    assert policy.admit(request(node("gpu-b"), new, username="system:node:gpu-b")) == (True, "not matched")
    other_sa = "system:serviceaccount:%s:default" % NAMESPACE
    assert policy.admit(request(node("gpu-b"), new, username=other_sa)) == (True, "not matched")


def test_the_fallback_allows_any_node_but_still_only_the_agents_keys(fallback_policy):
    new = changed(node("gpu-b"), {"nvidia.com/vgpu.config.state": "pending"})
    assert fallback_policy.admit(request(node("gpu-b"), new, token_node=None)) == (True, "allowed")
    foreign = changed(node("gpu-b"), {"team": "ml"})
    assert fallback_policy.admit(request(node("gpu-b"), foreign, token_node=None)) == (
        False, "the node agent may not change the label(s) team of node gpu-b")


def test_the_policy_is_bound_to_deny(policy):
    objects = by_kind(render("--values", EXAMPLE_VALUES))
    binding = objects["ValidatingAdmissionPolicyBinding"]
    assert binding["spec"] == {"policyName": objects["ValidatingAdmissionPolicy"]["metadata"]["name"],
                               "validationActions": ["Deny"]}
    assert policy.spec["failurePolicy"] == "Fail"
    assert "ValidatingAdmissionPolicy" not in by_kind(render("--values", EXAMPLE_VALUES,
                                                             "--set", "admissionPolicy.enabled=false"))
