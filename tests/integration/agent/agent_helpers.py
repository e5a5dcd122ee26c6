"""The node agent as a real process (the built zipapp, the node's Python) against gpusim and the
Kubernetes API server double (tests/fakes/kmock_serve.py)."""

from __future__ import annotations

import json
import os
import subprocess
import time

from ansible_collections.accelops.vgpu.tests.integration.cluster.cluster_helpers import ROOT, node

NODE = "gpu-a"
NODES = "v1/nodes"
CONFIG_LABEL = "nvidia.com/vgpu.config"
STATE_LABEL = "nvidia.com/vgpu.config.state"
REASON = "accelops.io/vgpu.config.reason"
PLUGIN_LABEL = "nvidia.com/gpu.deploy.sandbox-device-plugin"
VALIDATOR_LABEL = "nvidia.com/gpu.deploy.sandbox-validator"
PROFILE = "accelops.io/vgpu.profile."
CONFIGS = ROOT / "tests" / "integration" / "data" / "vgpu-configs.yaml"
NODE_PYTHON = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else str(ROOT / ".venv" / "bin" / "python")
RESOURCES = {
    NODES: {"kind": "Node", "singular": "node", "namespaced": False, "verbs": ["get", "list", "watch", "patch"]},
    "v1/events": {"kind": "Event", "singular": "event", "namespaced": True, "verbs": ["create"]},
}


def agent_state(labels=None):
    """The API server's content for an agent test: one Node with `labels`."""
    return {"resources": RESOURCES, "objects": [{"resource": NODES, "name": NODE, "body": node(NODE, labels)}]}


def kubeconfig_for(url, path, token="agent-token", ca_file=None):
    cluster = {"server": url}
    if ca_file:
        cluster["certificate-authority"] = ca_file
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": cluster}], "users": [{"name": "agent", "user": {"token": token}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "agent"}}]}))
    return str(path)


def wait_for(what, predicate, timeout=30.0, interval=0.1):
    """predicate() until it returns something true; AssertionError naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError("timed out after %.0f s waiting for %s (last: %r)" % (timeout, what, last))


class AgentProcess:
    """`accelops-vgpu agent` from the zipapp, with the node's roots and a kubeconfig or pod-like env."""

    def __init__(self, pyz, gpu_node, api, workdir, argv_prefix=(), **env):
        self.pyz, self.node, self.api, self.workdir = pyz, gpu_node, api, workdir
        self.stderr_path = workdir / ("agent-%d.log" % time.monotonic_ns())
        self.status_file = workdir / "agent-status.json"
        self.env = dict(gpu_node.env, NODE_NAME=NODE, CONFIG_FILE=str(CONFIGS), DEFAULT_VGPU_CONFIG="default",
                        NAMESPACE="vgpu-agent", ACCELOPS_VGPU_SYSFS_ROOT=gpu_node.root,
                        ACCELOPS_VGPU_DEV_ROOT=gpu_node.dev_root, ACCELOPS_VGPU_PROC_ROOT="/proc",
                        CONFIG_POLL_INTERVAL="0.2", STATUS_FILE=str(self.status_file))
        if "KUBECONFIG" not in env and api is not None:
            self.env["KUBECONFIG"] = kubeconfig_for(api.url, workdir / "kubeconfig")
        self.env.update({k: str(v) for k, v in env.items() if v is not None})
        for key in [k for k, v in env.items() if v is None]:
            self.env.pop(key, None)
        self.argv_prefix = list(argv_prefix)
        self.proc = None

    def start(self):
        with open(self.stderr_path, "w") as stderr:
            self.proc = subprocess.Popen(self.argv_prefix + [NODE_PYTHON, self.pyz, "agent"], env=self.env,
                                         stdout=subprocess.DEVNULL, stderr=stderr)
        return self

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode if self.proc is not None else None

    def output(self):
        return self.stderr_path.read_text()

    def status(self):
        try:
            return json.loads(self.status_file.read_text())
        except (OSError, ValueError):
            return None

    def forget_status(self):
        """Before a change: the next status the agent writes is about that change."""
        if self.status_file.exists():
            self.status_file.unlink()

    def wait(self, state, config, timeout=60.0):
        """Wait until the agent reports `state` for `config` in its status file (written after the
        node's labels); fails early, with its log, when the process died."""
        def reached():
            assert self.proc.poll() is None, "the agent exited (%s):\n%s" % (self.proc.returncode, self.output())
            status = self.status()
            return status if status and status["state"] == state and status["config"] == config else None
        try:
            return wait_for("agent state %s for config %s" % (state, config), reached, timeout)
        except AssertionError as exc:
            raise AssertionError("%s\nagent log:\n%s" % (exc, self.output()[-4000:])) from None


class Cluster:
    """The API server double seen from an agent test: the Node's labels/annotations, relabelling."""

    def __init__(self, api):
        self.api = api

    def node(self):
        return self.api.get(NODES, NODE)

    def labels(self):
        return self.node()["metadata"].get("labels") or {}

    def annotations(self):
        return self.node()["metadata"].get("annotations") or {}

    def profile_labels(self):
        return dict((k, v) for k, v in self.labels().items() if k.startswith(PROFILE))

    def relabel(self, **labels):
        """Merge-patch the node's labels as another client (kubectl label); None removes one."""
        self.api.control("patch", {"resource": NODES, "name": NODE, "patch": {"metadata": {"labels": labels}}})

    def select(self, config):
        self.relabel(**{CONFIG_LABEL: config})

    def state(self):
        return self.labels().get(STATE_LABEL)

    def events(self):
        return [r for r in self.api.log() if r["method"] == "POST" and r["path"].endswith("/events")]

    def history(self):
        """Every stored version of the Node, oldest first (what the labels were at each write)."""
        return self.api._ctl("history?resource=%s&name=%s" % (NODES, NODE))  # pylint: disable=protected-access
