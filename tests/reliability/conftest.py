"""Reliability suite: shared fixtures and the summary line (see summary.py).

Fixtures: `lab` (a module-scoped gpusim node in a known, partly used state, node_lab.py),
`failure_writes` (the observers of the writes a failure path caused, observers.py), `api_server`
(the Kubernetes API server process, one per session) and, from the integration suite, `run_playbook`.
Every case observes writes through `failure_writes` or says why it has no failure path to observe
(`@pytest.mark.no_failure_path(reason)`); a case that does neither fails.
"""

from __future__ import annotations

import os

import pytest

from ansible_collections.accelops.vgpu.tests.integration import conftest as integration
from ansible_collections.accelops.vgpu.tests.reliability import node_lab
from ansible_collections.accelops.vgpu.tests.reliability.observers import FailureWrites
from ansible_collections.accelops.vgpu.tests.integration.cluster.cluster_helpers import ApiServer
from ansible_collections.accelops.vgpu.tests.reliability.summary import Tally
from gpusim.testing import GpuSimNode

run_playbook = integration.run_playbook

HERE = os.path.dirname(os.path.abspath(__file__))
TALLY = Tally("")


def pytest_configure(config):
    TALLY.prefix = os.path.relpath(HERE, str(config.rootpath)).replace(os.sep, "/") + "/"
    config.addinivalue_line("markers", "no_failure_path(reason): a reliability case with no failure-path writes "
                                       "to observe, and why")


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
    """observers.FailureWrites of this case: what its observers see goes into the summary."""
    observers = FailureWrites(TALLY, request.node.nodeid)
    yield observers
    observers.finish()
    if not observers.observed:
        pytest.fail("%s asked for failure_writes but observed nothing" % request.node.nodeid)


@pytest.fixture(autouse=True)
def _writes_are_observed(request):
    """A case either observes its failure path's writes or says why it has none."""
    marker = request.node.get_closest_marker("no_failure_path")
    if marker is not None:
        if not marker.args:
            pytest.fail("no_failure_path needs a reason")
        TALLY.record_unobserved(request.node.nodeid, marker.args[0])
    elif "failure_writes" not in request.fixturenames:
        pytest.fail("%s observes no writes: use the failure_writes fixture, or mark it "
                    "@pytest.mark.no_failure_path(reason)" % request.node.nodeid)


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
