"""Issue 34: the idle agent walks /proc at most once per resync. The agent in this process (its reconcile against
gpusim and the API server double), every inuse.Holders it makes counted (`Holders.counts`): the apply's and the
telemetry gauge's in-use answers come from one walk."""

from __future__ import annotations

import argparse

from ansible_collections.accelops.vgpu.plugins.module_utils.agent import agent as agent_module
from ansible_collections.accelops.vgpu.plugins.module_utils.agent import kube, settings as agent_settings
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import inuse
from ansible_collections.accelops.vgpu.tests.integration.agent.agent_helpers import CONFIGS, NODE, kubeconfig_for


def test_an_idle_resync_walks_proc_at_most_once_and_the_gauge_still_counts(gpusim_node, cluster, tmp_path,
                                                                           monkeypatch):
    node = gpusim_node("l40s:1")
    for key, value in node.env.items():          # the fake nvidia-smi / sriov-manage act on this node
        monkeypatch.setenv(key, value)
    settings = agent_settings.resolve(argparse.Namespace(), dict(
        NODE_NAME=NODE, CONFIG_FILE=str(CONFIGS), DEFAULT_VGPU_CONFIG="default", NAMESPACE="vgpu-agent",
        ACCELOPS_VGPU_SYSFS_ROOT=node.root, ACCELOPS_VGPU_DEV_ROOT=node.dev_root, ACCELOPS_VGPU_PROC_ROOT="/proc",
        STATUS_FILE=str(tmp_path / "status.json"), KUBELET_DIR=str(tmp_path / "kubelet")))
    api = kube.KubeClient(kube.from_kubeconfig(kubeconfig_for(cluster.api.url, tmp_path / "kubeconfig")))
    made = []

    class Counted(inuse.Holders):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(inuse, "Holders", Counted)
    agent = agent_module.Agent(settings, api, "vgpu-agent")
    agent.on_node(api.get_node(NODE))
    agent.step()                                  # the first reconcile: the default layout applied
    assert agent.reconciled and agent.written is not None and node.read(
        "bus/pci/devices/%s/nvidia/current_vgpu_type" % node.vfs(node.pfs()[0])[0]) != "0"
    del made[:]
    node.clear_log()
    agent.next_resync = 0.0                       # the resync is due: the idle re-assert
    agent.step()
    assert node.log() == []                       # nothing written: an idle resync
    scans = sum(holders.counts["scans"] for holders in made)
    assert scans <= 1, [holders.counts for holders in made]
    assert agent.telemetry.vgpus.value(profile="L40S-24Q", state="free") == 2, agent.telemetry.vgpus.samples
