"""The agent process's /metrics, /healthz and /readyz (METRICS_PORT): readiness only after a successful reconcile,
the text format checked by the real promtool, and one scrape by a real Prometheus server on loopback answered by
a PromQL query (Debian's prometheus package: promtool and the server)."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

from ansible_collections.accelops.vgpu.tests.fakes.registry import free_port
from ansible_collections.accelops.vgpu.tests.integration.agent.agent_helpers import wait_for

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
needs_prometheus = pytest.mark.skipif(not PROMETHEUS or not PROMTOOL,
                                      reason="promtool and prometheus missing (Debian: prometheus, make system-deps)")


def get(port, path):
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path), timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return None, ""


@pytest.fixture
def agent_with_metrics(gpusim_node, cluster, start_agent):
    def start(node_spec="l40s:1", **env):
        port = free_port()
        agent = start_agent(gpusim_node(node_spec), cluster.api, METRICS_PORT=port, METRICS_BIND_ADDRESS="127.0.0.1",
                            **env)
        wait_for("the agent's endpoint", lambda: get(port, "/healthz")[0] == 200)
        return agent, port
    return start


def metric_lines(body, name):
    return sorted(line for line in body.splitlines() if line.startswith(name + "{") or line.startswith(name + " "))


@needs_prometheus
def test_ready_after_the_first_success_and_metrics_promtool_accepts(agent_with_metrics, cluster):
    cluster.select("no-such-layout")
    agent, port = agent_with_metrics()
    agent.wait("failed", "no-such-layout")
    assert get(port, "/readyz") == (503, "no reconcile has succeeded yet\n")
    assert get(port, "/healthz") == (200, "ok\n")

    agent.forget_status()
    cluster.select("default")
    agent.wait("success", "default")
    assert get(port, "/readyz") == (200, "ok\n")
    status, body = get(port, "/metrics")
    assert status == 200
    check = subprocess.run([PROMTOOL, "check", "metrics"], input=body, capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    assert metric_lines(body, "accelops_vgpu_agent_vgpus") == [
        'accelops_vgpu_agent_vgpus{profile="L40S-24Q",state="free"} 2',
        'accelops_vgpu_agent_vgpus{profile="L40S-24Q",state="in_use"} 0',
        'accelops_vgpu_agent_vgpus{profile="L40S-24Q",state="unhealthy"} 0']
    assert metric_lines(body, "accelops_vgpu_agent_applies_total") == [
        'accelops_vgpu_agent_applies_total{result="changed"} 1', 'accelops_vgpu_agent_applies_total{result="failed"} 1']
    assert 'accelops_vgpu_agent_config_state{config="default",state="success"} 1' in body
    last_success = float(metric_lines(body, "accelops_vgpu_agent_last_success_timestamp_seconds")[0].split()[1])
    assert abs(last_success - time.time()) < 60


@needs_prometheus
def test_a_vf_a_vm_holds_is_in_use(agent_with_metrics):
    agent, port = agent_with_metrics(RESYNC_INTERVAL=1)  # each resync re-reads the node, writing nothing
    agent.wait("success", "default")
    node = agent.node
    node.hold(node.vfs(node.pfs()[0])[0])
    try:
        def counted():
            body = get(port, "/metrics")[1]
            return 'accelops_vgpu_agent_vgpus{profile="L40S-24Q",state="in_use"} 1' in body
        wait_for("the held VF counted in use", counted, timeout=30)
    finally:
        node.release(node.vfs(node.pfs()[0])[0])


@needs_prometheus
def test_a_real_prometheus_scrapes_the_agent_and_promql_answers(agent_with_metrics, tmp_path):
    agent, port = agent_with_metrics()
    agent.wait("success", "default")
    web = free_port()
    (tmp_path / "prometheus.yml").write_text(json.dumps({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "accelops-vgpu-agent",
                            "static_configs": [{"targets": ["127.0.0.1:%d" % port]}]}]}))
    server = subprocess.Popen([PROMETHEUS, "--config.file", str(tmp_path / "prometheus.yml"),
                               "--storage.tsdb.path", str(tmp_path / "tsdb"),
                               "--web.listen-address", "127.0.0.1:%d" % web],
                              stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prometheus.log", "w"))  # noqa: SIM115
    try:
        query = 'sum by (profile) (accelops_vgpu_agent_vgpus{state="free"})'

        def answer():
            status, body = get(web, "/api/v1/query?" + urllib.parse.urlencode({"query": query}))
            if status != 200:
                return None
            return json.loads(body)["data"]["result"] or None
        result = wait_for("Prometheus to scrape the agent", answer, timeout=60, interval=0.5)
        assert [(r["metric"], r["value"][1]) for r in result] == [({"profile": "L40S-24Q"}, "2")]
        up = json.loads(get(web, "/api/v1/query?" + urllib.parse.urlencode({"query": "up"}))[1])["data"]["result"]
        assert [r["value"][1] for r in up] == ["1"]
    finally:
        server.terminate()
        server.wait(20)
