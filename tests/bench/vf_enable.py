"""P3: SR-IOV enable of every GPU through the engine when each PF takes L to create its VFs.

gpusim blocks every `sriov_numvfs` write for `--vf-enable-latency-ms` (per PF, like the kernel's
device lock). Parallel: one `plan_vfs(devices=all)` + `apply_vfs` (PFs in parallel, sriov-manage).
Sequential baseline: the same engine, one PF at a time. Floor: the bare tool, `sriov-manage -e <PF>`
for every PF started at once, no engine (what enabling costs on this machine and simulator at all).
The runs alternate; the node is rebooted (VFs gone) before each, and each run must leave every PF
with all its VFs after one enable write.
"""

from __future__ import annotations

import os
import subprocess
import time

from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import sriov
from ansible_collections.accelops.vgpu.plugins.module_utils.runner import CommandRunner
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import Sysfs
from tests.bench import simnodes, stats

MODEL = "l40s"
TOTAL_VFS = 32


def enable(sysfs, devices):
    """The sriov engine's plan + apply for `devices` (max VFs, method auto); returns the PFs changed."""
    runner = CommandRunner()
    plan = sriov.plan_vfs(sysfs, runner, devices=devices, num_vfs="max", held={})
    return sriov.apply_vfs(sysfs, runner, plan)


def run_parallel(node):
    sysfs = Sysfs(node.root)
    with simnodes.node_environment(node):
        start = time.perf_counter()
        done = enable(sysfs, "all")
        elapsed = time.perf_counter() - start
    return elapsed, len(done)


def run_sequential(node):
    sysfs, pfs, done = Sysfs(node.root), node.pfs(), 0
    with simnodes.node_environment(node):
        start = time.perf_counter()
        for pf in pfs:
            done += len(enable(sysfs, [pf]))
        elapsed = time.perf_counter() - start
    return elapsed, done


def run_floor(node):
    tool = os.path.join(node.tools_dir, sriov.SRIOV_MANAGE)
    start = time.perf_counter()
    procs = [subprocess.Popen([tool, "-e", pf], env=node.env, stdout=subprocess.DEVNULL) for pf in node.pfs()]
    failed = [p.args[-1] for p in procs if p.wait() != 0]
    elapsed = time.perf_counter() - start
    if failed:
        raise simnodes.BenchError("P3 floor: sriov-manage -e failed on %s" % ", ".join(failed))
    return elapsed, len(procs)


def reset(node):
    node.ctl("reboot")
    node.clear_log()
    if any(int(node.read("bus/pci/devices/%s/sriov_numvfs" % pf)) for pf in node.pfs()):
        raise simnodes.BenchError("P3: VFs still enabled on %s after a simulated reboot" % node.root)


def check(node, changed, label):
    pfs = node.pfs()
    if changed != len(pfs):
        raise simnodes.BenchError("%s: the engine changed %d PFs, expected %d" % (label, changed, len(pfs)))
    for pf in pfs:
        if len(node.vfs(pf)) != TOTAL_VFS:
            raise simnodes.BenchError("%s: %s has %d VFs after the enable, expected %d"
                                      % (label, pf, len(node.vfs(pf)), TOTAL_VFS))
    numvfs = simnodes.write_counts(node)["by_name"].get("sriov_numvfs", 0)
    if numvfs != len(pfs):
        raise simnodes.BenchError("%s: %d sriov_numvfs writes for %d PFs" % (label, numvfs, len(pfs)))
    return numvfs


def run(settings):
    latency_s = settings.latency_ms / 1000.0
    parallel_s, sequential_s, floor_s = [], [], []
    with simnodes.mounted(["%s:%d" % (MODEL, settings.gpus_p3)], latency_ms=settings.latency_ms) as nodes:
        node = nodes[0]
        for dummy in range(settings.runs["p3"]):
            reset(node)
            seconds, changed = run_parallel(node)
            check(node, changed, "P3 parallel")
            parallel_s.append(seconds)
            reset(node)
            seconds, changed = run_sequential(node)
            check(node, changed, "P3 sequential")
            sequential_s.append(seconds)
            reset(node)
            seconds, changed = run_floor(node)
            check(node, changed, "P3 floor")
            floor_s.append(seconds)
        writes = simnodes.write_counts(node)
    parallel = stats.summary(parallel_s)
    over_latency = stats.summary([s / latency_s for s in parallel_s])
    return {"gpus": settings.gpus_p3, "latency_s": latency_s, "runs": settings.runs["p3"],
            "parallel_s": parallel, "sequential_s": stats.summary(sequential_s),
            "parallel_over_latency": over_latency,
            "speedup_vs_sequential": stats.ratio_summary(sequential_s, parallel_s),
            "floor_parallel_s": stats.summary(floor_s), "parallel_over_floor": stats.ratio_summary(parallel_s, floor_s),
            "writes_per_enable": writes, "target_vs_latency": 1.5, "met": stats.within(over_latency["median"], 1.5)}
