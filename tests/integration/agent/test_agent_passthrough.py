"""Issue 32 item 1, the node agent: a node with one GPU passed through (bound to vfio-pci, held by its VM) and
one vGPU GPU. The agent programs the vGPU GPU, leaves the passthrough one as it is (gpusim's driver link and
write log), says so in an Event and in its status file, and reports success."""

from __future__ import annotations

import json
import os

from ansible_collections.accelops.vgpu.tests.integration.agent.agent_helpers import STATE_LABEL

PASSED = "0000:42:00.0"
REASON = "bound to vfio-pci, not to the vGPU host driver nvidia (reserved for whole-GPU passthrough)"


def test_the_agent_programs_the_vgpu_gpu_and_reports_the_passthrough_one_it_left_alone(
        gpusim_node, cluster, start_agent):
    node = gpusim_node("l40s:2")
    node.bind(PASSED, "vfio-pci")
    node.hold(PASSED)
    node.clear_log()
    agent = start_agent(node, cluster.api, RESYNC_INTERVAL=600)
    status = agent.wait("success", "default")
    assert status["reserved"] == [{"address": PASSED, "driver": "vfio-pci", "reason": REASON}]
    assert cluster.labels()[STATE_LABEL] == "success"
    assert node.read("bus/pci/devices/0000:41:00.4/nvidia/current_vgpu_type") == "1155"
    assert os.path.basename(os.readlink(node.device_path(PASSED, "driver"))) == "vfio-pci"
    assert [e for e in node.log() if "0000:42:" in e["path"] or "0000:42:" in str(e["value"])] == []
    bodies = [json.loads(r["body"]) for r in cluster.api.received()
              if r["method"] == "POST" and r["path"].endswith("/events")]
    skipped = [b for b in bodies if b["reason"] == "VGPUPassthroughSkipped"]
    assert len(skipped) == 1 and skipped[0]["type"] == "Normal"
    assert skipped[0]["message"] == "config default: left alone: %s %s" % (PASSED, REASON)
