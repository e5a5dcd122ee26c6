"""Cluster-side tests: the real modules and the real `kubernetes` client against the API server
double (tests/fakes/kmock_serve.py), one process per test session on a free loopback port."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest

from cluster_helpers import ROOT, ApiServer, default_state, kubeconfig_dict


@pytest.fixture(scope="session")
def api_server():
    before = set(glob.glob("/tmp/osrcp-*.json"))
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests/fakes/kmock_serve.py")],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = proc.stdout.readline().split()
        if line[:1] != ["ready"]:
            raise RuntimeError("kmock_serve did not start: %r" % line)
        yield ApiServer(proc, int(line[1]))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        # the modules use no discovery, so no DynamicClient cache may appear; remove any that did
        for leftover in set(glob.glob("/tmp/osrcp-*.json")) - before:
            os.unlink(leftover)


@pytest.fixture
def cluster(api_server):
    api_server.reset(default_state())
    return api_server


@pytest.fixture
def kubeconfig(api_server, tmp_path):
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(kubeconfig_dict(api_server.url)))
    return str(path)
