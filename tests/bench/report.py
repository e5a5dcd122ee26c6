"""bench.json (everything, machine included) and bench.md (one table row per measured comparison)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

from tests.bench import REPO


def machine():
    """Cores, Python, ansible-core, kernel and load: what a reader needs to compare two runs."""
    try:
        ansible = subprocess.run([os.path.join(REPO, ".venv", "bin", "ansible"), "--version"], capture_output=True,
                                 text=True, check=False, timeout=60).stdout.splitlines()[0]
        ansible_core = ansible.split("[core", 1)[1].strip(" ]") if "[core" in ansible else ansible
    except (OSError, IndexError, subprocess.TimeoutExpired):
        ansible_core = None
    return {"cores": os.cpu_count(), "usable_cores": len(os.sched_getaffinity(0)),
            "python": platform.python_version(), "python_executable": sys.executable,
            "ansible_core": ansible_core, "kernel": platform.release(), "machine": platform.machine(),
            "load_average_at_start": [round(v, 2) for v in os.getloadavg()], "revision": _revision()}


def _revision():
    """The checkout's commit, with `+changes` when the working tree differs from it."""
    def git(*args):
        return subprocess.run(["git", "-C", REPO] + list(args), capture_output=True, text=True, check=False,
                              timeout=60).stdout.strip()
    try:
        commit = git("rev-parse", "--short", "HEAD")
        return commit + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "") or None
    except (OSError, subprocess.TimeoutExpired):
        return None


def _spread(summary, unit="s"):
    return "%.3g %s (%.3g–%.3g)" % (summary["median"], unit, summary["min"], summary["max"])


def _ratio(summary):
    return "%.2f× (%.2f–%.2f)" % (summary["median"], summary["min"], summary["max"])


def _met(flag):
    return "yes" if flag else "**no**"


def _p1_case_row(label, gpus, data, scan):
    layout = "; ".join("%d GPUs: %s" % (len(entry["gpus"]), " + ".join(
        "%d×%s" % (n, p) for p, n in entry["profiles"].items())) for entry in data["layout"])
    what = "%d GPUs × 32 VFs (%s per GPU); writes %d (min %d); engine sysfs reads %d; /proc walk %s" % (
        gpus, layout, data["writes"], data["writes_min"], sum(data["engine_reads"].values()), scan)
    target = data.get("target_ratio")
    return (label, what, "engine " + _spread(data["engine_s"]), "floor " + _spread(data["floor_s"]),
            _ratio(data["ratio"]), ("≤ %g×, writes = min" % target) if target else "writes = min", _met(data["met"]))


def _p1_rows(p1):
    scan = p1.get("scan", "not recorded")
    for case in ("uniform", "mixed"):
        yield _p1_case_row("P1 cold converge, %s" % case, p1["gpus"], p1[case], scan)
    own = p1.get("own_pid_namespace") or {}
    if "result" in own:
        yield _p1_case_row("P1 cold converge, uniform, own pid namespace", p1["gpus"], own["result"]["uniform"],
                           own["scan"])
    elif own:
        yield _skipped("P1 cold converge, uniform, own pid namespace", own)
    for label, data in (("P1 sysfs round trips, uniform", p1["uniform"]),
                        ("P1 sysfs round trips, uniform, own pid namespace", _own(p1).get("uniform") or {})):
        if "ops_per_written_vf" in data:
            ops = data["ops_per_written_vf"]
            yield (label, "engine reads + links + writes per written VF (first run: no node cache yet)",
                   "%.2f (%.2f–%.2f)" % (ops["median"], ops["min"], ops["max"]), "floor 1 (the write)",
                   "%.2f×" % ops["median"], "≤ 3.0 per written VF, writes = min", _met(data["met_ops"]))


def _counts(per_apply):
    """'scans 1, probes 256, sources 9' per apply (min–max where the applies differ)."""
    parts = []
    for name in ("scans", "probes", "sources"):
        values = [c.get(name, 0) for c in per_apply] or [0]
        low, high = min(values), max(values)
        parts.append("%s %d" % (name, low) if low == high else "%s %d–%d" % (name, low, high))
    return ", ".join(parts)


def _own(part):
    """The result of the part's run in its own pid namespace (tests/bench/pidns.py), {} when there is none."""
    return (part.get("own_pid_namespace") or {}).get("result") or {}


def _skipped(label, own):
    return (label, "skipped: %s" % own.get("skipped"), "", "", "", "", "")


def _p1_holder_rows(p1):
    own = _own(p1).get("uniform") or {}
    for case, data in (("uniform", p1["uniform"]), ("mixed", p1["mixed"]), ("uniform, own pid namespace", own)):
        counts = data.get("holder_counts")
        if counts:
            yield ("P1 in-use checks per apply, %s" % case, "walks of /proc, VFIO group probes, holder source reads "
                   "(inuse.Holders.counts)", _counts(counts), "", "", "≤ 1 walk per apply", _met(
                       max(c["scans"] for c in counts) <= 1))


def _p7_rows(p7):
    prepare = p7["prepare_first"]
    yield ("P7 DRA NodePrepareResources", "%d GPUs, %d vGPUs, one claim per call (first prepare)" % (
        p7["gpus"], p7["vgpus"]), "p50 %.2f ms, p99 %.2f ms" % (prepare["p50_ms"], prepare["p99_ms"]),
        "", "", "p99 ≤ 50 ms", _met(p7["targets"]["prepare_p99_ms<=50"]))
    yield ("P7 ResourceSlice update", "apply done -> slices show it; applies' in-use checks: %s" % _counts(
        p7.get("holder_counts") or []), "max %.3g s" % p7["slice_update"]["max_s"], "", "", "≤ 1 s",
        _met(p7["targets"]["slice_update_s<=1"]))


def _p9_rows(p9):
    prepare, unprepare, published = p9["prepare_with_type_write"], p9["unprepare_clearing_type"], p9["published"]
    yield ("P9 claim-time NodePrepareResources", "%d GPUs claim-time × %d profiles, 4 × L40S-12Q claims per GPU, "
           "one per call: free VF chosen, type written and read back, checkpoint, CDI + KEP-5304; published %d "
           "slices, %d counter sets, %d devices (API limits checked); unprepare p99 %.2f ms" % (
               p9["gpus"], len(p9["profiles"]), published["slices"], published["counter_sets"], published["devices"],
               unprepare["p99_ms"]),
           "p50 %.2f ms, p99 %.2f ms" % (prepare["p50_ms"], prepare["p99_ms"]), "", "",
           "p99 ≤ %g ms" % p9["target_p99_ms"], _met(p9["met"]))


def _p10_rows(p10):
    prepare, unprepare = p10["prepare_whole"], p10["unprepare_to_vgpus"]
    yield ("P10 whole-GPU NodePrepareResources", "%d GPUs claim-time with whole-gpu, one whole claim per GPU and run: "
           "VFs checked free, steps recorded, sriov-manage -d verified, PF nvidia -> vfio-pci verified, CDI + KEP-5304; "
           "unprepare back to nvidia and VFs verified: p50 %.0f ms, p99 %.0f ms (target p99 ≤ %g ms)" % (
               p10["gpus"], unprepare["p50_ms"], unprepare["p99_ms"], p10["target_unprepare_p99_ms"]),
           "p50 %.0f ms, p99 %.0f ms" % (prepare["p50_ms"], prepare["p99_ms"]), "", "",
           "p99 ≤ %g ms" % p10["target_prepare_p99_ms"], _met(p10["met"]))


def _p11_rows(p11):
    prepare, unprepare, published = p11["prepare_gi_created_vf_typed"], p11["unprepare_gi_destroyed"], p11["published"]
    yield ("P11 MIG-backed claim-time NodePrepareResources", "%d H100 claim-time × %d MIG-backed types, 3 claims per "
           "GPU filling it (3g, 2g, 1g), one per call: GI created at the placement, VF typed and checked on it, "
           "checkpoint per step, CDI + KEP-5304; published %d slices, %d counter sets, %d devices (API limits "
           "checked); unprepare (type cleared, CI + GI destroyed) p99 %.2f ms" % (
               p11["gpus"], len(p11["profiles"]), published["slices"], published["counter_sets"],
               published["devices"], unprepare["p99_ms"]),
           "p50 %.2f ms, p99 %.2f ms" % (prepare["p50_ms"], prepare["p99_ms"]), "", "",
           "p99 ≤ %g ms, unprepare ≤ %g ms" % (p11["targets"]["prepare_p99_ms"], p11["targets"]["unprepare_p99_ms"]),
           _met(p11["met"]))


def _p2_row(label, p2, scan):
    what = "nodes.yml on a converged node (%d GPUs); sysfs writes %d, tasks changed %d%s; /proc walk %s" % (
        p2["gpus"], p2["writes"], p2["tasks_changed"],
        " (%s)" % ", ".join(p2["changed_task_names"]) if p2["changed_task_names"] else "", scan)
    return (label, what, "nodes.yml " + _spread(p2["node_playbook_s"]), "ping " + _spread(p2["ping_playbook_s"]),
            _ratio(p2["ratio"]), "≤ 2×, 0 writes", _met(p2["met"]))


def _p2_rows(p2):
    yield _p2_row("P2 no-op re-run", p2, p2.get("scan", "not recorded"))
    own = p2.get("own_pid_namespace") or {}
    if "result" in own:
        yield _p2_row("P2 no-op re-run, own pid namespace", own["result"], own["scan"])
    elif own:
        yield _skipped("P2 no-op re-run, own pid namespace", own)


def _p3_rows(p3):
    ratio = "%s of L; %s faster than sequential; %s of the floor" % (
        _ratio(p3["parallel_over_latency"]), _ratio(p3["speedup_vs_sequential"]), _ratio(p3["parallel_over_floor"]))
    baseline = "sequential %s; floor (bare sriov-manage per PF, all at once) %s" % (
        _spread(p3["sequential_s"]), _spread(p3["floor_parallel_s"]))
    yield ("P3 VF enable", "%d GPUs, L = %g s per PF" % (p3["gpus"], p3["latency_s"]),
           "parallel " + _spread(p3["parallel_s"]), baseline, ratio, "≤ 1.5·L", _met(p3["met"]))


def _p4_rows(p4):
    sizes = list(p4["sizes"].values())
    per_host = ", ".join("%d hosts/%d forks: %s" % (s["hosts"], s["forks"], _spread(s["per_host_s"])) for s in sizes)
    cpu = ", ".join("%d: %s" % (s["hosts"], _spread(s["cpu_per_host_s"])) for s in sizes)
    writes = ", ".join("%s %d" % item for item in sorted(sizes[-1]["writes_per_host_most"].items()))
    what = "%d GPUs/host, %s, forks = hosts/%d; sysfs writes/host: %s" % (
        p4["gpus_per_host"], " + ".join("%d×%s" % (n, p) for p, n in p4["profiles"].items()), p4["forks_ratio"],
        writes)
    ratio = "%.2f× wall/host, %.2f× CPU/host (%d vs %d hosts)" % (
        p4["per_host_growth"], p4["cpu_per_host_growth"], sizes[-1]["hosts"], sizes[0]["hosts"])
    yield ("P4 fleet, cold converge", what, "wall/host " + per_host, "CPU/host " + cpu, ratio, "≤ 1.2×",
           _met(p4["met"]))


def _p4b_rows(p4):
    sizes = list(p4["sizes"].values())
    if "controller_cpu_over_ping" not in sizes[0]:
        return
    cpu = ", ".join("%d: %s" % (s["hosts"], _spread(s["controller_cpu_per_host_s"])) for s in sizes)
    ping = ", ".join("%d: %s" % (s["hosts"], _spread(s["ping_controller_cpu_per_host_s"])) for s in sizes)
    ratio = "; ".join("%d hosts %s" % (s["hosts"], _ratio(s["controller_cpu_over_ping"])) for s in sizes)
    total = "; ".join("%d hosts %s" % (s["hosts"], _ratio(s["cpu_over_ping"])) for s in sizes)
    yield ("P4b controller CPU per host", "cold converge (nodes.yml) vs ping, same fleet and forks, CPU less the "
           "node side (module runs and the tools they ran); growth %.2f× (%d vs %d hosts); with the node side: %s"
           % (p4["controller_cpu_per_host_growth"], sizes[-1]["hosts"], sizes[0]["hosts"], total),
           "nodes.yml " + cpu, "ping " + ping, ratio, "≤ 3×, growth ≤ 1.2×", _met(p4["met_cpu_over_ping"]))


def _p5_rows(p5):
    idle = p5["idle"]
    what = ("%d GPUs, %s -> %s (%d sysfs writes); idle %d s at resync %d s: %d sysfs writes, %d reconciles "
            "(max %d), %d read syscalls, %d API requests (%d writes); peak RSS %.1f MB" % (
                p5["gpus"], _profiles(p5["change"]["from"]), _profiles(p5["change"]["to"]), p5["writes_per_change"],
                idle["seconds"], idle["resync_interval_s"], idle["sysfs_writes"], idle["reconciles"],
                idle["reconciles_max"], idle["read_syscalls"], idle["api_requests"], idle["api_writes"],
                p5["rss_mb"]))
    yield ("P5 node agent, label change", what, "agent " + _spread(p5["agent_s"]), "CLI apply " + _spread(p5["cli_s"]),
           _ratio(p5["ratio"]), "≤ 1.2×, idle 0 writes, ≤ 1 scan/resync, RSS ≤ 60 MB", _met(p5["met"]))


def _p8_rows(p8):
    idle = p8["idle"]
    what = ("%d GPUs, %s each; gpusim manager-restart (all VFs again, no types) -> agent status success; idle "
            "%g s: %d sysfs reads (%d files), %d writes"
            % (p8["gpus"], _profiles(p8["layout"]), idle["seconds"], idle["sysfs_reads"], idle["files_read"],
               idle["sysfs_writes"]))
    yield ("P8 vGPU-manager restart, agent", what, "layout back " + _spread(p8["restart_to_layout_s"]),
           "idle probe %.2f reads/GPU/10 s" % idle["reads_per_gpu_per_10s"], "-",
           "≤ %g s, ≤ %g reads/GPU/10 s, 0 writes" % (p8["target_s"], p8["target_reads_per_gpu_per_10s"]),
           _met(p8["met"]))


def _p6_rows(p6):
    idle, alloc = p6["idle"], p6["allocate_ms"]
    what = ("%d GPUs, %s -> %s by relabel; Allocate x%d (median %.2f ms, max %.2f ms); idle %d s at resync %d s: "
            "%d sysfs writes, %d reconciles (max %d); peak RSS %.1f MB; relabel -> ListAndWatch %s" % (
                p6["gpus"], _profiles(p6["change"]["from"]), _profiles(p6["change"]["to"]), alloc["calls"],
                alloc["median"], alloc["max"], idle["seconds"], idle["resync_interval_s"], idle["sysfs_writes"],
                idle["reconciles"], idle["reconciles_max"], p6["rss_mb"], _spread(p6["update_after_relabel_s"])))
    yield ("P6 device plugin (agent + test kubelet)", what,
           "apply done -> ListAndWatch " + _spread(p6["update_after_success_s"]), "Allocate p99 %.2f ms" % alloc["p99"],
           "", "≤ 1 s, p99 ≤ 5 ms, RSS ≤ 60 MB, ≤ 1 scan/resync", _met(p6["met"]))


def _profiles(profiles):
    return " + ".join("%d×%s" % (n, p) for p, n in profiles.items())


ROWS = (("p1", _p1_rows), ("p1", _p1_holder_rows), ("p2", _p2_rows), ("p3", _p3_rows), ("p4", _p4_rows),
        ("p4", _p4b_rows), ("p5", _p5_rows), ("p6", _p6_rows), ("p7", _p7_rows), ("p8", _p8_rows),
        ("p9", _p9_rows), ("p10", _p10_rows), ("p11", _p11_rows))


def rows(results):
    """[(part, measure, value, baseline, ratio, target, met)] for the parts that ran."""
    return [row for part, make in ROWS if part in results for row in make(results[part])]


def markdown(report):
    head = ("Part", "What", "Measured (median, min–max)", "Baseline", "Ratio", "Target", "Met")
    lines = ["# accelops.vgpu benchmark (%s)" % ("quick smoke run" if report["settings"]["quick"] else "full run"),
             "", "Machine: %(cores)s cores, Python %(python)s, ansible-core %(ansible_core)s, load at start "
             "%(load_average_at_start)s." % report["machine"],
             "Runs per measurement: %s. Took %.0f s." % (
                 ", ".join("%s %d" % (p.upper(), report["settings"]["runs"][p]) for p in report["settings"]["parts"]),
                 report["duration_s"]), "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows(report["results"]):
        lines.append("| " + " | ".join(cell.replace("|", "/") for cell in row) + " |")
    tasks = report["results"].get("p2", {}).get("task_seconds")
    if tasks:
        slowest = sorted(tasks.items(), key=lambda item: -item[1])[:6]
        lines += ["", "P2 no-op run, slowest tasks (profile_tasks): " + "; ".join(
            "%s %.2f s" % (name.replace("|", "/"), seconds) for name, seconds in slowest)]
    return "\n".join(lines) + "\n"


def write(report, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "bench.json"), "w") as handle:
        json.dump(report, handle, indent=2, sort_keys=True)
        handle.write("\n")
    text = markdown(report)
    with open(os.path.join(out_dir, "bench.md"), "w") as handle:
        handle.write(text)
    return text
