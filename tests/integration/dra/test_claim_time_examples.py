"""The claim-time VMI examples (docs/examples/claim-time/*/: template.yaml, vmi.yaml) as a user applies them: valid Kubernetes 1.36/1.37 objects
(strict schemas), and on a claim-time node (gpusim, every GPU claim-time) each VMI's template becomes a ResourceClaim
of its launcher pod, the scheduler double allocates it on a claim-time device (the CEL profile, the prioritized
list's fallback), the real DRA driver prepares it (the VF typed, its address in the metadata KubeVirt reads) and
unprepares it once the VMI is gone (the type cleared)."""

from __future__ import annotations

import copy
import pathlib

import kubernetes_validate
import pytest
import yaml

from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import slices
from ansible_collections.accelops.vgpu.tests.fakes.vmi_controller import DELETE_PROTECTION, VmiController
from ansible_collections.accelops.vgpu.tests.integration.agent.agent_helpers import wait_for
from ansible_collections.accelops.vgpu.tests.integration.dra.claim_time_cluster import (
    ClaimTimeNode, claims_of, cluster_state, create, delete, listed, phase, ref)
from ansible_collections.accelops.vgpu.tests.integration.dra.dra_helpers import NODE

ROOT = pathlib.Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "docs" / "examples" / "claim-time"
CLAIM_PATH = "/apis/resource.k8s.io/v1/namespaces/vms/resourceclaims"


def example(name):
    """(template, VMI) of one example directory: one object per file, as the sanity test's yamllint wants."""
    return tuple(yaml.safe_load((EXAMPLES / name / part).read_text()) for part in ("template.yaml", "vmi.yaml"))


def test_the_examples_are_the_two_directories_each_a_template_and_its_vmi():
    assert sorted(p.name for p in EXAMPLES.iterdir()) == ["profile-by-cel", "profile-fallback"]
    for name in ("profile-by-cel", "profile-fallback"):
        template, vmi = example(name)
        assert (template["kind"], vmi["kind"]) == ("ResourceClaimTemplate", "VirtualMachineInstance")


@pytest.mark.parametrize("name", ["profile-by-cel", "profile-fallback"])
def test_each_example_is_a_valid_template_and_a_vmi_naming_its_claim_and_request(name):
    template, vmi = example(name)
    for version in ("1.36.0", "1.37.0"):
        kubernetes_validate.validate(template, version, strict=True)
    [claim] = vmi["spec"]["resourceClaims"]
    [gpu] = vmi["spec"]["domain"]["devices"]["gpus"]
    [request] = template["spec"]["spec"]["devices"]["requests"]
    assert claim["resourceClaimTemplateName"] == template["metadata"]["name"]
    assert (gpu["claimName"], gpu["requestName"]) == (claim["name"], request["name"])
    assert "deviceName" not in gpu and vmi["metadata"]["namespace"] == template["metadata"]["namespace"]


def test_the_examples_vmis_get_claim_time_vgpus_typed_at_prepare_and_cleared_at_unprepare(
        gpusim_node, dra_api, monkeypatch, tmp_path):
    dra_api.reset(cluster_state())
    node = ClaimTimeNode(gpusim_node("l40s:2"), monkeypatch, tmp_path, dra_api)
    first, second = node.gpus()
    by_cel, by_cel_vmi = example("profile-by-cel")
    fallback, fallback_vmi = example("profile-fallback")
    create(dra_api, "resourceclaimtemplates", by_cel)
    create(dra_api, "resourceclaimtemplates", fallback)
    max_24q = node.offer("l40s-24q-gpu-" + second.replace(":", "-").replace(".", "-")).max_instances
    vmis = [by_cel_vmi] + [dict(copy.deepcopy(fallback_vmi), metadata={
        "name": "%s-%d" % (fallback_vmi["metadata"]["name"], n), "namespace": "vms"}) for n in range(max_24q + 1)]
    controller = VmiController(dra_api.url, interval=0.05)
    controller.start()
    try:
        for vmi in vmis:    # one after another: each scheduling decision sees the claims before it
            create(dra_api, "virtualmachineinstances", vmi)
            wait_for("VMI %s Running" % vmi["metadata"]["name"], lambda: phase(dra_api, vmi) == "Running", 15)
        claims = [claims_of(dra_api, vmi)["vgpu"] for vmi in vmis]
    finally:
        controller.stop()
    assert controller.errors == []

    # the resourceclaim controller's claims: generated names, owned by the launcher pod, the template's spec
    for vmi, claim in zip(vmis, claims):
        meta = claim["metadata"]
        assert meta["name"].startswith("virt-launcher-%s-vgpu-" % vmi["metadata"]["name"])
        [owner] = meta["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["controller"]) == (
            "Pod", "virt-launcher-" + vmi["metadata"]["name"], True)
        assert DELETE_PROTECTION in meta["finalizers"] and claim["status"]["reservedFor"][0]["name"] == owner["name"]
    assert claims[0]["spec"] == by_cel["spec"]["spec"]

    # the scheduler double: the CEL picks a 12Q of the first GPU, which then serves 12Q only; the fallback takes
    # 24Q on the second GPU up to its maximum, then falls back to 12Q on the first
    got = [[(r["request"], r["device"], r.get("consumedCapacity")) for r in c["status"]["allocation"]["devices"]["results"]]
           for c in claims]
    d12, d24 = "l40s-12q-gpu-" + first.replace(":", "-").replace(".", "-"), \
        "l40s-24q-gpu-" + second.replace(":", "-").replace(".", "-")
    assert got == [[("vgpu", d12, {"instances": "1"})]] + [[("vgpu/large", d24, {"instances": "1"})]] * max_24q + [
        [("vgpu/small", d12, {"instances": "1"})]]

    # the kubelet's NodePrepareResources through the real driver: each claim gets its own VF of the allocated GPU,
    # typed with the allocated profile (gpusim sysfs), its address in the request's metadata file
    answers = node.driver.prepare([ref(c) for c in claims])
    assert {uid: a.error for uid, a in answers.items()} == {c["metadata"]["uid"]: "" for c in claims}
    vfs = [node.prepared_vf(c) for c in claims]
    assert len(set(vfs)) == len(vfs)
    for claim, vf, result in zip(claims, vfs, got):
        offer = node.offer(result[0][1])
        assert node.parent(vf) == offer.gpu and node.current(vf) == offer.type_id
        assert node.metadata_pci(claim, "vgpu") == vf     # the request, whichever subrequest was chosen

    # the VMIs go: their claims are released and deleted (owner gone), the kubelet unprepares, the types are cleared
    controller = VmiController(dra_api.url, interval=0.05)
    controller.start()
    try:
        for vmi in vmis:
            delete(dra_api, "virtualmachineinstances", vmi)
        wait_for("the claims released and deleted", lambda: listed(dra_api, CLAIM_PATH) == [], 15)
    finally:
        controller.stop()
    assert node.driver.unprepare([ref(c) for c in claims]) == {c["metadata"]["uid"]: "" for c in claims}
    assert [node.current(vf) for vf in vfs] == [0] * len(vfs)
    assert slices.pool_name(NODE) == claims[0]["status"]["allocation"]["devices"]["results"][0]["pool"]
