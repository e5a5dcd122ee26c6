"""The conformance run's DRA rows through claim-time GPUs with the node side real: the vgpu_conformance module against
the API server double, the fake KubeVirt controller allocating its claims on the claim-time devices a gpusim node
publishes, and a kubelet stand-in that prepares each reserved claim through the real DRA driver (the VF typed) and
unprepares it once the claim is released (the type cleared), as the kubelet does around the launcher pod."""

from __future__ import annotations

import threading

from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import checkpoint
from ansible_collections.accelops.vgpu.tests.fakes.vmi_controller import VmiController
from ansible_collections.accelops.vgpu.tests.integration.agent.agent_helpers import wait_for
from ansible_collections.accelops.vgpu.tests.integration.cluster.cluster_helpers import run_module
from ansible_collections.accelops.vgpu.tests.integration.conformance.conformance_helpers import (
    healthy_state, kubevirt_cr, module_args, our_dra_driver, published_devices, row)
from ansible_collections.accelops.vgpu.tests.integration.dra.claim_time_cluster import ClaimTimeNode, listed, ref

NS = "vgpu-conformance"


class Kubelet(threading.Thread):
    """Prepares every claim of the run's namespace that is allocated and reserved, unprepares the ones released or
    gone; records which VF each claim got and the type it read there right after the prepare."""

    def __init__(self, node, api):
        super().__init__(daemon=True)
        self.node, self.api = node, api
        self.prepared, self.typed, self.errors, self.seen = {}, {}, [], set()
        self.stopped = threading.Event()

    def step(self):
        path = "/apis/resource.k8s.io/v1/namespaces/%s/resourceclaims" % NS
        claims = {c["metadata"]["uid"]: c for c in listed(self.api, path)}
        for uid, claim in list(self.prepared.items()):
            if uid not in claims or not (claims[uid].get("status") or {}).get("reservedFor"):
                answer = self.node.driver.unprepare([ref(claim)])
                if answer[uid]:
                    self.errors.append(answer[uid])
                del self.prepared[uid]
        for uid, claim in claims.items():
            status = claim.get("status") or {}
            if uid in self.prepared or not status.get("allocation") or not status.get("reservedFor"):
                continue
            answer = self.node.driver.prepare([ref(claim)])[uid]
            if answer.error:
                self.errors.append(answer.error)
                continue
            self.prepared[uid] = claim
            self.seen.add(uid)
            vf = self.node.prepared_vf(claim)
            device = status["allocation"]["devices"]["results"][0]["device"]
            self.typed[claim["metadata"]["name"]] = (device, vf, self.node.current(vf), self.node.metadata_pci(
                claim, "vgpu"))

    def run(self):
        while not self.stopped.wait(0.05):
            try:
                self.step()
            except Exception as exc:  # pylint: disable=broad-exception-caught  # the test reads them
                self.errors.append(repr(exc))

    def stop(self):
        self.stopped.set()
        self.join(timeout=10)


def test_the_dra_rows_run_through_claim_time_gpus_typed_at_prepare_and_cleared_at_unprepare(
        gpusim_node, dra_api_server, monkeypatch, tmp_path):
    dra_api_server.reset(our_dra_driver(healthy_state(driver=False), devices={"gpu-b": published_devices()["gpu-b"]}))
    node = ClaimTimeNode(gpusim_node("l40s:2"), monkeypatch, tmp_path, dra_api_server)   # publishes gpu-a's offers
    state_cr = kubevirt_cr(pci=[], mdev=[])   # through DRA only
    dra_api_server.control("patch", {"resource": "kubevirt.io/v1/kubevirts", "namespace": "kubevirt",
                                     "name": "kubevirt", "patch": {"spec": state_cr["spec"]}})
    node.gpu_node.clear_log()
    kubelet, controller = Kubelet(node, dra_api_server), VmiController(dra_api_server.url, interval=0.05)
    kubelet.start()
    controller.start()
    try:
        rc, result = run_module("vgpu_conformance", module_args(dra_api_server.kubeconfig_file(tmp_path),
                                                                profiles=["L40S-24Q", "L40S-12Q"]))
    finally:
        controller.stop()
    try:
        assert rc == 0, result.get("msg")
        for profile in ("L40S-24Q", "L40S-12Q"):
            for check in ("sharing.dra", "over-allocation.dra"):
                found = row(result, check, "%s@gpu-a" % profile)
                assert found["status"] == "PASS", found
        # the kubelet stand-in's view: every capacity claim was prepared on its own VF of the allocated GPU, typed
        # with the allocated profile, its address in the metadata KubeVirt reads (the extra claims never were)
        offers = {o.name: o for o in node.offers}
        most = {p: sum(o.max_instances for o in node.offers if getattr(o, "profile", None) == p)
                for p in ("L40S-24Q", "L40S-12Q")}
        assert sorted(n.rsplit("-", 1)[0] for n in kubelet.typed) == sorted(
            ["vgpu-conformance-dra-l40s-24q"] * most["L40S-24Q"] + ["vgpu-conformance-dra-l40s-12q"] * most["L40S-12Q"])
        for name, (device, vf, current, pci) in kubelet.typed.items():
            assert (node.parent(vf), current, pci) == (offers[device].gpu, offers[device].type_id, vf), name
        # all released: every type cleared again, nothing left in the driver's checkpoint
        wait_for("every claim unprepared", lambda: not kubelet.prepared, 10)
    finally:
        kubelet.stop()
    assert kubelet.errors == []
    typed = [vf for vf in node.gpu_node.vfs(node.gpus()[0]) + node.gpu_node.vfs(node.gpus()[1]) if node.current(vf)]
    assert typed == [] and [checkpoint.Checkpoint(node.plugin_dir).get(uid) for uid in kubelet.seen] == [None] * len(
        kubelet.seen)
    writes = [w["value"] for w in node.gpu_node.log() if w["path"].endswith("/current_vgpu_type")]
    assert sorted(writes) == sorted([str(offers[d].type_id) for d, _vf, _t, _p in kubelet.typed.values()]
                                    + ["0"] * len(kubelet.typed))


def test_the_whole_gpu_and_its_vgpus_exclude_each_other_in_the_run(gpusim_node, dra_api_server, monkeypatch, tmp_path):
    """exclusion.dra through the module and the scheduler double (tests/fakes/vmi_controller.py) over what a
    whole-gpu claim-time node publishes: the whole GPU first then a vGPU of it, and the other way round."""
    dra_api_server.reset(our_dra_driver(healthy_state(driver=False), devices={"gpu-b": published_devices()["gpu-b"]}))
    node = ClaimTimeNode(gpusim_node("l40s:1"), monkeypatch, tmp_path, dra_api_server, profiles=["L40S-24Q"],
                         whole=True)
    dra_api_server.control("patch", {"resource": "kubevirt.io/v1/kubevirts", "namespace": "kubevirt",
                                     "name": "kubevirt", "patch": {"spec": kubevirt_cr(pci=[], mdev=[])["spec"]}})
    controller = VmiController(dra_api_server.url, interval=0.05)
    controller.start()
    try:
        rc, result = run_module("vgpu_conformance", module_args(dra_api_server.kubeconfig_file(tmp_path),
                                                                profiles=["L40S-24Q"]))
    finally:
        controller.stop()
    assert rc == 0, result.get("msg")
    found = row(result, "exclusion.dra", "%s@gpu-a" % node.gpus()[0])
    assert found["status"] == "PASS", found
    assert [(r["holds"][0].rsplit("/", 1)[1], r["second_allocation"]) for r in found["details"]["rounds"]] == [
        ("whole-gpu-%s" % node.gpus()[0].replace(":", "-").replace(".", "-"), []),
        ("l40s-24q-gpu-%s" % node.gpus()[0].replace(":", "-").replace(".", "-"), [])]
