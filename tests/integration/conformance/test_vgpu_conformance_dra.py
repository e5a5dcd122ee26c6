"""vgpu_conformance through ResourceClaims (sharing.dra, over-allocation.dra) against the API server double with
the node agent's DRA driver publishing (its ResourceSlices, its DeviceClass) and the fake controller allocating
claims as kube-scheduler does (tests/fakes/vmi_controller.py DraAllocator, CEL through cel-python)."""

from __future__ import annotations

import copy

from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import claim_time
from ansible_collections.accelops.vgpu.tests.integration.cluster.cluster_helpers import run_module
from ansible_collections.accelops.vgpu.tests.integration.conformance.conformance_helpers import (
    CLAIMS, DEVICE_CLASSES, NAMESPACES, VGPU_CLASS, VMIS, healthy_state, kubevirt_cr, module_args, our_dra_driver,
    published_devices, row, rows, stored, writes)

NS = "vgpu-conformance"
CLAIM_PATH = "/apis/resource.k8s.io/v1/namespaces/%s/resourceclaims" % NS
DRA_ROWS = ("sharing.dra", "over-allocation.dra")
# the node agent's per-framework class (charts/accelops-vgpu-node-agent/templates/deviceclasses.yaml)
VENDOR_VFIO_CLASS = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                     "metadata": {"name": "vendor-vfio.vgpu.accelops.io"},
                     "spec": {"selectors": [{"cel": {"expression": 'device.driver == "vgpu.accelops.io" && device.'
                                                                   'attributes["vgpu.accelops.io"].framework == '
                                                                   '"vendor-vfio"'}}]}}


def dra_rows(result):
    return [(r["check"], r["subject"], r["status"], r["reason"]) for r in rows(result) if r["check"] in DRA_ROWS]


def claim_posts(cluster):
    return [path for method, path in writes(cluster) if method == "POST" and path == CLAIM_PATH]


def test_without_dra_the_claim_rows_are_unknown_and_no_claim_is_created(cluster, controller, kubeconfig):
    cluster.reset(healthy_state(dra=False))
    controller()
    rc, result = run_module("vgpu_conformance", module_args(kubeconfig, profiles=["A16-4Q"]))
    assert rc == 0, result.get("msg")
    why = "resource.k8s.io/v1 is not served by this cluster: vGPUs cannot be claimed through DRA"
    assert dra_rows(result) == [("sharing.dra", "vgpu.accelops.io", "UNKNOWN", why),
                                ("over-allocation.dra", "vgpu.accelops.io", "UNKNOWN", why)]
    assert row(result, "sharing", "A16-4Q@gpu-b")["status"] == "PASS"
    assert claim_posts(cluster) == []
    assert stored(cluster, NAMESPACES, NS) is None


def test_dra_served_but_our_driver_publishing_nothing_is_unknown(cluster, controller, kubeconfig):
    cluster.reset(healthy_state(driver=False))
    controller()
    rc, result = run_module("vgpu_conformance", module_args(kubeconfig, profiles=["A16-4Q"]))
    assert rc == 0, result.get("msg")
    assert {r[2] for r in dra_rows(result)} == {"UNKNOWN"}
    assert dra_rows(result)[0][3] == ("vgpu.accelops.io publishes no ResourceSlice: its DRA driver does not serve (the "
                                      "node agent's vgpu_node_agent_dra)")
    assert row(result, "consistency.dra", "resource.k8s.io/v1")["status"] == "PASS"   # NVIDIA's class is there
    assert claim_posts(cluster) == []


def test_a_missing_device_class_is_unknown_naming_it(cluster, controller, kubeconfig):
    cluster.reset(our_dra_driver(healthy_state(driver=False), with_class=False))
    controller()
    rc, result = run_module("vgpu_conformance", module_args(kubeconfig, profiles=["A16-4Q"]))
    assert rc == 0, result.get("msg")
    assert dra_rows(result)[0][2:] == ("UNKNOWN", "DeviceClass vgpu.accelops.io does not exist (the vgpu_node_agent "
                                                  "role creates vgpu.accelops.io with vgpu_node_agent_dra; or set "
                                                  "dra_device_class)")
    assert claim_posts(cluster) == []


def test_a_cluster_that_offers_vgpus_only_through_dra_is_attested_through_claims(cluster, controller, kubeconfig):
    state = healthy_state()
    state["objects"][0]["body"] = kubevirt_cr(pci=[], mdev=[])   # KubeVirt permits no device-plugin resource
    cluster.reset(state)
    controller()
    rc, result = run_module("vgpu_conformance", module_args(kubeconfig, profiles=["L40S-24Q"]))
    assert rc == 0, result.get("msg")
    assert [r[:3] for r in dra_rows(result)] == [("sharing.dra", "L40S-24Q@gpu-a", "PASS"),
                                                 ("over-allocation.dra", "L40S-24Q@gpu-a", "PASS")]
    assert row(result, "sharing", "L40S-24Q")["reason"] == "no node advertises a vGPU of L40S-24Q"
    assert len(claim_posts(cluster)) == 5
    for index in range(1, 5):
        assert stored(cluster, CLAIMS, "vgpu-conformance-dra-l40s-24q-%d" % index, NS) is None
    assert stored(cluster, NAMESPACES, NS) is None


def test_the_device_class_option_is_used_and_its_cel_selectors_decide(cluster, controller, kubeconfig):
    """vendor-vfio.vgpu.accelops.io selects the L40S VFs, not the A16 mdevs: the A16 claims stay unallocated."""
    state = healthy_state()
    state["objects"].append({"resource": DEVICE_CLASSES, "name": VENDOR_VFIO_CLASS["metadata"]["name"],
                             "body": copy.deepcopy(VENDOR_VFIO_CLASS)})
    cluster.reset(state)
    controller()
    rc, result = run_module("vgpu_conformance", module_args(kubeconfig, dra_device_class="vendor-vfio.vgpu.accelops.io",
                                                            running_timeout=3))
    assert rc == 0, result.get("msg")
    l40s = row(result, "sharing.dra", "L40S-24Q@gpu-a")
    assert l40s["status"] == "PASS" and l40s["details"]["device_class"] == "vendor-vfio.vgpu.accelops.io"
    a16 = row(result, "sharing.dra", "A16-4Q@gpu-b")
    assert a16["status"] == "FAIL"
    assert a16["reason"].startswith("not Running after 3s: vgpu-conformance-dra-a16-4q-1 (Pending: 0/3 nodes are "
                                    "available: 1 cannot allocate all claims, 2 node(s) didn't match Pod's node "
                                    "affinity/selector)")
    assert "ResourceClaim vgpu-conformance-dra-a16-4q-4 has 0 allocated device(s) for its request, not 1" in a16["reason"]
    assert row(result, "over-allocation.dra", "A16-4Q@gpu-b")["reason"].startswith(
        "only 0 of the 4 capacity claims were allocated")
    assert row(result, "sharing", "A16-4Q@gpu-b")["status"] == "PASS"   # the device-plugin path is not affected


def test_a_bad_device_class_name_fails_in_one_line_before_anything_is_created(cluster, kubeconfig):
    rc, result = run_module("vgpu_conformance", module_args(kubeconfig, dra_device_class="Bad_Class"))
    assert rc != 0
    assert result["msg"] == "dra_device_class Bad_Class: not a valid DeviceClass name (DNS-1123 subdomain)"
    assert writes(cluster) == []


def test_check_mode_lists_the_claims_and_state_absent_deletes_leftover_claims(cluster, kubeconfig):
    labels = {"accelops.io/vgpu-conformance": "0123abcd"}
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": "vgpu-conformance-dra-a16-4q-1", "namespace": NS, "labels": labels},
             "spec": {"devices": {"requests": [{"name": "vgpu", "exactly": {"deviceClassName": VGPU_CLASS["metadata"]
                                                                            ["name"]}}]}}}
    state = healthy_state()
    state["objects"] += [
        {"resource": NAMESPACES, "name": NS, "body": {"apiVersion": "v1", "kind": "Namespace",
                                                      "metadata": {"name": NS, "labels": labels}}},
        {"resource": CLAIMS, "namespace": NS, "name": claim["metadata"]["name"], "body": claim}]
    cluster.reset(state)
    rc, result = run_module("vgpu_conformance", module_args(kubeconfig, state="absent"), check=True)
    assert (rc, writes(cluster)) == (0, [])
    assert result["would_delete"] == ["ResourceClaim %s/vgpu-conformance-dra-a16-4q-1" % NS, "Namespace " + NS]
    rc, result = run_module("vgpu_conformance", module_args(kubeconfig, state="absent"))
    assert (rc, result["changed"]) == (0, True), result.get("msg")
    assert writes(cluster) == [("DELETE", CLAIM_PATH + "/vgpu-conformance-dra-a16-4q-1"),
                               ("DELETE", "/api/v1/namespaces/" + NS)]
    assert stored(cluster, CLAIMS, "vgpu-conformance-dra-a16-4q-1", NS) is None
    assert stored(cluster, VMIS, "vgpu-conformance-dra-a16-4q-1", NS) is None


def claim_time_gpus(monkeypatch, addresses=("0000:41:00.0", "0000:42:00.0")):
    """What the node agent publishes for claim-time L40S GPUs (kubelet/dra/claim_time.py offers): a counter set per
    GPU and a multi-allocatable device per GPU and profile (24Q: 2 instances, 12Q: 4)."""
    monkeypatch.setattr(claim_time.dra_devices, "pcie_root", lambda sysfs, address: "pci0000:40")
    monkeypatch.setattr(claim_time.dra_devices, "numa_node", lambda sysfs, address: 0)
    profiles = [{"profile": "L40S-24Q", "type_name": "NVIDIA L40S-24Q", "type_id": 1155, "size_mib": 24576,
                 "max_instances": 2},
                {"profile": "L40S-12Q", "type_name": "NVIDIA L40S-12Q", "type_id": 1153, "size_mib": 12288,
                 "max_instances": 4}]
    return claim_time.offers(None, [{"address": a, "model": "L40S", "vfs": 32, "allow": None, "profiles": profiles}
                                    for a in addresses])


def test_claim_time_gpus_are_attested_through_claims_up_to_each_profiles_instances(
        cluster, controller, kubeconfig, monkeypatch):
    """gpu-a's two L40S are claim-time: per profile, as many claims as its devices' instances (24Q: 2 x 2, 12Q:
    2 x 4) each get an instance (shareID) of a claim-time device, two on one GPU; one more stays unallocated. The
    claims of one profile are gone before the next profile's run, so each profile has both GPUs."""
    state = our_dra_driver(healthy_state(driver=False), devices=dict(published_devices(),
                                                                     **{"gpu-a": claim_time_gpus(monkeypatch)}))
    state["objects"][0]["body"] = kubevirt_cr(pci=[], mdev=[])   # through DRA only
    cluster.reset(state)
    controller()
    rc, result = run_module("vgpu_conformance", module_args(kubeconfig, profiles=["L40S-24Q", "L40S-12Q"]))
    assert rc == 0, result.get("msg")
    assert [r[:3] for r in dra_rows(result)] == [
        ("sharing.dra", "L40S-24Q@gpu-a", "PASS"), ("over-allocation.dra", "L40S-24Q@gpu-a", "PASS"),
        ("sharing.dra", "L40S-12Q@gpu-a", "PASS"), ("over-allocation.dra", "L40S-12Q@gpu-a", "PASS")], dra_rows(result)
    sharing = row(result, "sharing.dra", "L40S-12Q@gpu-a")
    assert len(sharing["details"]["vmis"]) == 8 and "instance (shareID) of a claim-time device" in sharing["reason"]
    assert sharing["details"]["claim_time"] == ["gpu-a/vgpu.accelops.io/l40s-12q-gpu-0000-41-00-0",    # pool/device
                                                "gpu-a/vgpu.accelops.io/l40s-12q-gpu-0000-42-00-0"]
    assert sorted(set(sharing["details"]["parent_gpus"].values())) == ["0000:41:00.0", "0000:42:00.0"]
    over = row(result, "over-allocation.dra", "L40S-24Q@gpu-a")
    assert "number 5 for 4 L40S-24Q device(s) and claim-time instance(s)" in over["reason"]
    assert len(claim_posts(cluster)) == (4 + 1) + (8 + 1)
    assert stored(cluster, NAMESPACES, NS) is None
