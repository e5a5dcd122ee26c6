"""P6: the node agent's device plugin (DEVICE_PLUGIN=true, a real agent process) on an 8-GPU node, read by the
test kubelet (tests/fakes/kubelet_double.py, real gRPC over unix sockets).

- Update: every GPU from 2 x L40S-24Q to 4 x L40S-12Q by relabel (VFs enabled before, untimed); the time from
  the agent's status file saying `success` (written after the apply and the node's labels) to the kubelet's
  ListAndWatch list holding every 12Q vGPU; negative when the list came first (the plugin publishes right
  after the apply, before the labels). Target <= 1 s. Also reported: relabel -> ListAndWatch.
- Allocate: `allocate_calls` single-vGPU Allocate calls from the kubelet; p99 latency <= 5 ms.
- RSS: the agent's peak RSS (VmHWM) with the plugin serving, <= 60 MB.
- Idle: `idle_s` at a short resync interval: reconciles (each one sysfs scan, the plugin's health check rides
  on it) at most one per interval; no sysfs writes.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import time

from ansible_collections.accelops.vgpu.tests.fakes.kubelet_double import TestKubelet
from ansible_collections.accelops.vgpu.tests.integration.agent.agent_helpers import (
    CONFIG_LABEL, NODE, NODES, agent_state)
from ansible_collections.accelops.vgpu.tests.integration.cluster.cluster_helpers import ApiServer
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import Sysfs
from tests.bench import agent as p5, simnodes, stats, vf_enable

R24, R12 = "nvidia.com/NVIDIA_L40S-24Q", "nvidia.com/NVIDIA_L40S-12Q"
TARGET_UPDATE_S, TARGET_ALLOCATE_P99_MS, TARGET_RSS_MB = 1.0, 5.0, 60.0


def _healthy(kubelet, resource):
    return sum(1 for dummy, health, dummy2 in kubelet.devices(resource) if health == "Healthy")


def _wait(what, predicate, timeout=300.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.001)
    raise simnodes.BenchError("P6: timed out waiting for %s" % what)


def run(settings):
    runs, idle_s, resync_s = settings.runs["p6"], settings.idle_p5, settings.resync_p5
    result = {"gpus": settings.gpus, "runs": runs, "change": {"from": p5.BEFORE, "to": p5.AFTER}}
    kubelet_dir = tempfile.mkdtemp(prefix="p6kl", dir="/tmp")   # unix socket paths: at most 107 bytes
    with simnodes.mounted(["%s:%d" % (p5.MODEL, settings.gpus)]) as nodes, \
            tempfile.TemporaryDirectory(prefix="bench-p6-") as workdir:
        node = nodes[0]
        with simnodes.node_environment(node):
            vf_enable.enable(Sysfs(node.root), "all")
        bench = p5.Bench(node, workdir)
        state = "%s/state.json" % workdir
        with open(state, "w") as handle:
            json.dump(agent_state({CONFIG_LABEL: "before"}), handle)
        bench.api = ApiServer.start("--state", state)
        kubelet = TestKubelet(kubelet_dir, grace=0.2).start()
        try:
            result.update(_measure(bench, kubelet, kubelet_dir, runs, settings.allocate_calls, idle_s, resync_s))
        finally:
            bench.stop_agent()
            kubelet.stop()
            bench.api.stop()
            shutil.rmtree(kubelet_dir, ignore_errors=True)
    return result


def _start(bench, kubelet_dir, resync):
    bench.start_agent(resync=resync, DEVICE_PLUGIN="true", KUBELET_DIR=kubelet_dir)
    _wait("the agent's first success", lambda: (bench.status() or {}).get("state") == "success", 120)


def _measure(bench, kubelet, kubelet_dir, runs, calls, idle_s, resync_s):
    gpus = len(bench.node.pfs())
    n24, n12 = p5.BEFORE["L40S-24Q"] * gpus, p5.AFTER["L40S-12Q"] * gpus
    bench.cli_apply("before")
    _start(bench, kubelet_dir, 3600)
    _wait("24Q listed", lambda: _healthy(kubelet, R24) == n24)
    after_success, after_relabel = [], []
    for dummy in range(runs):
        if os.path.exists(bench.status_file):
            os.unlink(bench.status_file)
        marks = {}

        def poll():
            now = time.perf_counter()
            if "listed" not in marks and _healthy(kubelet, R12) == n12:
                marks["listed"] = now
            status = bench.status()
            if "success" not in marks and status and status["config"] == "after":
                if status["state"] != "success":
                    raise simnodes.BenchError("P6: the agent reported %s: %s" % (status["state"], status["reason"]))
                marks["success"] = now
            return len(marks) == 2
        start = time.perf_counter()
        bench.api.control("patch", {"resource": NODES, "name": NODE,
                                    "patch": {"metadata": {"labels": {CONFIG_LABEL: "after"}}}})
        _wait("success for after and the 12Q list", poll)
        after_success.append(marks["listed"] - marks["success"])
        after_relabel.append(marks["listed"] - start)
        bench.check(p5.AFTER, "P6")
        bench.relabel("before")
        _wait("24Q listed again", lambda: _healthy(kubelet, R24) == n24)
    ids = [i for i, dummy, dummy2 in kubelet.devices(R24)]
    latencies = []
    for index in range(calls):
        start = time.perf_counter()
        kubelet.allocate(R24, [ids[index % len(ids)]])
        latencies.append((time.perf_counter() - start) * 1000.0)
    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, int(math.ceil(0.99 * len(latencies))) - 1)]
    rss_mb = p5.proc_field(bench.agent.pid, "VmHWM") / 1024.0
    bench.stop_agent()
    _start(bench, kubelet_dir, resync_s)
    bench.node.clear_log()
    checks_before = bench.status()["checks"]
    time.sleep(idle_s)
    idle = {"seconds": idle_s, "resync_interval_s": resync_s, "sysfs_writes": len(bench.node.log()),
            "reconciles": bench.status()["checks"] - checks_before,
            "reconciles_max": int(math.floor(idle_s / resync_s)) + 1}
    update = stats.summary(after_success)
    met = (update["max"] <= TARGET_UPDATE_S and p99 <= TARGET_ALLOCATE_P99_MS and rss_mb <= TARGET_RSS_MB
           and idle["sysfs_writes"] == 0 and idle["reconciles"] <= idle["reconciles_max"])
    return {"update_after_success_s": update, "update_after_relabel_s": stats.summary(after_relabel),
            "allocate_ms": {"calls": calls, "median": round(latencies[len(latencies) // 2], 3), "p99": round(p99, 3),
                            "max": round(latencies[-1], 3)},
            "rss_mb": round(rss_mb, 1), "idle": idle, "target_update_s": TARGET_UPDATE_S,
            "target_allocate_p99_ms": TARGET_ALLOCATE_P99_MS, "target_rss_mb": TARGET_RSS_MB, "met": met}
