"""The agent with claim-time GPUs (issue 33 review): a vGPU-manager restart under a prepared claim-time VF is
noticed and the claim's type written back from the DRA checkpoint; a VF something else holds is never written."""

from __future__ import annotations

import copy
import time

import yaml

from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import claim_time
from ansible_collections.accelops.vgpu.tests.integration.agent.agent_helpers import NODE, RESOURCES, wait_for
from ansible_collections.accelops.vgpu.tests.integration.dra.dra_helpers import (
    CLAIMS, RESOURCES as DRA_RESOURCES, dra_state, program, stored_slices)

DRIVER = "vgpu.accelops.io"
L40S_24Q = "1155"
UIDS = ["5e1f7a00-2222-4222-8333-00000000000%d" % n for n in range(1, 4)]


def claim(name, uid, device, share):
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "vms", "uid": uid},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}},
            "status": {"allocation": {"devices": {"results": [
                {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device, "shareID": "%032x" % share,
                 "consumedCapacity": {"instances": "1"}}]}}}}


def config_file(tmp_path, claim_time_entry):
    path = tmp_path / "vgpu-config.yaml"
    path.write_text(yaml.safe_dump({"version": "v1", "vgpu-configs": {
        "default": [{"devices": "all", "vgpu-devices": {"L40S-24Q": 2}}]}, "claim-time": [claim_time_entry]}))
    return str(path)


def published(api):
    """The device names of the node's slices (counter slices carry none)."""
    return {d["name"] for item in stored_slices(api) for d in item["spec"].get("devices") or ()}


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
    wait_for("the claim-time device published", lambda: device in published(cluster.api) or None, timeout=10)
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
