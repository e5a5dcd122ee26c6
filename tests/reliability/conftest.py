"""Reliability suite: shared fixtures and the summary line (see summary.py).

Fixtures: `lab` (a module-scoped gpusim node in a known, partly used state, node_lab.py),
`failure_writes` (report the writes a failure path caused), `api_server` (the Kubernetes API
server process, one per session) and, from the integration suite, `run_playbook`.
"""

from __future__ import annotations

import os

import pytest

from ansible_collections.accelops.vgpu.tests.integration import conftest as integration
from ansible_collections.accelops.vgpu.tests.reliability import node_lab
from ansible_collections.accelops.vgpu.tests.integration.cluster.cluster_helpers import ApiServer
from ansible_collections.accelops.vgpu.tests.reliability.summary import Tally
from gpusim.testing import GpuSimNode

run_playbook = integration.run_playbook

HERE = os.path.dirname(os.path.abspath(__file__))
TALLY = Tally("")


def pytest_configure(config):
    TALLY.prefix = os.path.relpath(HERE, str(config.rootpath)).replace(os.sep, "/") + "/"


def pytest_runtest_logreport(report):
    TALLY.record_report(report)


def pytest_terminal_summary(terminalreporter, config):
    if not TALLY.outcomes:
        return
    path = TALLY.write_report(config.rootpath)
    terminalreporter.section("reliability summary")
    for line in TALLY.lines():
        terminalreporter.write_line(line)
    terminalreporter.write_line("(written to %s)" % os.path.relpath(path, str(config.rootpath)))


@pytest.fixture
def failure_writes(request):
    """observe(count, what): record the writes a failure path caused (the summary adds them up)."""

    def observe(count, what):
        TALLY.record_writes(request.node.nodeid, count, what)
        return count

    return observe


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """node_lab.Lab on a fresh gpusim node, prepared (VFs, types, a held VF); the fake tools on PATH."""
    with pytest.MonkeyPatch.context() as patch, GpuSimNode(node_lab.SPEC) as node:
        for name, value in node_lab.environment(node).items():
            patch.setenv(name, value)
        yield node_lab.Lab(node, tmp_path_factory.mktemp("type-cache")).prepare()


@pytest.fixture(scope="session")
def api_server():
    with ApiServer.running() as server:
        yield server
