"""Agent tests: one API server double per session (reset per test), the node CLI zipapp built once."""

from __future__ import annotations

import shutil
import subprocess
import tempfile

import pytest

from ansible_collections.accelops.vgpu.tests.fakes.kubelet_double import TestKubelet
from ansible_collections.accelops.vgpu.tests.fakes.kubelet_double_dra import DraKubelet
from ansible_collections.accelops.vgpu.tests.integration.agent.agent_helpers import (
    NODE, NODE_PYTHON, AgentProcess, Cluster, agent_state)
from ansible_collections.accelops.vgpu.tests.integration.cluster.cluster_helpers import ROOT, ApiServer


@pytest.fixture(scope="session")
def pyz(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("agent-cli") / "accelops-vgpu.pyz")
    subprocess.run([NODE_PYTHON, str(ROOT / "tools" / "build-node-cli.py"), out], check=True, capture_output=True)
    return out


@pytest.fixture(scope="session")
def agent_api():
    with ApiServer.running() as server:
        yield server


@pytest.fixture
def cluster(agent_api):
    """The double holding one Node `gpu-a` without labels; `cluster.api.reset(agent_state(...))` for others."""
    agent_api.reset(agent_state())
    agent_api.control("watch-config", {"bookmark_interval": None})
    return Cluster(agent_api)


@pytest.fixture
def start_agent(pyz, tmp_path):
    """start_agent(gpu_node, api=..., **env) -> a running AgentProcess, stopped at teardown."""
    started = []

    def start(gpu_node, api, argv_prefix=(), **env):
        agent = AgentProcess(pyz, gpu_node, api, tmp_path, argv_prefix, **env).start()
        started.append(agent)
        return agent

    yield start
    for agent in started:
        agent.stop()


@pytest.fixture
def dra_env(tmp_path):
    """(kubelet, kubelet_dir, cdi_dir): a DRA test kubelet in a short directory (socket paths <= 107 bytes)."""
    kubelet_dir = tempfile.mkdtemp(prefix="kl", dir="/tmp")
    kubelet = DraKubelet(kubelet_dir, grace=0.5).start()
    yield kubelet, kubelet_dir, str(tmp_path / "cdi")
    kubelet.stop()
    shutil.rmtree(kubelet_dir, ignore_errors=True)


@pytest.fixture
def kubelet(cluster):
    """The test kubelet (device plugins, plugins_registry, PodResources) in a short directory."""
    root = tempfile.mkdtemp(prefix="kl", dir="/tmp")
    double = TestKubelet(root, api_url=cluster.api.url, node=NODE, grace=1.0).start()
    yield double
    double.stop()
    shutil.rmtree(root, ignore_errors=True)
