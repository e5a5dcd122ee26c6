"""Helpers of the cluster-side tests: seed objects, the API server controls, running a module."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from ansible.module_utils.common.parameters import PASS_VARS

# Ask a module to return its arguments (`invocation`), as ansible-playbook -vvv shows them: ansible-core
# 2.20+ does so only on request, older versions always do and reject the request.
INJECT_INVOCATION = {"_ansible_inject_invocation": True} if "inject_invocation" in PASS_VARS else {}

ROOT = Path(__file__).resolve().parents[3]
COLLECTIONS = ROOT / ".build" / "collections"
MODULES = "ansible_collections.accelops.vgpu.plugins.modules."
KUBEVIRT = "kubevirt.io/v1/kubevirts"
CLUSTER_POLICY = "nvidia.com/v1/clusterpolicies"
NODES = "v1/nodes"
DEPLOYMENTS = "apps/v1/deployments"
TOKEN = "s3cr3t-token-0123456789"

FOREIGN_NIC = {"pciVendorSelector": "8086:1572", "resourceName": "intel.com/x710"}
FOREIGN_T4 = {"pciVendorSelector": "10DE:1EB8", "resourceName": "nvidia.com/TU104GL_Tesla_T4",
              "externalResourceProvider": True}
FOREIGN_MDEV = {"mdevNameSelector": "i915-GVTg_V5_4", "resourceName": "intel.com/gvt"}


def kubevirt_cr(version="v1.9.0", name="kubevirt", namespace="kubevirt"):
    return {"apiVersion": "kubevirt.io/v1", "kind": "KubeVirt",
            "metadata": {"name": name, "namespace": namespace, "resourceVersion": "1"},
            "spec": {"certificateRotateStrategy": {}, "configuration": {
                "permittedHostDevices": {"pciHostDevices": [FOREIGN_T4, FOREIGN_NIC],
                                         "mediatedDevices": [FOREIGN_MDEV]},
                "developerConfiguration": {"featureGates": ["LiveMigration"]},
                "evictionStrategy": "LiveMigrate"}},
            "status": {"observedKubeVirtVersion": version, "operatorVersion": version, "phase": "Deployed"}}


def cluster_policy():
    return {"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy",
            "metadata": {"name": "cluster-policy", "resourceVersion": "1"},
            "spec": {"operator": {"defaultRuntime": "containerd"},
                     "sandboxWorkloads": {"enabled": False, "defaultWorkload": "container"},
                     "vgpuManager": {"enabled": False, "image": "vgpu-manager", "repository": "", "version": ""},
                     "vgpuDeviceManager": {"enabled": True, "config": {"default": "default"}}}}


def node(name, labels=None):
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "resourceVersion": "1",
                         "labels": dict({"kubernetes.io/hostname": name}, **(labels or {}))}}


def virt_operator():
    container = {"name": "virt-operator", "image": "quay.io/kubevirt/virt-operator:v1.9.0",
                 "env": [{"name": "OPERATOR_IMAGE", "value": "quay.io/kubevirt/virt-operator:v1.9.0"}]}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "virt-operator", "namespace": "kubevirt", "resourceVersion": "1"},
            "spec": {"selector": {"matchLabels": {"kubevirt.io": "virt-operator"}},
                     "template": {"metadata": {"labels": {"kubevirt.io": "virt-operator"}},
                                  "spec": {"containers": [container, {"name": "sidecar", "image": "busybox"}]}}}}


RESOURCES = {
    KUBEVIRT: {"kind": "KubeVirt", "singular": "kubevirt", "namespaced": True, "verbs": ["get", "list", "patch"]},
    CLUSTER_POLICY: {"kind": "ClusterPolicy", "singular": "clusterpolicy", "namespaced": False,
                     "verbs": ["get", "list", "patch"]},
    NODES: {"kind": "Node", "singular": "node", "namespaced": False, "verbs": ["get", "list", "patch"]},
}


def default_state(version="v1.9.0"):
    return {"resources": copy.deepcopy(RESOURCES), "objects": [
        {"resource": KUBEVIRT, "namespace": "kubevirt", "name": "kubevirt", "body": kubevirt_cr(version)},
        {"resource": CLUSTER_POLICY, "name": "cluster-policy", "body": cluster_policy()},
        {"resource": NODES, "name": "gpu-a", "body": node("gpu-a", {"team": "ml"})},
        {"resource": NODES, "name": "gpu-b", "body": node("gpu-b")},
        {"resource": DEPLOYMENTS, "namespace": "kubevirt", "name": "virt-operator", "body": virt_operator()},
    ]}


class ApiServer:
    """The server process and its test controls."""

    def __init__(self, proc, port, context=None):
        self.proc, self.port, self.context = proc, port, context
        self.url = "%s://127.0.0.1:%d" % ("https" if context else "http", port)

    @classmethod
    def start(cls, *options, context=None):
        """tests/fakes/kmock_serve.py [options] (default: a free loopback port), once it says "ready
        <port>"; `context`: the ssl context the controls use when options ask for HTTPS."""
        proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "fakes" / "kmock_serve.py")] + list(options),
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = proc.stdout.readline().split()
        if line[:1] != ["ready"]:
            cls(proc, 0).stop()
            raise RuntimeError("kmock_serve did not start: %r" % line)
        return cls(proc, int(line[1]), context)

    @classmethod
    @contextlib.contextmanager
    def running(cls, *options, context=None):
        """A session's double: started, yielded, always stopped (the fixture body of every suite)."""
        server = cls.start(*options, context=context)
        try:
            yield server
        finally:
            server.stop()

    def kubeconfig_file(self, directory):
        """A kubeconfig file for this server in `directory` (a pathlib.Path); returns its path."""
        path = directory / "kubeconfig"
        path.write_text(json.dumps(kubeconfig_dict(self.url)))
        return str(path)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def _ctl(self, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + "/_ctl/" + path, data=data, method="GET" if data is None else "POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10, context=self.context) as resp:
            return json.load(resp)

    def reset(self, state):
        self._ctl("reset", state)

    def conflict(self, count=1, patch=None):
        self._ctl("conflict", {"count": count, "patch": patch})

    def forbid(self, method, plural):
        self._ctl("forbid", {"method": method, "plural": plural})

    def log(self):
        return self._ctl("log")

    def received(self):
        """Every API request as the server received it (secrets included: method, path with query
        string, headers, body), since the last reset or clear_log."""
        return self._ctl("received")

    def stored(self):
        """Every object the server stores."""
        return self._ctl("objects")

    def writes(self):
        return [r for r in self.log() if r["method"] in ("POST", "PUT", "PATCH", "DELETE")]

    def clear_log(self):
        self._ctl("log/clear", {})

    def control(self, path, body=None):
        """Any other control of kmock_serve.py (its docstring lists them)."""
        return self._ctl(path, {} if body is None else body)

    def get(self, resource, name, namespace=None):
        query = "resource=%s&name=%s&namespace=%s" % (resource, name, namespace or "")
        return self._ctl("object?" + query)


def kubeconfig_dict(url, token=TOKEN):
    return {"apiVersion": "v1", "kind": "Config", "current-context": "test",
            "clusters": [{"name": "test", "cluster": {"server": url}}],
            "users": [{"name": "ansible", "user": {"token": token}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "ansible"}}]}


def run_module(module, args, check=False, diff=False, env=None):
    """Run a module the way Ansible does (args on stdin, JSON out); returns (rc, result).

    result["_raw"] is the module's whole stdout, for checks that a secret never appears."""
    payload = {"ANSIBLE_MODULE_ARGS": dict(args, _ansible_check_mode=check, _ansible_diff=diff)}
    environ = {k: v for k, v in os.environ.items() if not k.startswith("K8S_AUTH_")}
    environ.update(PYTHONPATH=str(COLLECTIONS), **(env or {}))
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", MODULES + module], input=json.dumps(payload),
                          capture_output=True, text=True, env=environ, timeout=120, check=False)
    out = proc.stdout.strip()
    try:
        result = json.loads(out[out.index("{"):])
    except ValueError:
        raise AssertionError("module printed no JSON: %s %s" % (out, proc.stderr)) from None
    result["_seconds"] = time.monotonic() - started
    result["_raw"] = proc.stdout
    return proc.returncode, result


def run_playbook(tmp_path, inventory, play, check=False):
    """ansible-playbook on an inventory and a play given as data (written to tmp_path), with this
    checkout's collection and config; returns the CompletedProcess."""
    (tmp_path / "inventory.json").write_text(json.dumps(inventory))
    (tmp_path / "play.json").write_text(json.dumps(play))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_COLLECTIONS_PATH=str(COLLECTIONS),
               ANSIBLE_HOME=str(tmp_path / "ansible-home"), ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"),
               ANSIBLE_NOCOLOR="1", ANSIBLE_STDOUT_CALLBACK="default")
    argv = [str(ROOT / ".venv/bin/ansible-playbook"), "-i", str(tmp_path / "inventory.json"),
            str(tmp_path / "play.json")] + (["--check"] if check else [])
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300, check=False)
