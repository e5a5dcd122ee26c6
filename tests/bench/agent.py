"""P5: the node agent (`accelops-vgpu agent`, the zipapp, a real process) on an 8-GPU node.

Change: every GPU from 2 x L40S-24Q to 4 x L40S-12Q (VFs enabled before, untimed). Agent: the time
from the relabel (a merge patch of `nvidia.com/vgpu.config` on the API server double) to the agent's
status file saying `success` for the new config, which it writes after the node's state label.
Baseline: `accelops-vgpu apply` of the same change, the same zipapp as a process (what the boot unit
runs). Runs alternate (the node is put back untimed: the agent by relabelling, the CLI by applying
the old config). The agent is stopped while the CLI runs: its vGPU-manager probe would see the CLI's
change as the old config's vGPUs gone and put them back during the CLI's apply.
Then the idle agent is watched for `idle_s` with a short resync interval: sysfs writes (gpusim's
log, must be 0), reconciles (each one sysfs scan; at most one per resync interval), its read
syscalls, API requests; and its peak RSS (VmHWM) at the end.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import subprocess
import tempfile
import time

from ansible_collections.accelops.vgpu.tests.integration.agent.agent_helpers import (
    CONFIG_LABEL, NODE, NODE_PYTHON, NODES, STATE_LABEL, agent_state, kubeconfig_for)
from ansible_collections.accelops.vgpu.tests.integration.cluster.cluster_helpers import ApiServer
from tests.bench import REPO, simnodes, stats, vf_enable
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import Sysfs

MODEL = "l40s"
BEFORE, AFTER = {"L40S-24Q": 2}, {"L40S-12Q": 4}
TARGET_RATIO, TARGET_RSS_MB = 1.2, 60.0


def _config():
    return {"version": "v1", "vgpu-configs": {
        "before": [{"devices": "all", "vgpu-devices": BEFORE}], "after": [{"devices": "all", "vgpu-devices": AFTER}]}}


def _expected(node, profiles):
    return dict((pf, dict((simnodes.type_id(MODEL, p), n) for p, n in profiles.items())) for pf in node.pfs())


def proc_field(pid, name):
    """A field of /proc/<pid>/status (kB) or io."""
    for filename in ("status", "io"):
        with open("/proc/%d/%s" % (pid, filename)) as handle:
            for line in handle:
                key, dummy, value = line.partition(":")
                if key == name:
                    return int(value.split()[0])
    raise KeyError(name)


class Bench:
    def __init__(self, node, workdir):
        self.node, self.workdir = node, workdir
        self.pyz = os.path.join(workdir, "accelops-vgpu.pyz")
        subprocess.run([NODE_PYTHON, os.path.join(REPO, "tools", "build-node-cli.py"), self.pyz], check=True,
                       capture_output=True)
        self.config = os.path.join(workdir, "vgpu.json")
        with open(self.config, "w") as handle:
            json.dump(_config(), handle)
        self.status_file = os.path.join(workdir, "status.json")
        self.api = self.agent = None

    def cli_apply(self, selected):
        argv = [NODE_PYTHON, self.pyz, "apply", "--config", self.config, "--selected", selected,
                "--sysfs-root", self.node.root, "--dev-root", self.node.dev_root]
        start = time.perf_counter()
        proc = subprocess.run(argv, env=self.node.env, capture_output=True, text=True, check=False, timeout=600)
        elapsed = time.perf_counter() - start
        if proc.returncode != 0:
            raise simnodes.BenchError("P5: accelops-vgpu apply %s failed: %s" % (selected, proc.stderr.strip()))
        return elapsed

    def start_agent(self, resync, **extra_env):
        env = dict(self.node.env, NODE_NAME=NODE, CONFIG_FILE=self.config, DEFAULT_VGPU_CONFIG="before",
                   NAMESPACE="vgpu-agent", ACCELOPS_VGPU_SYSFS_ROOT=self.node.root,
                   ACCELOPS_VGPU_DEV_ROOT=self.node.dev_root, ACCELOPS_VGPU_PROC_ROOT="/proc",
                   STATUS_FILE=self.status_file, RESYNC_INTERVAL=str(resync),
                   KUBECONFIG=kubeconfig_for(self.api.url, pathlib.Path(self.workdir, "kubeconfig")), **extra_env)
        with open(os.path.join(self.workdir, "agent.log"), "a") as log:
            self.agent = subprocess.Popen([NODE_PYTHON, self.pyz, "agent"], env=env, stdout=subprocess.DEVNULL,
                                          stderr=log)

    def stop_agent(self):
        if self.agent is not None and self.agent.poll() is None:
            self.agent.terminate()
            self.agent.wait(timeout=60)

    def status(self):
        try:
            with open(self.status_file) as handle:
                return json.load(handle)
        except (OSError, ValueError):
            return None

    def relabel(self, selected, timeout=300.0):
        """Seconds from the relabel to the agent's status `success` for `selected`."""
        if os.path.exists(self.status_file):
            os.unlink(self.status_file)
        start = time.perf_counter()
        self.api.control("patch", {"resource": NODES, "name": NODE,
                                   "patch": {"metadata": {"labels": {CONFIG_LABEL: selected}}}})
        while time.perf_counter() - start < timeout:
            status = self.status()
            if status and status["config"] == selected:
                if status["state"] != "success":
                    raise simnodes.BenchError("P5: the agent reported %s for %s: %s" % (
                        status["state"], selected, status["reason"]))
                return time.perf_counter() - start
            if self.agent.poll() is not None:
                raise simnodes.BenchError("P5: the agent exited (%s)" % self.agent.returncode)
            time.sleep(0.002)
        raise simnodes.BenchError("P5: no success for %s within %.0f s" % (selected, timeout))

    def check(self, profiles, label):
        simnodes.assert_layout(self.node, _expected(self.node, profiles), label)
        labels = self.api.get(NODES, NODE)["metadata"]["labels"]
        return labels


def run(settings):
    runs, idle_s, resync_s = settings.runs["p5"], settings.idle_p5, settings.resync_p5
    result = {"gpus": settings.gpus, "model": MODEL, "runs": runs, "change": {"from": BEFORE, "to": AFTER}}
    with simnodes.mounted(["%s:%d" % (MODEL, settings.gpus)]) as nodes, \
            tempfile.TemporaryDirectory(prefix="bench-p5-") as workdir:
        node = nodes[0]
        with simnodes.node_environment(node):
            vf_enable.enable(Sysfs(node.root), "all")
        state = os.path.join(workdir, "state.json")
        with open(state, "w") as handle:
            json.dump(agent_state({CONFIG_LABEL: "before"}), handle)
        bench = Bench(node, workdir)
        bench.api = ApiServer.start("--state", state)
        try:
            result.update(_measure(bench, runs, idle_s, resync_s))
        finally:
            bench.stop_agent()
            bench.api.stop()
    return result


def _started(bench, resync):
    """Start the agent on a node that matches its label; wait for its first success (untimed)."""
    if os.path.exists(bench.status_file):
        os.unlink(bench.status_file)
    bench.start_agent(resync=resync)
    deadline = time.monotonic() + 120
    while not (bench.status() or {}).get("state") == "success":
        if time.monotonic() > deadline or bench.agent.poll() is not None:
            raise simnodes.BenchError("P5: the agent did not report its first success")
        time.sleep(0.05)


def _measure(bench, runs, idle_s, resync_s):
    bench.cli_apply("before")
    agent_s, cli_s, writes = [], [], []
    for dummy in range(runs):
        _started(bench, 3600)
        bench.node.clear_log()
        agent_s.append(bench.relabel("after"))
        labels = bench.check(AFTER, "P5 agent")
        if labels.get(STATE_LABEL) != "success" or labels.get("accelops.io/vgpu.profile.L40S-12Q") != str(
                4 * len(bench.node.pfs())):
            raise simnodes.BenchError("P5: node labels after the agent's apply: %s" % labels)
        writes.append(simnodes.write_counts(bench.node)["total"])
        bench.relabel("before")
        bench.stop_agent()
        bench.node.clear_log()
        cli_s.append(bench.cli_apply("after"))
        bench.check(AFTER, "P5 CLI")
        if simnodes.write_counts(bench.node)["total"] != writes[-1]:
            raise simnodes.BenchError("P5: the CLI wrote %d times, the agent %d" % (
                simnodes.write_counts(bench.node)["total"], writes[-1]))
        bench.cli_apply("before")
    # idle: a fresh agent with a short resync interval, on a node that already matches
    _started(bench, resync_s)
    bench.node.clear_log()
    bench.api.clear_log()
    pid = bench.agent.pid
    checks_before, reads_before = bench.status()["checks"], proc_field(pid, "syscr")
    time.sleep(idle_s)
    checks = bench.status()["checks"] - checks_before
    idle = {"seconds": idle_s, "resync_interval_s": resync_s, "sysfs_writes": len(bench.node.log()),
            "reconciles": checks, "reconciles_max": int(math.floor(idle_s / resync_s)) + 1,
            "read_syscalls": proc_field(pid, "syscr") - reads_before,
            "api_requests": len(bench.api.log()),
            "api_writes": len([r for r in bench.api.log() if r["method"] != "GET"])}
    rss_mb = proc_field(pid, "VmHWM") / 1024.0
    ratio = stats.ratio_summary(agent_s, cli_s)
    met = (stats.within(ratio["median"], TARGET_RATIO) and idle["sysfs_writes"] == 0 and
           idle["reconciles"] <= idle["reconciles_max"] and rss_mb <= TARGET_RSS_MB)
    return {"agent_s": stats.summary(agent_s), "cli_s": stats.summary(cli_s), "ratio": ratio,
            "writes_per_change": max(writes), "idle": idle, "rss_mb": round(rss_mb, 1),
            "target_ratio": TARGET_RATIO, "target_rss_mb": TARGET_RSS_MB, "met": met}
