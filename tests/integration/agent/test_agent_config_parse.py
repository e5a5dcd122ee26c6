"""Issue 41.5: one reconcile parses the config document once (the layout's entries, the claim-time declaration and
the hand-over to the boot unit read the same parsed document), and a resync of an unchanged file parses nothing.
The agent in this process against gpusim and the API server double, every JSON/YAML load counted."""

from __future__ import annotations

import argparse

from ansible_collections.accelops.vgpu.plugins.module_utils.agent import agent as agent_module
from ansible_collections.accelops.vgpu.plugins.module_utils.agent import kube, settings as agent_settings
from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout import vgpu_layout
from ansible_collections.accelops.vgpu.tests.integration.agent.agent_helpers import CONFIGS, NODE, kubeconfig_for


def test_a_reconcile_parses_the_config_once_and_an_unchanged_file_not_again(gpusim_node, cluster, tmp_path,
                                                                            monkeypatch):
    node = gpusim_node("l40s:1")
    for key, value in node.env.items():          # the fake nvidia-smi / sriov-manage act on this node
        monkeypatch.setenv(key, value)
    config = tmp_path / "config.yaml"
    config.write_text(CONFIGS.read_text())
    settings = agent_settings.resolve(argparse.Namespace(), dict(
        NODE_NAME=NODE, CONFIG_FILE=str(config), DEFAULT_VGPU_CONFIG="default", NAMESPACE="vgpu-agent",
        ACCELOPS_VGPU_SYSFS_ROOT=node.root, ACCELOPS_VGPU_DEV_ROOT=node.dev_root, ACCELOPS_VGPU_PROC_ROOT="/proc",
        STATUS_FILE=str(tmp_path / "status.json"), KUBELET_DIR=str(tmp_path / "kubelet"),
        HANDOVER_FILE=str(tmp_path / "handover.json")))
    api = kube.KubeClient(kube.from_kubeconfig(kubeconfig_for(cluster.api.url, tmp_path / "kubeconfig")))
    parsed, real = [], vgpu_layout.load_document

    def counted(text, source):
        parsed.append(source)
        return real(text, source)
    monkeypatch.setattr(vgpu_layout, "load_document", counted)
    agent = agent_module.Agent(settings, api, "vgpu-agent")
    agent.on_node(api.get_node(NODE))
    agent.step()                                  # the first reconcile: the default layout applied
    assert agent.reconciled and node.read(
        "bus/pci/devices/%s/nvidia/current_vgpu_type" % node.vfs(node.pfs()[0])[0]) != "0"
    assert parsed == [str(config)]
    agent.next_resync = 0.0                       # the resync is due: the same file, nothing parsed again
    agent.step()
    assert parsed == [str(config)]
    config.write_text(config.read_text() + "# edited\n")
    agent.step()                                  # a new content: parsed once more, reconciled
    assert parsed == [str(config)] * 2 and agent.reconciled[1] == agent.config.digest
