"""Cluster-side tests: the real modules and the real `kubernetes` client against the API server
double (tests/fakes/kmock_serve.py), one process per test session on a free loopback port."""

from __future__ import annotations

import glob
import os

import pytest

from cluster_helpers import ApiServer, default_state


@pytest.fixture(scope="session")
def api_server():
    before = set(glob.glob("/tmp/osrcp-*.json"))
    with ApiServer.running() as server:
        yield server
    # the modules use no discovery, so no DynamicClient cache may appear; remove any that did
    for leftover in set(glob.glob("/tmp/osrcp-*.json")) - before:
        os.unlink(leftover)


@pytest.fixture
def cluster(api_server):
    api_server.reset(default_state())
    return api_server


@pytest.fixture
def kubeconfig(api_server, tmp_path):
    return api_server.kubeconfig_file(tmp_path)
