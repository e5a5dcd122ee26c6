"""The node agent on a node with an L40S and a GPU that offers no vGPU interface (gpusim's h100-guest) under a
`devices: all` config: the L40S is programmed, the other GPU skipped and reported (status file, Event), state
success; gpusim's write log has nothing naming the skipped GPU."""

from __future__ import annotations

import json

from ansible_collections.accelops.vgpu.tests.integration.agent.agent_helpers import STATE_LABEL

GUEST = "0000:42:00.0"
REASON = "offers no vGPU interface (not an mdev parent, no VF with nvidia/current_vgpu_type)"
CONFIG = """version: v1
vgpu-configs:
  every-gpu:
    - devices: all
      vgpu-devices:
        L40S-24Q: 2
"""


def test_the_agent_programs_the_l40s_and_skips_the_gpu_without_vgpu(gpusim_node, cluster, start_agent, tmp_path):
    node = gpusim_node("l40s:1,h100-guest:1", fresh=True)
    node.clear_log()
    config = tmp_path / "configs.yaml"
    config.write_text(CONFIG)
    agent = start_agent(node, cluster.api, CONFIG_FILE=str(config), DEFAULT_VGPU_CONFIG="every-gpu",
                        RESYNC_INTERVAL=600)
    status = agent.wait("success", "every-gpu")
    assert [(r["address"], r["reason"]) for r in status["reserved"]] == [(GUEST, REASON)], status
    assert cluster.labels()[STATE_LABEL] == "success"
    assert node.read("bus/pci/devices/0000:41:00.4/nvidia/current_vgpu_type") == "1155"
    assert [e for e in node.log() if "0000:42:" in e["path"] or "0000:42:" in str(e["value"])] == []
    bodies = [json.loads(r["body"]) for r in cluster.api.received()
              if r["method"] == "POST" and r["path"].endswith("/events")]
    assert [b["message"] for b in bodies if b["reason"] == "VGPUPassthroughSkipped"] == [
        "config every-gpu: left alone: %s %s" % (GUEST, REASON)]
