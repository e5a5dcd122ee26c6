"""DRA tests: the API server double serving resource.k8s.io/v1 next to a Node, and gpusim nodes with
programmed vGPUs."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import urllib.request

from ansible_collections.accelops.vgpu.plugins.module_utils.agent import kube
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import devices as dra_devices
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import facts, vgpu_apply
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import Sysfs
from ansible_collections.accelops.vgpu.plugins.module_utils.runner import CommandRunner
from ansible_collections.accelops.vgpu.tests.integration.cluster.cluster_helpers import node

NODE, NODE_UID = "gpu-a", "0b6a3f52-6d1e-4c3a-9a77-000000000a01"
SLICES, CLAIMS, NODES = "resource.k8s.io/v1/resourceslices", "resource.k8s.io/v1/resourceclaims", "v1/nodes"
RESOURCES = {
    NODES: {"kind": "Node", "singular": "node", "namespaced": False, "verbs": ["get", "list", "watch", "patch"]},
    SLICES: {"kind": "ResourceSlice", "singular": "resourceslice", "namespaced": False,
             "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
    CLAIMS: {"kind": "ResourceClaim", "singular": "resourceclaim", "namespaced": True,
             "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
}


def dra_state(objects=()):
    """The double's content: the Node (with its UID) and `objects` [(resource, namespace, body)]."""
    body = node(NODE)
    body["metadata"]["uid"] = NODE_UID
    items = [{"resource": NODES, "name": NODE, "body": body}]
    items += [{"resource": resource, "namespace": namespace, "name": obj["metadata"]["name"], "body": copy.deepcopy(obj)}
              for resource, namespace, obj in objects]
    return {"resources": copy.deepcopy(RESOURCES), "objects": items}


def client(api, tmp_path):
    return kube.KubeClient(kube.from_kubeconfig(api.kubeconfig_file(tmp_path)))


def program(gpu_node, profile_ids, per_pf=None):
    """Enable the VFs of every vendor-VFIO PF and type the first `per_pf` (all) with type IDs taken
    round-robin from `profile_ids`; returns the typed VF addresses."""
    typed = []
    for pf in gpu_node.pfs("l40s") + gpu_node.pfs("h100-pcie"):
        subprocess.run(["sriov-manage", "-e", pf], env=gpu_node.env, check=True, capture_output=True)
        for index, vf in enumerate(gpu_node.vfs(pf)[:per_pf]):
            gpu_node.write("bus/pci/devices/%s/nvidia/current_vgpu_type" % vf, profile_ids[index % len(profile_ids)])
            typed.append(vf)
    return typed


class NodeRunner(CommandRunner):
    """Runs the node's tools (gpusim's nvidia-smi) with the node's environment."""

    def __init__(self, gpu_node):
        super().__init__(timeout=60)
        self.env = gpu_node.env

    def which(self, name, extra_paths=()):
        return shutil.which(name, path=self.env["PATH"])

    def _execute(self, argv):
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout, check=False, env=self.env)
        return proc.returncode, proc.stdout, proc.stderr


def read_facts(gpu_node, cache_dir):
    """A `read_facts()` for the node as the agent reads it: node/engine/facts with the engine's type names
    (nvidia-smi once the creatable lists no longer show a type)."""
    sysfs = Sysfs(gpu_node.root)
    names = vgpu_apply.TypeNames(sysfs, NodeRunner(gpu_node), str(cache_dir))
    return lambda: facts.gather(sysfs, {}, names)     # who holds a device does not matter to DRA


def sysfs_devices(gpu_node, cache_dir):
    """The node's DRA devices read straight from its sysfs (the truth the slices must show)."""
    return dra_devices.inventory(Sysfs(gpu_node.root), read_facts(gpu_node, cache_dir)())


def stored_slices(api):
    """Every ResourceSlice the double stores (a plain GET, outside the client under test)."""
    with urllib.request.urlopen(api.url + "/apis/resource.k8s.io/v1/resourceslices", timeout=10) as resp:
        return sorted(json.load(resp)["items"], key=lambda item: item["metadata"]["name"])


def published_devices(api, node_name=NODE):
    """{device name: device entry} over the stored slices of `node_name` (its counter-only slices carry none)."""
    return {device["name"]: device for item in stored_slices(api) if item["spec"].get("nodeName") == node_name
            for device in item["spec"].get("devices") or ()}
