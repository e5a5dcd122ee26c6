"""Claim-time GPUs on day two (issue 40 item 2): an allow-list narrowed under a prepared claim. The agent's DRA plugin
(agent_plugin.VgpuDraPlugin.reconciled) publishes through the API server double; kube-scheduler's allocator double
(tests/fakes/vmi_controller.py DraAllocator) charges a GPU's counter only for allocated devices it still finds in the
slices, as the real one does (kubernetes#140806), and honours NoSchedule device taints; the real driver prepares on
gpusim."""

from __future__ import annotations

import json
import urllib.request
from types import SimpleNamespace

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import agent_plugin, claim_time
from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout import vgpu_layout
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import vgpu_apply
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine.claim_time_layout import declaration
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders.kubelet_holders import node_holders
from ansible_collections.accelops.vgpu.tests.fakes.vmi_controller import DraAllocator, Unallocatable
from ansible_collections.accelops.vgpu.tests.integration.dra.claim_time_cluster import (
    CLAIMS, VGPU_CLASS, ClaimTimeNode, api_call, cluster_state, create, document, listed, ref)
from ansible_collections.accelops.vgpu.tests.integration.dra.dra_helpers import NODE, NODE_UID, stored_slices


def claim_for(name, profile):
    selector = ('device.attributes["vgpu.accelops.io"].claimTime && '
                'device.attributes["vgpu.accelops.io"].profile == "%s"' % profile)
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name, "namespace": "vms"},
            "spec": {"devices": {"requests": [{"name": "vgpu", "exactly": {
                "deviceClassName": "vgpu.accelops.io", "count": 1,
                "selectors": [{"cel": {"expression": selector}}]}}]}}}


def schedule(api, name, profile):
    """Create the claim and allocate it on NODE as kube-scheduler would (DraAllocator over the stored slices and every
    allocated claim); the claim as stored, or Unallocatable."""
    claim = create(api, "resourceclaims", claim_for(name, profile))
    claims = {c["metadata"]["uid"]: c for c in listed(api, "/apis/" + CLAIMS)}
    allocation = DraAllocator([VGPU_CLASS], stored_slices(api), claims).allocate(claim, NODE)
    path = "/apis/resource.k8s.io/v1/namespaces/vms/resourceclaims/" + name
    req = urllib.request.Request(api.url + path, method="PATCH", data=json.dumps(
        {"status": {"allocation": allocation}}).encode(), headers={"Content-Type": "application/merge-patch+json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.load(resp)


def test_narrowing_the_allow_list_under_a_prepared_claim_never_lets_the_scheduler_over_commit_its_gpu(
        gpusim_node, dra_api, tmp_path, monkeypatch):
    dra_api.reset(cluster_state())
    node = ClaimTimeNode(gpusim_node("l40s:1"), monkeypatch, tmp_path, dra_api, profiles=["L40S-24Q", "L40S-12Q"])
    [gpu] = node.gpus()
    clock, lines = [1000.0], []
    settings = SimpleNamespace(node_name=NODE, kubelet_dir=str(tmp_path / "kubelet"), cdi_dir=node.cdi_dir,
                               proc_root="/proc")
    plugin = agent_plugin.VgpuDraPlugin(settings, node.client, None, lines.append, node.engine.sysfs,
                                        node_holders(node.engine.sysfs, node.engine.dev_root, "/proc",
                                                     settings.kubelet_dir),
                                        lambda: node.engine.names, clock=lambda: clock[0])

    def reconcile(profiles):
        node.engine.claim_time_declaration = declaration(document(profiles))
        result = vgpu_apply.apply(node.engine, vgpu_layout.from_document(document(profiles), "default"))
        plugin.reconciled(NODE_UID, node.engine.sysfs, result)

    reconcile(["L40S-24Q", "L40S-12Q"])
    small = schedule(dra_api, "vm-12q", "L40S-12Q")
    assert plugin.driver.prepare([ref(small)])[small["metadata"]["uid"]].error == ""

    reconcile(["L40S-24Q"])         # the operator narrows the allow-list; the 12Q claim lives on
    with pytest.raises(Unallocatable):      # the GPU's counter is still charged by the 12Q claim: no 24Q beside it
        schedule(dra_api, "vm-24q", "L40S-24Q")
    withdrawn = claim_time.device_name("L40S-12Q", gpu)
    [entry] = [d for s in stored_slices(dra_api) for d in s["spec"].get("devices") or () if d["name"] == withdrawn]
    assert [(t["key"], t["effect"]) for t in entry["taints"]] == [("vgpu.accelops.io/withdrawn", "NoSchedule")]
    with pytest.raises(Unallocatable):      # and no new claim gets the withdrawn profile (the taint)
        schedule(dra_api, "vm-12q-new", "L40S-12Q")
    clock[0] += agent_plugin.WITHDRAW_GRACE
    reconcile(["L40S-24Q"])
    assert withdrawn in {d["name"] for s in stored_slices(dra_api) for d in s["spec"].get("devices") or ()}

    # the claim goes (unprepared, deleted): the device is withdrawn and the GPU serves the 24Q
    assert plugin.driver.unprepare([ref(small)]) == {small["metadata"]["uid"]: ""}
    for name in ("vm-12q", "vm-24q", "vm-12q-new"):
        api_call(dra_api, "DELETE", "/apis/resource.k8s.io/v1/namespaces/vms/resourceclaims/" + name)
    reconcile(["L40S-24Q"])
    assert withdrawn not in {d["name"] for s in stored_slices(dra_api) for d in s["spec"].get("devices") or ()}
    big = schedule(dra_api, "vm-24q", "L40S-24Q")
    assert plugin.driver.prepare([ref(big)])[big["metadata"]["uid"]].error == ""
    assert [line for line in lines if withdrawn in line and "stays published" in line]
