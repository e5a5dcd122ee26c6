"""The agent's Helm chart in tests: the real helm `make setup` installs (tools/install-helm.sh), its rendering as
objects, and the API double's registration of the kinds the chart creates."""

from __future__ import annotations

import json
import subprocess
import urllib.error

import yaml

from cluster_helpers import ROOT

HELM = ROOT / ".venv" / "bin" / "helm"
KUBECTL = ROOT / ".venv" / "bin" / "kubectl"
CHART = ROOT / "charts" / "accelops-vgpu-node-agent"
EXAMPLE_VALUES = CHART / "ci" / "example-values.yaml"
INSTALL_YAML = ROOT / "deploy" / "install.yaml"
NAMESPACE = "accelops-vgpu"
NAME = "accelops-vgpu-node-agent"
POLICY = NAME + "-own-node"
# resource -> (kind, namespaced): what the chart creates, for the API double
CHART_RESOURCES = {
    "v1/namespaces": ("Namespace", False), "v1/serviceaccounts": ("ServiceAccount", True),
    "v1/configmaps": ("ConfigMap", True), "apps/v1/daemonsets": ("DaemonSet", True),
    "rbac.authorization.k8s.io/v1/clusterroles": ("ClusterRole", False),
    "rbac.authorization.k8s.io/v1/clusterrolebindings": ("ClusterRoleBinding", False),
    "rbac.authorization.k8s.io/v1/roles": ("Role", True),
    "rbac.authorization.k8s.io/v1/rolebindings": ("RoleBinding", True),
    "admissionregistration.k8s.io/v1/validatingadmissionpolicies": ("ValidatingAdmissionPolicy", False),
    "admissionregistration.k8s.io/v1/validatingadmissionpolicybindings": ("ValidatingAdmissionPolicyBinding", False),
}


def register_chart_kinds(state):
    """Add the chart's kinds to an API double state (kmock_serve serves only registered resources)."""
    for resource, (kind, namespaced) in CHART_RESOURCES.items():
        state["resources"][resource] = {"kind": kind, "singular": kind.lower(), "namespaced": namespaced,
                                        "verbs": ["get", "list", "create", "patch", "delete"]}
    return state


def object_name(kind):
    return NAMESPACE if kind == "Namespace" else POLICY if kind.startswith("ValidatingAdmission") else NAME


def helm(*args, check=True):
    proc = subprocess.run([str(HELM)] + [str(a) for a in args], capture_output=True, text=True, timeout=120,
                          check=False)
    if check and proc.returncode != 0:
        raise AssertionError("helm %s: %s" % (" ".join(map(str, args)), proc.stderr))
    return proc


def render(*args, namespace=NAMESPACE):
    """The chart's objects (a list of dicts) for `helm template` arguments (values options)."""
    text = helm("template", NAME, CHART, "--namespace", namespace, *args).stdout
    return [doc for doc in yaml.safe_load_all(text) if doc]


def by_kind(objects):
    return {obj["kind"]: obj for obj in objects if obj}


SERVER_FIELDS = ("creationTimestamp", "resourceVersion", "uid", "generation", "managedFields")


def as_applied(obj):
    """An object as stored, without what the server or kubectl add (server fields, the last-applied annotation)."""
    obj = json.loads(json.dumps(obj))
    meta = obj["metadata"]
    for key in SERVER_FIELDS:
        meta.pop(key, None)
    meta.get("annotations", {}).pop("kubectl.kubernetes.io/last-applied-configuration", None)
    if not meta.get("annotations"):
        meta.pop("annotations", None)
    obj.pop("status", None)
    return obj


def stored_objects(api_server):
    """kind -> object of the chart's objects in the API double (absent ones left out)."""
    found = {}
    for resource, (kind, namespaced) in CHART_RESOURCES.items():
        try:
            found[kind] = api_server.get(resource, object_name(kind), NAMESPACE if namespaced else None)
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                raise
    return found
