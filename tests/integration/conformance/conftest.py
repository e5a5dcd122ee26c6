"""Conformance tests: the vgpu_conformance module against the API server double and the fake
KubeVirt controller (tests/fakes/vmi_controller.py) running as a thread of the test process."""

from __future__ import annotations

import pytest

from ansible_collections.accelops.vgpu.tests.fakes.vmi_controller import VmiController
from ansible_collections.accelops.vgpu.tests.integration.cluster.cluster_helpers import ApiServer
from ansible_collections.accelops.vgpu.tests.integration.conformance.conformance_helpers import healthy_state


@pytest.fixture(scope="session")
def api_server():
    with ApiServer.running() as server:
        yield server


@pytest.fixture
def cluster(api_server):
    api_server.reset(healthy_state())
    return api_server


@pytest.fixture
def kubeconfig(api_server, tmp_path):
    return api_server.kubeconfig_file(tmp_path)


@pytest.fixture
def controller(cluster):
    """A factory: controller(never_ready=..., block_overallocation=...) starts one; all stop at teardown."""
    started = []

    def start(**kwargs):
        ctl = VmiController(cluster.url, interval=0.1, **kwargs)
        ctl.start()
        started.append(ctl)
        return ctl
    yield start
    for ctl in started:
        ctl.stop()
