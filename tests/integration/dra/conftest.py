"""DRA tests: one API server double per session, reset to the DRA state per test."""

from __future__ import annotations

import pytest

from ansible_collections.accelops.vgpu.tests.integration.cluster.cluster_helpers import ApiServer
from ansible_collections.accelops.vgpu.tests.integration.dra.dra_helpers import dra_state


@pytest.fixture(scope="session")
def dra_api_server():
    with ApiServer.running() as server:
        yield server


@pytest.fixture
def dra_api(dra_api_server):
    dra_api_server.reset(dra_state())
    return dra_api_server
