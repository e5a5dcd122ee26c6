"""The agent's HTTP endpoint on loopback: /metrics, and the probes while the real NodeWatcher follows a watch that
delivers, and one that hangs (a half-open connection): liveness turns 503 naming the watch."""

import threading
import time
import urllib.error
import urllib.request

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.agent.http_endpoint import HttpEndpoint
from ansible_collections.accelops.vgpu.plugins.module_utils.agent.metrics import CONTENT_TYPE
from ansible_collections.accelops.vgpu.plugins.module_utils.agent.node_watch import NodeWatcher
from ansible_collections.accelops.vgpu.plugins.module_utils.agent.telemetry import Telemetry


def get(endpoint, path):
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d%s" % (endpoint.port, path), timeout=5) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


class HangingApi:
    """A Node that lists, and a watch stream that delivers one event, then nothing, never ending."""

    def __init__(self, release):
        self.release = release

    def list_node(self, name):
        return {"metadata": {"name": name, "resourceVersion": "5"}}, "5"

    def watch_node(self, name, resource_version, timeout_seconds):
        yield {"type": "MODIFIED", "object": {"metadata": {"name": name, "resourceVersion": "6"}}}
        self.release.wait()


@pytest.fixture
def endpoint():
    telemetry = Telemetry()
    server = HttpEndpoint(telemetry, "127.0.0.1", 0).start()
    yield server
    server.stop()


def test_metrics_and_unknown_paths(endpoint):
    telemetry = endpoint.server.RequestHandlerClass.telemetry
    telemetry.reconcile_started()
    telemetry.reconciled("default", "success", True, {("L40S-24Q", "free"): 4})
    status, ctype, body = get(endpoint, "/metrics")
    assert (status, ctype) == (200, CONTENT_TYPE)
    assert 'accelops_vgpu_agent_vgpus{profile="L40S-24Q",state="free"} 4' in body
    assert get(endpoint, "/readyz")[:1] == (200,) and get(endpoint, "/nope")[0] == 404


def test_liveness_fails_when_the_watch_hangs_and_readiness_waits_for_a_success(endpoint):
    telemetry = endpoint.server.RequestHandlerClass.telemetry
    telemetry.health.watch_limit = 0.5
    telemetry.health.loop_limit = 60
    release, stop = threading.Event(), threading.Event()
    seen = []
    watcher = NodeWatcher(telemetry.instrument(HangingApi(release)), "gpu-a", seen.append, stop, watch_timeout=300)
    thread = threading.Thread(target=watcher.run, daemon=True)
    thread.start()
    try:
        assert get(endpoint, "/healthz")[::2] == (200, "ok\n")
        assert get(endpoint, "/readyz")[::2] == (503, "no reconcile has succeeded yet\n")
        time.sleep(0.8)
        status, _ctype, body = get(endpoint, "/healthz")
        assert status == 503 and body.startswith("the node watch has been silent for"), body
        assert len(seen) == 2  # the list and the one event: the watch is stuck, not the test
    finally:
        stop.set()
        release.set()
        thread.join(5)
