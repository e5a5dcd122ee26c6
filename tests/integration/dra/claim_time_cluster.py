"""A claim-time node end to end for the integration tests: a gpusim node whose GPUs are all claim-time, the engine's
apply result published through the agent's SlicePublisher into the API server double, the fake KubeVirt controller
(tests/fakes/vmi_controller.py: the resourceclaim controller and kube-scheduler's allocator) making and allocating
the claims, and the real DRA driver (driver.py with claim_time_prepare.py) preparing them on gpusim."""

from __future__ import annotations

import copy
import json
import os
import urllib.error
import urllib.request

from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import checkpoint, claim_time, devices, metadata
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.claim_time_prepare import ClaimTimePreparer
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.claims import ClaimRef
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.driver import DraDriver
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.publisher import SlicePublisher
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import claim_holders
from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout import vgpu_layout
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import facts, vgpu_apply
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine.claim_time_layout import declaration
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import Sysfs
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders.kubelet_holders import node_holders
from ansible_collections.accelops.vgpu.plugins.module_utils.runner import CommandRunner
from ansible_collections.accelops.vgpu.tests.integration.dra.dra_helpers import NODE, NODE_UID, client, dra_state

DEVICE_CLASSES = "resource.k8s.io/v1/deviceclasses"
TEMPLATES = "resource.k8s.io/v1/resourceclaimtemplates"
VMIS = "kubevirt.io/v1/virtualmachineinstances"
CLAIMS = "resource.k8s.io/v1/resourceclaims"
# the chart's DeviceClass of every vGPU (charts/accelops-vgpu-node-agent/templates/deviceclasses.yaml)
VGPU_CLASS = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "vgpu.accelops.io"},
              "spec": {"selectors": [{"cel": {"expression": 'device.driver == "vgpu.accelops.io"'}}]}}
PROFILES = ["L40S-24Q", "L40S-12Q"]


def document(profiles=None, whole=False):
    """The agent's config: every GPU claim-time, offering `profiles` (and, with `whole`, the whole GPU too)."""
    entry = {"devices": "all", "profiles": list(profiles or PROFILES)}
    if whole:
        entry["whole-gpu"] = True
    return {"version": "v1", "vgpu-configs": {"default": [{"devices": "all", "vgpu-devices": {}}]},
            "claim-time": [entry]}


def cluster_state(objects=()):
    """dra_state plus what KubeVirt's CRD and the chart declare: VMIs, ResourceClaimTemplates, DeviceClasses."""
    state = dra_state(objects)
    verbs = ["get", "list", "watch", "create", "update", "patch", "delete"]
    state["resources"].update({
        DEVICE_CLASSES: {"kind": "DeviceClass", "singular": "deviceclass", "namespaced": False, "verbs": verbs},
        TEMPLATES: {"kind": "ResourceClaimTemplate", "singular": "resourceclaimtemplate", "namespaced": True,
                    "verbs": verbs},
        VMIS: {"kind": "VirtualMachineInstance", "singular": "virtualmachineinstance", "namespaced": True,
               "verbs": verbs}})
    state["objects"].append({"resource": DEVICE_CLASSES, "name": VGPU_CLASS["metadata"]["name"],
                             "body": copy.deepcopy(VGPU_CLASS)})
    return state


class ClaimTimeNode:
    """The node side: `engine` applied with `document()`, `offers` published, `driver` ready to prepare."""

    def __init__(self, gpu_node, monkeypatch, tmp_path, api, profiles=None, whole=False):
        for name in ("PATH", "GPUSIM_ROOT"):
            monkeypatch.setenv(name, gpu_node.env[name])
        self.gpu_node, self.api = gpu_node, api
        kubelet = str(tmp_path / "kubelet")
        self.engine = vgpu_apply.NodeEngine(Sysfs(gpu_node.root), CommandRunner(), gpu_node.dev_root, "/proc",
                                            cache_dir=str(tmp_path), kubelet_dir=kubelet)
        vgpu_apply.apply(self.engine, vgpu_layout.from_layout([{"profiles": {}}]), enable_vfs=True)
        doc = document(profiles, whole)
        self.engine.claim_time_declaration = declaration(doc)
        result = vgpu_apply.apply(self.engine, vgpu_layout.from_document(doc, "default"))
        sysfs = self.engine.sysfs
        self.offers = claim_time.offers(sysfs, result["claim_time"])
        self.client = client(api, tmp_path)
        SlicePublisher(self.client, NODE, NODE_UID).publish(self.offers)
        self.plugin_dir, self.cdi_dir = claim_holders.plugin_dir(kubelet), str(tmp_path / "cdi")
        self.driver = DraDriver(NODE, lambda ns, name: self.client.get_resource_claim(ns, name, timeout=10),
                                devices.NodeView(sysfs, lambda: facts.gather(sysfs, {})), self.plugin_dir,
                                self.cdi_dir, boot_id="boot-1",
                                typer=ClaimTimePreparer(sysfs, node_holders(sysfs, gpu_node.dev_root, "/proc",
                                                                            kubelet)))
        self.driver.typer.update(self.offers)

    def offer(self, device):
        return next(o for o in self.offers if o.name == device)

    def gpus(self):
        return sorted(claim_time.gpus_of(self.offers))

    def current(self, vf):
        with open(os.path.join(self.gpu_node.root, "bus/pci/devices", vf, "nvidia/current_vgpu_type")) as handle:
            return int(handle.read())

    def parent(self, vf):
        return os.path.basename(os.readlink(os.path.join(self.gpu_node.root, "bus/pci/devices", vf, "physfn")))

    def prepared_vf(self, claim):
        """The VF the driver's checkpoint records for the claim (one device)."""
        [entry] = checkpoint.Checkpoint(self.plugin_dir).get(claim["metadata"]["uid"])["devices"]
        return entry["key"]

    def metadata_pci(self, claim, request):
        """The pciBusID of the KEP-5304 metadata file of the claim's request (what KubeVirt reads)."""
        meta = claim["metadata"]
        with open(metadata.file_path(self.plugin_dir, meta["namespace"], meta["name"], request)) as handle:
            [device] = metadata.read_stream(handle.read())[0]["requests"][0]["devices"]
        return device["attributes"]["resource.kubernetes.io/pciBusID"]["string"]


def ref(claim):
    meta = claim["metadata"]
    return ClaimRef(meta["namespace"], meta["name"], meta["uid"])


def api_call(api, method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(api.url + path, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.load(resp)


def create(api, plural, body):
    """POST `body` (resource.k8s.io/v1 or kubevirt.io/v1, namespaced) as kubectl create would."""
    group = "/apis/%s/namespaces/%s/%s" % (body["apiVersion"], body["metadata"]["namespace"], plural)
    return api_call(api, "POST", group, body)


def delete(api, plural, body):
    meta = body["metadata"]
    return api_call(api, "DELETE", "/apis/%s/namespaces/%s/%s/%s" % (body["apiVersion"], meta["namespace"], plural,
                                                                     meta["name"]))


def listed(api, path):
    return api_call(api, "GET", path).get("items") or []


def phase(api, vmi):
    meta = vmi["metadata"]
    try:
        found = api_call(api, "GET", "/apis/kubevirt.io/v1/namespaces/%s/virtualmachineinstances/%s" % (
            meta["namespace"], meta["name"]))
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise
    return (found.get("status") or {}).get("phase")


def claims_of(api, vmi):
    """The ResourceClaims the pod of `vmi` owns (generated from its templates), by the pod's claim name."""
    uid = api_call(api, "GET", "/apis/kubevirt.io/v1/namespaces/%s/virtualmachineinstances/%s" % (
        vmi["metadata"]["namespace"], vmi["metadata"]["name"]))["metadata"]["uid"]
    found = {}
    for claim in listed(api, "/apis/resource.k8s.io/v1/namespaces/%s/resourceclaims" % vmi["metadata"]["namespace"]):
        if any(o.get("uid") == uid for o in claim["metadata"].get("ownerReferences") or ()):
            found[claim["metadata"]["annotations"]["resource.kubernetes.io/pod-claim-name"]] = claim
    return found
