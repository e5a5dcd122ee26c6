"""The agent with claim-time GPUs (issue 33 review): a vGPU-manager restart under a prepared claim-time VF is
noticed and the claim's type written back from the DRA checkpoint; a VF something else holds is never written."""

from __future__ import annotations

import copy
import os
import socket
import time
import urllib.request

import pytest
import yaml

from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import checkpoint, claim_time, slices
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import claim_holders
from ansible_collections.accelops.vgpu.tests.fakes.kubelet_double_dra import KubeletError
from ansible_collections.accelops.vgpu.tests.fakes.registry import free_port
from ansible_collections.accelops.vgpu.tests.integration.agent.agent_helpers import NODE, RESOURCES, wait_for
from ansible_collections.accelops.vgpu.tests.integration.dra.dra_helpers import (
    CLAIMS, RESOURCES as DRA_RESOURCES, dra_state, program, published_devices, stored_slices)

DRIVER = "vgpu.accelops.io"
L40S_24Q, L40S_12Q = "1155", "1153"
UIDS = ["5e1f7a00-2222-4222-8333-00000000000%d" % n for n in range(1, 4)]


def claim(name, uid, device, share):
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "vms", "uid": uid},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}},
            "status": {"allocation": {"devices": {"results": [
                {"request": "gpu", "driver": DRIVER, "pool": slices.pool_name(NODE), "device": device,
                 "shareID": "%032x" % share, "consumedCapacity": {"instances": "1"}}]}}}}


def config_file(tmp_path, claim_time_entry):
    path = tmp_path / "vgpu-config.yaml"
    path.write_text(yaml.safe_dump({"version": "v1", "vgpu-configs": {
        "default": [{"devices": "all", "vgpu-devices": {"L40S-24Q": 2}}]}, "claim-time": [claim_time_entry]}))
    return str(path)


def current(node, vf):
    return node.read("bus/pci/devices/%s/nvidia/current_vgpu_type" % vf).strip()


def test_a_manager_restart_under_prepared_claim_time_vfs_restores_their_types_never_a_held_one(
        gpusim_node, cluster, start_agent, dra_env, tmp_path):
    kubelet, kubelet_dir, cdi_dir = dra_env
    node = gpusim_node("l40s:1")      # its only GPU claim-time: no label-driven vGPU the probe could watch
    [pf] = node.pfs()
    program(node, [], per_pf=0)        # VFs enabled (sriov_vfs' job: a claim-time GPU gets no VFs from the layout)
    device = claim_time.device_name("L40S-24Q", pf)
    state = dra_state([(CLAIMS, "vms", claim("vm-a-gpu", UIDS[0], device, 1)),
                       (CLAIMS, "vms", claim("vm-b-gpu", UIDS[1], device, 2))])
    state["resources"] = dict(copy.deepcopy(RESOURCES), **DRA_RESOURCES)
    cluster.api.reset(state)
    agent = start_agent(node, cluster.api, DRA_DRIVER="true", KUBELET_DIR=kubelet_dir, CDI_DIR=cdi_dir,
                        CONFIG_FILE=config_file(tmp_path, {"devices": "all", "profiles": ["L40S-24Q"]}),
                        RESYNC_INTERVAL=600, MANAGER_PROBE_INTERVAL=1)
    agent.wait("success", "default")
    wait_for("the claim-time device published", lambda: device in published_devices(cluster.api) or None, timeout=10)
    kubelet.wait("the driver registered", lambda k: any(r["registered"] for r in k.registrations.values()))
    answer = kubelet.prepare(DRIVER, [("vms", "vm-a-gpu", UIDS[0]), ("vms", "vm-b-gpu", UIDS[1])])
    assert [answer[uid]["error"] for uid in UIDS[:2]] == ["", ""]
    typed = [vf for vf in node.vfs(pf) if current(node, vf) == L40S_24Q]
    assert len(typed) == 2

    node.ctl("manager-restart")
    assert [current(node, vf) for vf in typed] == ["0", "0"]
    node.hold(typed[1])                # a process opened vm-b's VF since the restart: nothing may write it
    node.clear_log()
    wait_for("vm-a's VF typed again", lambda: current(node, typed[0]) == L40S_24Q or None, timeout=15)
    wait_for("the restart reported", lambda: (agent.status() or {}).get("manager_restarts", 0) >= 1 or None,
             timeout=15)
    assert current(node, typed[1]) == "0"
    writes = [(w["path"].split("/")[3], w["value"]) for w in node.log() if w["path"].endswith("current_vgpu_type")]
    assert writes == [(typed[0], L40S_24Q)]
    assert "VF %s of DRA claim vms/vm-b-gpu lost its type 1155" % typed[1] in agent.output()
    time.sleep(3)           # three probes: vm-b's VF, left untyped on purpose, is no restart over and over
    assert agent.status()["manager_restarts"] == 1 and agent.status()["state"] == "success"


def restart_events(api):
    """The stored Events of a noticed vGPU-manager restart (agent.EVENT_MANAGER_RESTART)."""
    return [obj for obj in api.stored() if obj.get("kind") == "Event" and obj.get("reason") == "VGPUManagerRestarted"]


def claims_node(gpusim_node, cluster, profile, names=("vm-a-gpu",), gpus="l40s:1"):
    """L40S GPUs with VFs; claims vms/<names> (UIDS in order) allocated the `profile` device of the last GPU:
    (node, that GPU, device)."""
    node = gpusim_node(gpus)
    pf = node.pfs()[-1]
    program(node, [], per_pf=0)
    device = claim_time.device_name(profile, pf)
    state = dra_state([(CLAIMS, "vms", claim(name, uid, device, share))
                       for share, (name, uid) in enumerate(zip(names, UIDS), 1)])
    state["resources"] = dict(copy.deepcopy(RESOURCES), **DRA_RESOURCES)
    cluster.api.reset(state)
    return node, pf, device


def test_a_first_reconcile_leaving_a_held_claim_time_vf_untyped_reports_no_manager_restart(
        gpusim_node, cluster, start_agent, dra_env, tmp_path):
    """A claim prepared by the last agent; a manager restart reset its VF and a process holds it since: the next
    agent's first reconcile leaves it untyped on purpose. That is no restart: no Event, the metric stays 0."""
    kubelet, kubelet_dir, cdi_dir = dra_env
    node, pf, device = claims_node(gpusim_node, cluster, "L40S-24Q")
    env = dict(DRA_DRIVER="true", KUBELET_DIR=kubelet_dir, CDI_DIR=cdi_dir, RESYNC_INTERVAL=600,
               CONFIG_FILE=config_file(tmp_path, {"devices": "all", "profiles": ["L40S-24Q"]}),
               MANAGER_PROBE_INTERVAL=1)
    first = start_agent(node, cluster.api, **env)
    first.wait("success", "default")
    wait_for("the claim-time device published", lambda: device in published_devices(cluster.api) or None, timeout=10)
    kubelet.wait("the driver registered", lambda k: any(r["registered"] for r in k.registrations.values()))
    assert kubelet.prepare(DRIVER, [("vms", "vm-a-gpu", UIDS[0])])[UIDS[0]]["error"] == ""
    [vf] = [vf for vf in node.vfs(pf) if current(node, vf) == L40S_24Q]
    first.stop()
    node.ctl("manager-restart")
    node.hold(vf)                      # a process opened the claim's VF since: it stays untyped
    port = free_port()
    agent = start_agent(node, cluster.api, METRICS_PORT=port, METRICS_BIND_ADDRESS="127.0.0.1", **env)
    agent.wait("success", "default")
    time.sleep(3)                      # three probes after the first reconcile
    assert current(node, vf) == "0"
    assert agent.status()["manager_restarts"] == 0 and agent.status()["state"] == "success"
    assert restart_events(cluster.api) == []
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=5) as response:
        samples = [line for line in response.read().decode().splitlines()
                   if line.startswith("accelops_vgpu_agent_manager_restarts_total")]
    assert samples in ([], ["accelops_vgpu_agent_manager_restarts_total 0"])    # a counter not counted yet: no sample


def killed_mid_prepare(first, node, pf, kubelet_dir, name, device):
    """kill -9 of agent `first` (claim UIDS[0] prepared) while it prepared claim `name` (UIDS[1]) on `device`: B's
    VF typed and recorded PrepareStarted, no answer. (plugin dir, A's VF, B's VF)."""
    first.proc.kill()
    first.proc.wait()
    plugin_dir = claim_holders.plugin_dir(kubelet_dir)
    record = checkpoint.Checkpoint(plugin_dir, checkpoint.read_boot_id("/proc"))
    [vf_a] = [d["key"] for d in record.get(UIDS[0])["devices"]]
    vf_b = [vf for vf in node.vfs(pf) if vf != vf_a][0]
    node.write("bus/pci/devices/%s/nvidia/current_vgpu_type" % vf_b, L40S_12Q)     # B's type written, then the kill
    record.set(UIDS[1], "vms", name, checkpoint.STARTED, [{
        "requests": ["gpu"], "pool": slices.pool_name(NODE), "device": device, "key": vf_b, "typeID": int(L40S_12Q),
        "cdiIDs": [], "claimTime": True}])
    record.save()
    return plugin_dir, vf_a, vf_b


def test_a_restarted_agent_registers_once_it_knows_its_devices_and_finishes_a_prepare_a_kill_cut_short(
        gpusim_node, cluster, start_agent, dra_env, tmp_path):
    """Issue 40.1: the kubelet calls NodePrepareResources as soon as the driver registers. After a kill -9 (claim A
    prepared, claim B's prepare cut short between its type write and its answer: PrepareStarted, VF typed), the
    restarted agent's first reconcile is slow (its Node list answered 429, Retry-After 4 s): the driver registers
    only once that reconcile knows the claim-time offers, and the kubelet's first answer prepares A (from the
    checkpoint), B (on its own VF, no write) and a new claim C. Registered at once, B and C read as removed."""
    kubelet, kubelet_dir, cdi_dir = dra_env
    names = ["vm-a-gpu", "vm-b-gpu", "vm-c-gpu"]
    node, pf, device = claims_node(gpusim_node, cluster, "L40S-12Q", names)    # 4 per GPU
    env = dict(DRA_DRIVER="true", KUBELET_DIR=kubelet_dir, CDI_DIR=cdi_dir, RESYNC_INTERVAL=600,
               CONFIG_FILE=config_file(tmp_path, {"devices": "all", "profiles": ["L40S-12Q"]}))
    first = start_agent(node, cluster.api, **env)
    first.wait("success", "default")
    kubelet.wait("the driver registered", lambda k: any(r["registered"] for r in k.registrations.values()))
    answer_a = kubelet.prepare(DRIVER, [("vms", names[0], UIDS[0])])[UIDS[0]]
    assert answer_a["error"] == ""
    plugin_dir, vf_a, vf_b = killed_mid_prepare(first, node, pf, kubelet_dir, names[1], device)
    cluster.api.control("fail", {"method": "GET", "plural": "nodes", "count": 1, "status": 429, "retry_after": 4})
    node.clear_log()
    agent = start_agent(node, cluster.api, **env)
    # the DRA plugin started (its log line comes before the Node's first list, so well inside the 4 s): its old
    # service socket is not served yet, so the kubelet cannot call it
    wait_for("the DRA plugin started", lambda: "DRA driver %s: " % DRIVER in agent.output() or None, timeout=15)
    with socket.socket(socket.AF_UNIX) as probe, pytest.raises(ConnectionRefusedError):
        probe.connect(os.path.join(plugin_dir, "dra.sock"))

    def first_answer():
        try:
            return kubelet.prepare(DRIVER, [("vms", name, uid) for name, uid in zip(names, UIDS)])
        except KubeletError:        # the old sockets: nobody listens until the restarted driver serves them
            return None
    answer = wait_for("an answer from the restarted driver", first_answer, timeout=30, interval=0.2)
    assert [answer[uid]["error"] for uid in UIDS] == ["", "", ""]
    assert answer[UIDS[0]]["devices"] == answer_a["devices"]
    entries = checkpoint.Checkpoint(plugin_dir).claims
    assert [entries[uid]["state"] for uid in UIDS] == [checkpoint.COMPLETED] * 3
    vf_c = entries[UIDS[2]]["devices"][0]["key"]
    assert entries[UIDS[1]]["devices"][0]["key"] == vf_b and vf_c not in (vf_a, vf_b)
    writes = [(w["path"].split("/")[3], w["value"]) for w in node.log() if w["path"].endswith("current_vgpu_type")]
    assert writes == [(vf_c, L40S_12Q)]


def test_a_claim_time_gpu_in_device_plugin_gpus_is_one_line_naming_it_and_nothing_is_written(
        gpusim_node, cluster, start_agent, kubelet, tmp_path):
    node = gpusim_node("l40s:2")
    first, second = node.pfs()
    program(node, [], per_pf=0)
    node.clear_log()
    agent = start_agent(node, cluster.api, DEVICE_PLUGIN="true", DRA_DRIVER="true", KUBELET_DIR=kubelet.root,
                        CDI_DIR=str(tmp_path / "cdi"), DEVICE_PLUGIN_GPUS=second, DRA_DRIVER_GPUS=first,
                        CONFIG_FILE=config_file(tmp_path, {"devices": [1], "profiles": ["L40S-24Q"]}))
    status = agent.wait("failed", "default")
    reason = ("GPU %s is claim-time in %s and in DEVICE_PLUGIN_GPUS: a claim-time GPU is served by the DRA driver "
              "only; take it out of DEVICE_PLUGIN_GPUS" % (second, tmp_path / "vgpu-config.yaml"))
    assert status["reason"] == reason and cluster.annotations()["accelops.io/vgpu.config.reason"] == reason
    assert [w for w in node.log() if w["path"].endswith("current_vgpu_type")] == []


def test_an_unreadable_config_never_serves_a_claim_time_gpus_vfs_through_the_device_plugin(
        gpusim_node, cluster, start_agent, kubelet, tmp_path):
    node = gpusim_node("l40s:2")
    first, second = node.pfs()
    program(node, [], per_pf=0)
    label_vf, claim_vf = node.vfs(first)[0], node.vfs(second)[0]
    for vf in (label_vf, claim_vf):      # GPU 0's layout, and a claim prepared on claim-time GPU 1
        node.write("bus/pci/devices/%s/nvidia/current_vgpu_type" % vf, L40S_24Q)
    record = "%s/plugins/vgpu.accelops.io/claim-time-gpus.json" % kubelet.root
    os.makedirs(os.path.dirname(record), exist_ok=True)
    with open(record, "w") as handle:    # the last apply made GPU 1 claim-time
        handle.write('{"gpus": ["%s"]}\n' % second)
    broken = tmp_path / "broken.yaml"
    broken.write_text("version: v1\nvgpu-configs: [unclosed\n")
    agent = start_agent(node, cluster.api, DEVICE_PLUGIN="true", KUBELET_DIR=kubelet.root, CONFIG_FILE=str(broken))
    agent.wait("failed", "default")
    kubelet.wait("the programmed vGPU of GPU 0 served", lambda k: ids(k) == [label_vf])
    assert [current(node, vf) for vf in (label_vf, claim_vf)] == [L40S_24Q, L40S_24Q]


def ids(kubelet):
    return sorted(i for resource in kubelet.devices() for i, dummy, dummy2 in kubelet.devices(resource))


def test_after_a_reboot_the_agent_enables_a_claim_time_gpus_vfs_and_publishes_its_offers(
        gpusim_node, cluster, start_agent, dra_env, tmp_path):
    """Issue 40 item 3: VFs do not survive a reboot and the layout never selects a claim-time GPU; the agent's first
    reconcile enables them (sriov-manage, verified) without typing any, and its offers reach the slices."""
    kubelet, kubelet_dir, cdi_dir = dra_env
    node = gpusim_node("l40s:1")
    [pf] = node.pfs()
    program(node, [], per_pf=0)
    node.ctl("reboot")
    assert node.vfs(pf) == []
    state = dra_state()
    state["resources"] = dict(copy.deepcopy(RESOURCES), **DRA_RESOURCES)
    cluster.api.reset(state)
    agent = start_agent(node, cluster.api, DRA_DRIVER="true", KUBELET_DIR=kubelet_dir, CDI_DIR=cdi_dir,
                        CONFIG_FILE=config_file(tmp_path, {"devices": "all", "profiles": ["L40S-24Q"]}))
    agent.wait("success", "default")
    assert len(node.vfs(pf)) == 32 and [current(node, vf) for vf in node.vfs(pf)] == ["0"] * 32
    device = claim_time.device_name("L40S-24Q", pf)
    wait_for("the claim-time device published", lambda: device in published_devices(cluster.api) or None, timeout=10)
    assert "SR-IOV VFs are not enabled" not in agent.output()


def test_a_restarted_agent_whose_first_apply_is_refused_still_prepares_claim_time_claims(
        gpusim_node, cluster, start_agent, dra_env, tmp_path):
    """Breaker (issue 40.1): the day-two state of an edited layout that a VM refuses (it holds a VF the new layout
    would retype). The restarted agent's first apply fails on the layout GPU; the claim-time GPU is untouched by
    that refusal, so its claims prepare: one completed (answered from the checkpoint), one a kill cut short
    mid-prepare (its own VF), and a new one. Its offers stay published, untainted."""
    kubelet, kubelet_dir, cdi_dir = dra_env
    names = ["vm-a-gpu", "vm-b-gpu", "vm-c-gpu"]
    node, pf, device = claims_node(gpusim_node, cluster, "L40S-12Q", names, gpus="l40s:2")
    layout_pf = node.pfs()[0]
    env = dict(DRA_DRIVER="true", KUBELET_DIR=kubelet_dir, CDI_DIR=cdi_dir, RESYNC_INTERVAL=600,
               CONFIG_FILE=config_file(tmp_path, {"devices": [1], "profiles": ["L40S-12Q"]}))
    first = start_agent(node, cluster.api, **env)
    first.wait("success", "default")
    kubelet.wait("the driver registered", lambda k: any(r["registered"] for r in k.registrations.values()))
    assert kubelet.prepare(DRIVER, [("vms", names[0], UIDS[0])])[UIDS[0]]["error"] == ""
    plugin_dir, vf_a, vf_b = killed_mid_prepare(first, node, pf, kubelet_dir, names[1], device)
    assert vf_a != vf_b
    [held] = [vf for vf in node.vfs(layout_pf) if current(node, vf) == L40S_24Q][:1]
    node.hold(held)                 # a VM runs on the layout GPU; the operator edits the layout it refuses
    edited = tmp_path / "edited.yaml"
    edited.write_text(yaml.safe_dump({"version": "v1", "vgpu-configs": {
        "default": [{"devices": "all", "vgpu-devices": {"L40S-12Q": 4}}]},
        "claim-time": [{"devices": [1], "profiles": ["L40S-12Q"]}]}))
    node.clear_log()
    agent = start_agent(node, cluster.api, **dict(env, CONFIG_FILE=str(edited)))
    assert "held" in agent.wait("failed", "default")["reason"]

    def answered():
        try:
            return kubelet.prepare(DRIVER, [("vms", name, uid) for name, uid in zip(names, UIDS)])
        except KubeletError:
            return None
    answer = wait_for("an answer from the restarted driver", answered, timeout=30, interval=0.2)
    assert [answer[uid]["error"] for uid in UIDS] == ["", "", ""]
    entries = checkpoint.Checkpoint(plugin_dir).claims
    assert [entries[uid]["state"] for uid in UIDS] == [checkpoint.COMPLETED] * 3
    assert entries[UIDS[1]]["devices"][0]["key"] == vf_b
    stored = [d for s in stored_slices(cluster.api) for d in s["spec"].get("devices") or () if d["name"] == device]
    assert len(stored) == 1 and not stored[0].get("taints")
    assert current(node, held) == L40S_24Q


def test_a_reboot_with_a_narrowed_allow_list_keeps_the_used_profile_published_tainted_and_preparable(
        gpusim_node, cluster, start_agent, dra_env, tmp_path):
    """Breaker (issue 40.2 with a reboot): the allow-list narrowed, then the node reboots before a claim of the dropped
    profile is released. The kubelet that starts deletes the node's slices before the agent starts, then prepares
    the claim again (an earlier boot's): its device must still be published, tainted (kube-scheduler charges the
    GPU's counter for it: no 24Q next to it), and its claim prepared."""
    kubelet, kubelet_dir, cdi_dir = dra_env
    node, pf, device = claims_node(gpusim_node, cluster, "L40S-12Q")
    env = dict(DRA_DRIVER="true", KUBELET_DIR=kubelet_dir, CDI_DIR=cdi_dir, RESYNC_INTERVAL=600)
    first = start_agent(node, cluster.api, **dict(env, CONFIG_FILE=config_file(
        tmp_path, {"devices": "all", "profiles": ["L40S-24Q", "L40S-12Q"]})))
    first.wait("success", "default")
    kubelet.wait("the driver registered", lambda k: any(r["registered"] for r in k.registrations.values()))
    assert kubelet.prepare(DRIVER, [("vms", "vm-a-gpu", UIDS[0])])[UIDS[0]]["error"] == ""
    first.stop()
    narrowed = config_file(tmp_path, {"devices": "all", "profiles": ["L40S-24Q"]})
    node.ctl("reboot")
    plugin_dir = claim_holders.plugin_dir(kubelet_dir)
    record = checkpoint.Checkpoint(plugin_dir)
    record.claims[UIDS[0]]["bootID"] = "an-earlier-boot"    # gpusim reboots the devices, not /proc's boot ID
    record.save()
    kubelet.api_url, kubelet.node = cluster.api.url, NODE
    assert kubelet.wipe_resource_slices() and published_devices(cluster.api) == {}   # the kubelet's start
    agent = start_agent(node, cluster.api, **dict(env, CONFIG_FILE=narrowed))
    agent.wait("success", "default")
    found = wait_for("the used 12Q device published again",
                     lambda: published_devices(cluster.api).get(device), timeout=10)
    assert [{k: t[k] for k in ("key", "effect")} for t in found["taints"]] == [claim_time.WITHDRAWN_TAINT]
    kubelet.wait("the driver registered", lambda k: any(r["registered"] for r in k.registrations.values()))
    answer = kubelet.prepare(DRIVER, [("vms", "vm-a-gpu", UIDS[0])])[UIDS[0]]
    assert answer["error"] == ""
    [vf] = [d["key"] for d in checkpoint.Checkpoint(plugin_dir).get(UIDS[0])["devices"]]
    assert current(node, vf) == L40S_12Q
