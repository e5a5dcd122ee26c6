"""The fake cluster of the conformance tests: seed objects, the fake KubeVirt controller, module runs."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import urllib.error

from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import slices as dra_slices
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.devices import DraDevice, device_name
from ansible_collections.accelops.vgpu.tests.integration.cluster.cluster_helpers import COLLECTIONS, MODULES

KUBEVIRT = "kubevirt.io/v1/kubevirts"
VMIS = "kubevirt.io/v1/virtualmachineinstances"
NODES = "v1/nodes"
NAMESPACES = "v1/namespaces"
DEVICE_CLASSES = "resource.k8s.io/v1/deviceclasses"
SLICES = "resource.k8s.io/v1/resourceslices"
CLAIMS = "resource.k8s.io/v1/resourceclaims"
L40S_RES = "nvidia.com/NVIDIA_L40S-24Q"
A16_RES = "nvidia.com/NVIDIA_A16-4Q"
RTX_PRO_RES = "nvidia.com/GB202GL_RTX_PRO_6000"   # a whole RTX PRO 6000 Blackwell passed through (issue 24)
PREFIX = "accelops.io/vgpu.profile."

RESOURCES = {
    KUBEVIRT: {"kind": "KubeVirt", "singular": "kubevirt", "namespaced": True, "verbs": ["get", "list"]},
    NODES: {"kind": "Node", "singular": "node", "namespaced": False, "verbs": ["get", "list"]},
    NAMESPACES: {"kind": "Namespace", "singular": "namespace", "namespaced": False,
                 "verbs": ["get", "list", "create", "delete"]},
    VMIS: {"kind": "VirtualMachineInstance", "singular": "virtualmachineinstance", "namespaced": True,
           "verbs": ["get", "list", "create", "delete", "patch"]},
}


def kubevirt_cr(pci=None, mdev=None):
    pci = [{"pciVendorSelector": "10DE:26B9", "resourceName": L40S_RES},
           {"pciVendorSelector": "8086:1572", "resourceName": "intel.com/x710"}] if pci is None else pci
    mdev = [{"mdevNameSelector": "NVIDIA A16-4Q", "resourceName": A16_RES, "externalResourceProvider": True}] \
        if mdev is None else mdev
    return {"apiVersion": "kubevirt.io/v1", "kind": "KubeVirt",
            "metadata": {"name": "kubevirt", "namespace": "kubevirt"},
            "spec": {"configuration": {"permittedHostDevices": {"pciHostDevices": pci, "mediatedDevices": mdev}}},
            "status": {"observedKubeVirtVersion": "v1.9.0", "phase": "Deployed"}}


def gpu_node(name, profiles, allocatable):
    labels = {"kubernetes.io/hostname": name}
    labels.update(("%s%s" % (PREFIX, p), str(c)) for p, c in profiles.items())
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "status": {"allocatable": dict({"cpu": "32", "memory": "256Gi"},
                                           **dict((r, str(c)) for r, c in allocatable.items()))}}


# The nodes' own view: gpu-a as vgpu_profile reports it (2 L40S x 2 vGPUs), gpu-b as vgpu_facts does
# (one A16 GPU with 4 mdevs).
NODE_FACTS = {
    "gpu-a": {"gpus": [{"address": "0000:41:00.0", "vgpus": [{"address": "0000:41:00.4", "after": "L40S-24Q"},
                                                             {"address": "0000:41:00.5", "after": "L40S-24Q"}]},
                       {"address": "0000:42:00.0", "vgpus": [{"address": "0000:42:00.4", "after": "L40S-24Q"},
                                                             {"address": "0000:42:00.5", "after": "L40S-24Q"}]}]},
    "gpu-b": {"gpus": [{"address": "0000:45:00.0"}], "vfs": [],
              "mdevs": [{"uuid": "u%d" % i, "parent": "0000:45:00.0", "type_name": "NVIDIA A16-4Q"} for i in range(4)]},
}


def published_devices():
    """What the node agent's DRA driver publishes for NODE_FACTS: gpu-a's four L40S-24Q VFs (two per GPU),
    gpu-b's four A16-4Q mdevs on one GPU (plugins/module_utils/kubelet/dra/devices.py entries)."""
    gpu_a = [DraDevice(device_name("L40S-24Q", vf), "vendor-vfio", vf, vf[:-1] + "0", "L40S-24Q", "NVIDIA L40S-24Q",
                       1155, pcie_root="pci0000:40", product="L40S", framebuffer_mib=24576)
             for vf in ("0000:41:00.4", "0000:41:00.5", "0000:42:00.4", "0000:42:00.5")]
    uuids = ["5c8f3b52-0000-4000-8000-00000000000%d" % i for i in range(4)]
    gpu_b = [DraDevice(device_name("A16-4Q", uuid), "mdev", "0000:45:00.%d" % (i + 4), "0000:45:00.0", "A16-4Q",
                       "NVIDIA A16-4Q", 719, mdev_uuid=uuid, product="A2/A16", framebuffer_mib=4096)
             for i, uuid in enumerate(uuids)]
    return {"gpu-a": gpu_a, "gpu-b": gpu_b}


# The DeviceClass of every vGPU of the driver, as the node agent's chart creates it
# (charts/accelops-vgpu-node-agent/templates/deviceclasses.yaml).
VGPU_CLASS = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "vgpu.accelops.io"},
              "spec": {"selectors": [{"cel": {"expression": 'device.driver == "vgpu.accelops.io"'}}]}}


def our_dra_driver(state, devices=None, with_class=True):
    """`state` plus the accelops DRA driver serving: its ResourceSlices (one pool per node, generation 1), its
    DeviceClass (VGPU_CLASS, unless not `with_class`), and ResourceClaims served for the run to create."""
    resources = state["resources"]
    resources[SLICES] = {"kind": "ResourceSlice", "singular": "resourceslice", "namespaced": False,
                         "verbs": ["get", "list"]}
    resources[CLAIMS] = {"kind": "ResourceClaim", "singular": "resourceclaim", "namespaced": True,
                         "verbs": ["get", "list", "create", "delete", "patch"]}
    for node, node_devices in sorted((devices or published_devices()).items()):
        for body in dra_slices.desired_slices(node, node_devices, 1):
            state["objects"].append({"resource": SLICES, "name": body["metadata"]["name"], "body": body})
    if with_class:
        state["objects"].append({"resource": DEVICE_CLASSES, "name": VGPU_CLASS["metadata"]["name"],
                                 "body": copy.deepcopy(VGPU_CLASS)})
    return state


def healthy_state(dra=True, driver=True):
    """Two GPU nodes (4 x L40S-24Q on 2 GPUs, 4 x A16-4Q on 1 GPU), a CPU node, KubeVirt, DRA (NVIDIA's
    DeviceClass and, with `driver`, ours serving the same vGPUs)."""
    resources = copy.deepcopy(RESOURCES)
    objects = [
        {"resource": KUBEVIRT, "namespace": "kubevirt", "name": "kubevirt", "body": kubevirt_cr()},
        {"resource": NODES, "name": "gpu-a", "body": gpu_node("gpu-a", {"L40S-24Q": 4}, {L40S_RES: 4})},
        {"resource": NODES, "name": "gpu-b", "body": gpu_node("gpu-b", {"A16-4Q": 4}, {A16_RES: 4})},
        {"resource": NODES, "name": "cpu-1", "body": gpu_node("cpu-1", {}, {})},
        {"resource": NAMESPACES, "name": "default", "body": {"apiVersion": "v1", "kind": "Namespace",
                                                             "metadata": {"name": "default"}}},
    ]
    if dra:
        resources[DEVICE_CLASSES] = {"kind": "DeviceClass", "singular": "deviceclass", "namespaced": False,
                                     "verbs": ["get", "list"]}
        objects.append({"resource": DEVICE_CLASSES, "name": "vfio.gpu.nvidia.com", "body": {
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "vfio.gpu.nvidia.com"},
            "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]}}})
        if driver:
            return our_dra_driver({"resources": resources, "objects": objects})
    return {"resources": resources, "objects": objects}


def passthrough_state():
    """healthy_state plus a whole GPU KubeVirt passes through: permitted by PCI ID, on a node without
    profile labels (what the GPU Operator's sandbox device plugin advertises for passthrough)."""
    state = healthy_state()
    cr = state["objects"][0]["body"]
    cr["spec"]["configuration"]["permittedHostDevices"]["pciHostDevices"].append(
        {"pciVendorSelector": "10DE:2BB5", "resourceName": RTX_PRO_RES})
    state["objects"].append({"resource": NODES, "name": "gpu-p", "body": gpu_node("gpu-p", {}, {RTX_PRO_RES: 1})})
    return state


def module_args(kubeconfig, report_dir=None, **extra):
    args = {"kubeconfig": kubeconfig, "node_facts": NODE_FACTS, "running_timeout": 10, "ready_timeout": 10,
            "pending_timeout": 2, "cleanup_timeout": 10, "poll_interval": 0.2, "container_disk_image": "example/disk:1"}
    if report_dir is not None:
        args["report_dir"] = str(report_dir)
    args.update(extra)
    return args


def start_module(args, check=False, diff=False):
    """The module as its own process (args on stdin), for runs that get a signal."""
    payload = {"ANSIBLE_MODULE_ARGS": dict(args, _ansible_check_mode=check, _ansible_diff=diff)}
    environ = {k: v for k, v in os.environ.items() if not k.startswith("K8S_AUTH_")}
    environ["PYTHONPATH"] = str(COLLECTIONS)
    proc = subprocess.Popen([sys.executable, "-m", MODULES + "vgpu_conformance"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environ)
    proc.stdin.write(json.dumps(payload))
    proc.stdin.close()
    return proc


def rows(result, check=None):
    return [r for r in result["report"]["checks"] if check is None or r["check"] == check]


def row(result, check, subject):
    found = [r for r in rows(result, check) if r["subject"] == subject]
    assert len(found) == 1, (check, subject, rows(result, check))
    return found[0]


def created_and_deleted(log):
    """(POSTed object paths, DELETEd object paths) of the module's requests in the API request log."""
    posts, deletes = [], []
    for entry in log:
        if entry["method"] == "POST":
            posts.append(entry["path"])
        elif entry["method"] == "DELETE":
            deletes.append(entry["path"])
    return posts, deletes


def stored(cluster, resource, name, namespace=None):
    """The object as the API server double holds it, None when there is none."""
    try:
        return cluster.get(resource, name, namespace)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise


def writes(cluster):
    return [(e["method"], e["path"]) for e in cluster.log() if e["method"] in ("POST", "PUT", "DELETE")]
