"""The agent as the DRA driver vgpu.accelops.io (DRA_DRIVER=true), a real process: ResourceSlices in the API
server double follow the node, the test kubelet prepares claims over gRPC, a prepared vGPU is held."""

from __future__ import annotations

import copy
import os
import shutil
import tempfile
import time

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import slices
from ansible_collections.accelops.vgpu.tests.fakes.kubelet_double_dra import DraKubelet
from ansible_collections.accelops.vgpu.tests.integration.agent.agent_helpers import NODE, RESOURCES, wait_for
from ansible_collections.accelops.vgpu.tests.integration.dra.dra_helpers import (
    CLAIMS, NODE_UID, RESOURCES as DRA_RESOURCES, dra_state, published_devices, stored_slices)

DRIVER, UID = "vgpu.accelops.io", "5e1f7a00-1111-4222-8333-000000000001"
L40S_24Q, L40S_12Q = 1155, 1153


def device_name(profile, vf):
    return "%s-%s" % (profile.lower(), vf.replace(":", "-").replace(".", "-"))


def claim(device):
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "vm-a-gpu", "namespace": "vms", "uid": UID},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}},
            "status": {"allocation": {"devices": {"results": [
                {"request": "gpu", "driver": DRIVER, "pool": slices.pool_name(NODE), "device": device}]}}}}


def test_slices_follow_the_node_claims_prepare_and_a_prepared_vgpu_is_held(gpusim_node, cluster, start_agent, dra_env):
    kubelet, kubelet_dir, cdi_dir = dra_env
    node = gpusim_node("l40s:1")
    pf = node.pfs()[0]
    first = "0000:%s:00.4" % pf.split(":")[1]
    state = dra_state([(CLAIMS, "vms", claim(device_name("L40S-24Q", first)))])
    state["resources"] = dict(copy.deepcopy(RESOURCES), **DRA_RESOURCES)
    cluster.api.reset(state)
    env = {"DRA_DRIVER": "true", "KUBELET_DIR": kubelet_dir, "CDI_DIR": cdi_dir}
    agent = start_agent(node, cluster.api, **env)
    agent.wait("success", "default")
    vfs = node.vfs(pf)
    devices = wait_for("2 x L40S-24Q published", lambda: published_devices(cluster.api) if len(
        published_devices(cluster.api)) == 2 else None, timeout=10)
    assert sorted(devices) == [device_name("L40S-24Q", vf) for vf in vfs[:2]]
    [item] = stored_slices(cluster.api)
    assert item["metadata"]["name"] == slices.slice_name(NODE, 0)
    assert item["metadata"]["ownerReferences"][0]["uid"] == NODE_UID

    kubelet.wait("the driver registered", lambda k: any(r["registered"] for r in k.registrations.values()))
    answer = kubelet.prepare(DRIVER, [("vms", "vm-a-gpu", UID)])
    assert answer[UID]["error"] == ""
    assert answer[UID]["devices"][0]["cdi"][0] == "%s/claim=%s-%s" % (DRIVER, UID, device_name("L40S-24Q", first))
    assert os.path.exists(os.path.join(cdi_dir, "%s-claim_%s.json" % (DRIVER, UID)))

    # the vGPU manager restarts (every VF untyped): the agent re-applies and the prepared claim's own VF gets its
    # type back (it is held by the claim: no other write may touch it, and no other VF may take its place)
    agent.forget_status()
    node.ctl("manager-restart")
    wait_for("the claim's VF typed again", lambda: node.read(
        "bus/pci/devices/%s/nvidia/current_vgpu_type" % first).strip() == str(L40S_24Q) or None, timeout=15)
    agent.wait("success", "default")
    assert sorted(published_devices(cluster.api)) == [device_name("L40S-24Q", vf) for vf in vfs[:2]]

    # a relabel that would retype the prepared vGPU fails before any write, naming the claim
    agent.forget_status()
    before = node.read("bus/pci/devices/%s/nvidia/current_vgpu_type" % first)
    cluster.select("L40S-12Q")
    status = agent.wait("failed", "L40S-12Q")
    assert "DRA claim vms/vm-a-gpu" in status["reason"] and first in status["reason"]
    assert node.read("bus/pci/devices/%s/nvidia/current_vgpu_type" % first) == before

    # kill -9, restart: the claim is still held and unprepare still cleans
    agent.proc.kill()
    agent.proc.wait()
    agent.forget_status()
    agent = start_agent(node, cluster.api, **env)
    agent.wait("failed", "L40S-12Q")
    assert kubelet.unprepare(DRIVER, [("vms", "vm-a-gpu", UID)]) == {UID: ""}
    assert os.listdir(cdi_dir) == []

    # now the relabel goes through and the slices follow within a second of the apply
    agent.forget_status()
    cluster.select("default")
    agent.wait("success", "default")
    agent.forget_status()
    cluster.select("L40S-12Q")
    agent.wait("success", "L40S-12Q")
    done = time.monotonic()
    wait_for("4 x L40S-12Q published", lambda: sorted(published_devices(cluster.api)) == [
        device_name("L40S-12Q", vf) for vf in vfs[:4]], timeout=1.0, interval=0.02)
    assert time.monotonic() - done <= 1.0


@pytest.mark.parametrize("wipe", ["before", "after"], ids=["wipe-then-register", "register-then-wipe"])
def test_a_kubelet_restart_that_wipes_the_slices_gets_them_back_within_seconds(gpusim_node, cluster, start_agent,
                                                                               tmp_path, wipe):
    """The kubelet deletes every ResourceSlice of its node when it starts and registers the plugins again; the
    wipe runs in the background, before or after the registration. The slices come back in seconds (the agent
    used to wait for its 10-minute listing publish), and the agent writes them once."""
    node = gpusim_node("l40s:1")
    state = dra_state()
    state["resources"] = dict(copy.deepcopy(RESOURCES), **DRA_RESOURCES)
    cluster.api.reset(state)
    kubelet_dir = tempfile.mkdtemp(prefix="kl", dir="/tmp")
    kubelet = DraKubelet(kubelet_dir, api_url=cluster.api.url, node=NODE, grace=0.5).start()
    try:
        agent = start_agent(node, cluster.api, DRA_DRIVER="true", KUBELET_DIR=kubelet_dir,
                            CDI_DIR=str(tmp_path / "cdi"))
        agent.wait("success", "default")
        before = wait_for("2 vGPUs published", lambda: stored_slices(cluster.api) if len(
            published_devices(cluster.api)) == 2 else None, timeout=10)
        kubelet.wait("the driver registered", lambda k: any(r["registered"] for r in k.registrations.values()))
        cluster.api.control("log/clear", {})
        wiped = kubelet.restart(wipe=wipe)
        assert wiped == [item["metadata"]["name"] for item in before]
        started = time.monotonic()
        wait_for("the slices published again", lambda: sorted(published_devices(cluster.api)) == sorted(
            published_devices_of(before)) or None, timeout=15, interval=0.1)
        assert time.monotonic() - started < 10           # the kubeletplugin helper takes 30 s
        kubelet.wait("registered again", lambda k: any(r["registered"] for r in k.registrations.values()))
        time.sleep(2)                                     # a late republish would write again: none does
        creates = [r for r in cluster.api.log() if r["method"] == "POST" and r["path"].endswith("/resourceslices")]
        assert len(creates) == len(before)
        assert [item["spec"]["devices"] for item in stored_slices(cluster.api)] == [
            item["spec"]["devices"] for item in before]
    finally:
        kubelet.stop()
        shutil.rmtree(kubelet_dir, ignore_errors=True)


def published_devices_of(slices_):
    return [device["name"] for item in slices_ for device in item["spec"]["devices"]]
