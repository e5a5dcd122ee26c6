"""P8: a vGPU-manager restart under the node agent (`accelops-vgpu agent`, the zipapp, a real process).

An 8-GPU L40S node carries 2 x L40S-24Q per GPU, applied by the agent (RESYNC_INTERVAL 3600 s: only its
probe can notice anything). Idle cost: for `IDLE_S` seconds nothing happens; gpusim counts every sysfs
file the agent opens for reading (its `.gpusim/reads`): the probe's reads per GPU per 10 s, target <= 2,
and no write. Restart: gpusim's `manager-restart` (every GPU stays bound, all VFs come back without a
type, as after the manager pod's `sriov-manage -d ALL` / `-e ALL`); measured from the restart to the
agent's status file saying `success` again with one more restart noticed (written after the node's
labels); the layout is then read back from every VF. Target: <= 10 s.
"""

from __future__ import annotations

import json
import os
import tempfile
import time

from ansible_collections.accelops.vgpu.tests.integration.agent.agent_helpers import CONFIG_LABEL, agent_state
from ansible_collections.accelops.vgpu.tests.integration.cluster.cluster_helpers import ApiServer
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import Sysfs
from tests.bench import agent as p5, simnodes, stats, vf_enable

IDLE_S = 10.0
TARGET_S, TARGET_READS = 10.0, 2.0    # seconds to the layout back; sysfs reads per GPU per 10 s when idle


def run(settings):
    runs = settings.runs["p8"]
    result = {"gpus": settings.gpus, "model": p5.MODEL, "runs": runs, "layout": p5.BEFORE}
    with simnodes.mounted(["%s:%d" % (p5.MODEL, settings.gpus)]) as nodes, \
            tempfile.TemporaryDirectory(prefix="bench-p8-") as workdir:
        node = nodes[0]
        with simnodes.node_environment(node):
            vf_enable.enable(Sysfs(node.root), "all")
        state = os.path.join(workdir, "state.json")
        with open(state, "w") as handle:
            json.dump(agent_state({CONFIG_LABEL: "before"}), handle)
        bench = p5.Bench(node, workdir)
        bench.api = ApiServer.start("--state", state)
        try:
            result.update(_measure(bench, runs))
        finally:
            bench.stop_agent()
            bench.api.stop()
    return result


def _wait_success(bench, restarts, timeout):
    start = time.perf_counter()
    while time.perf_counter() - start < timeout:
        status = bench.status() or {}
        if status.get("state") == "success" and status.get("manager_restarts", 0) >= restarts:
            return time.perf_counter() - start
        if status.get("state") == "failed":
            raise simnodes.BenchError("P8: the agent reported failed: %s" % status.get("reason"))
        if bench.agent.poll() is not None:
            raise simnodes.BenchError("P8: the agent exited (%s)" % bench.agent.returncode)
        time.sleep(0.01)
    raise simnodes.BenchError("P8: no success after restart %d within %.0f s" % (restarts, timeout))


def _measure(bench, runs):
    node, gpus = bench.node, len(bench.node.pfs())
    expected = p5._expected(node, p5.BEFORE)   # pylint: disable=protected-access
    bench.start_agent(resync=3600)
    _wait_success(bench, 0, 120)
    simnodes.assert_layout(node, expected, "P8 first apply")
    node.clear_log()
    time.sleep(IDLE_S)
    reads, writes = node.reads(), len(node.log())
    per_gpu = sum(reads.values()) / float(gpus) * (10.0 / IDLE_S)
    restart_s = []
    for run in range(1, runs + 1):
        node.ctl("manager-restart")
        restart_s.append(_wait_success(bench, run, 120))
        simnodes.assert_layout(node, expected, "P8 after restart %d" % run)
    summary = stats.summary(restart_s)
    idle = {"seconds": IDLE_S, "sysfs_reads": sum(reads.values()), "reads_per_gpu_per_10s": round(per_gpu, 2),
            "files_read": len(reads), "sysfs_writes": writes}
    met = stats.within(summary["max"], TARGET_S) and per_gpu <= TARGET_READS and writes == 0
    return {"restart_to_layout_s": summary, "idle": idle, "target_s": TARGET_S,
            "target_reads_per_gpu_per_10s": TARGET_READS, "met": met}
