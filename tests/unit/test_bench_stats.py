"""The benchmark's statistics, option defaults and report table (tests/bench), without gpusim."""

import os
import sys

import pytest

# `make bench` runs `python -m tests.bench` from the repository root; pytest puts only tests/ on sys.path.
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from tests.bench import playbooks, report, stats  # noqa: E402
from tests.bench.__main__ import FULL, QUICK, parse_args  # noqa: E402


def test_summary_gives_median_min_max_and_samples():
    assert stats.summary([3, 1, 2]) == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3, "samples": [3.0, 1.0, 2.0]}
    assert stats.summary([1, 2, 3, 10])["median"] == 2.5


def test_summary_of_nothing_is_an_error():
    with pytest.raises(ValueError, match="no samples"):
        stats.summary([])


def test_paired_ratios_divide_run_by_run():
    assert stats.ratio_summary([2.0, 9.0, 3.0], [1.0, 3.0, 2.0]) == {
        "median": 2.0, "min": 1.5, "max": 3.0, "n": 3, "samples": [2.0, 3.0, 1.5]}


@pytest.mark.parametrize("measured, baseline, message", [
    ([1.0], [1.0, 2.0], "as many"),
    ([1.0], [0.0], "zero"),
])
def test_paired_ratios_refuse_mismatched_or_zero_baselines(measured, baseline, message):
    with pytest.raises(ValueError, match=message):
        stats.paired_ratios(measured, baseline)


def test_ratio_of_medians_and_within():
    assert stats.ratio_of_medians(stats.summary([6, 6, 9]), stats.summary([2, 3, 4])) == 2.0
    assert stats.within(1.2, 1.2) and not stats.within(1.21, 1.2)


def test_defaults_full_and_quick(monkeypatch):
    for name in ("BENCH_QUICK", "BENCH_RUNS_P1", "BENCH_FLEET", "BENCH_PARTS"):
        monkeypatch.delenv(name, raising=False)
    full = parse_args([])
    assert full.runs == FULL["runs"] and full.fleet == [4, 16, 32] and full.forks_ratio == 4
    assert full.parts == ["p1", "p2", "p3", "p4", "p5", "p6", "p7", "p8", "p9", "p10", "p11"] and full.gpus == 8 and full.latency_ms == 1000
    assert (full.idle_p5, full.resync_p5) == (30, 10)
    quick = parse_args(["--quick", "--parts", "p3,p1", "--runs-p1", "2"])
    assert quick.parts == ["p1", "p3"] and quick.runs["p1"] == 2 and quick.runs["p3"] == QUICK["runs"]["p3"]


def test_environment_sets_options(monkeypatch):
    monkeypatch.setenv("BENCH_QUICK", "1")
    monkeypatch.setenv("BENCH_RUNS_P4", "7")
    monkeypatch.setenv("BENCH_FLEET", "8,2")
    args = parse_args([])
    assert args.quick and args.runs["p4"] == 7 and args.fleet == [2, 8]


@pytest.mark.parametrize("argv", [["--parts", "p99"], ["--fleet", "0,4"], ["--parts", ""], ["--runs-p1", "0"],
                                  ["--latency-ms", "soon"], ["--idle-p5", "0"]])
def test_bad_options_are_refused(argv, capsys):
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert "error" in capsys.readouterr().err


def test_markdown_marks_missed_targets():
    spread = stats.summary([1.0, 2.0])
    text = report.markdown({
        "settings": {"quick": True, "parts": ["p3"], "runs": {"p3": 2}}, "duration_s": 3.0,
        "machine": {"cores": 2, "python": "3.12", "ansible_core": "2.21.5", "load_average_at_start": [1.0]},
        "results": {"p3": {"gpus": 2, "latency_s": 0.3, "parallel_s": spread, "sequential_s": spread,
                           "parallel_over_latency": stats.summary([5.0, 5.0]),
                           "speedup_vs_sequential": stats.summary([1.0, 1.0]), "floor_parallel_s": spread,
                           "parallel_over_floor": stats.summary([1.1, 1.3]), "met": False}}})
    row = [line for line in text.splitlines() if line.startswith("| P3")]
    assert len(row) == 1 and "**no**" in row[0] and "5.00×" in row[0] and "L = 0.3 s" in row[0]


def _p1_case(engine, floor, target):
    return {"layout": [{"gpus": [0], "profiles": {"L40S-1Q": 32}}], "writes": 32, "writes_min": 32,
            "engine_reads": {"readlink": 33, "read": 20}, "engine_s": stats.summary([engine]),
            "floor_s": stats.summary([floor]), "ratio": stats.summary([engine / floor]), "target_ratio": target,
            "met": target is None or engine / floor <= target, "holder_counts": [{"scans": 1, "probes": 32}]}


def test_markdown_reports_p1_in_its_own_pid_namespace_and_the_claim_time_part():
    latency = {"p50_ms": 20.0, "p99_ms": 120.0}
    text = report.markdown({
        "settings": {"quick": True, "parts": ["p1", "p9", "p10"], "runs": {"p1": 1, "p9": 1, "p10": 1}},
        "duration_s": 3.0,
        "machine": {"cores": 2, "python": "3.12", "ansible_core": "2.21.5", "load_average_at_start": [1.0]},
        "results": {
            "p1": {"gpus": 1, "scan": "incomplete (pid 1 not inspectable)", "uniform": _p1_case(3.0, 1.0, 2.5),
                   "mixed": _p1_case(9.0, 1.0, None),
                   "own_pid_namespace": {"scan": "complete", "result": {
                       "uniform": _p1_case(2.0, 1.0, 2.5), "mixed": _p1_case(5.0, 1.0, None)}}},
            "p9": {"gpus": 8, "profiles": ["L40S-12Q"] * 5, "published": {"slices": 2, "counter_sets": 8, "devices": 40},
                   "prepare_with_type_write": latency, "unprepare_clearing_type": latency, "target_p99_ms": 100.0,
                   "met": False},
            "p10": {"gpus": 2, "prepare_whole": {"p50_ms": 400.0, "p99_ms": 900.0},
                    "unprepare_to_vgpus": {"p50_ms": 700.0, "p99_ms": 1500.0}, "target_prepare_p99_ms": 1000.0,
                    "target_unprepare_p99_ms": 2000.0, "met": True},
            "p11": {"gpus": 8, "profiles": ["H100-1-10C"] * 7,
                    "published": {"slices": 5, "counter_sets": 8, "devices": 200},
                    "prepare_gi_created_vf_typed": latency, "unprepare_gi_destroyed": latency,
                    "targets": {"prepare_p99_ms": 1000.0, "unprepare_p99_ms": 2000.0}, "met": True}}})
    lines = dict((line.split("|")[1].strip(), line) for line in text.splitlines() if line.startswith("| P"))
    assert "3.00×" in lines["P1 cold converge, uniform"] and "**no**" in lines["P1 cold converge, uniform"]
    assert "incomplete (pid 1" in lines["P1 cold converge, uniform"]
    own = lines["P1 cold converge, uniform, own pid namespace"]
    assert "2.00×" in own and "walk complete" in own and own.rstrip(" |").endswith("yes")
    assert "≤ 2.5×" not in lines["P1 cold converge, mixed"] and lines["P1 cold converge, mixed"].rstrip(" |").endswith("yes")
    assert "P1 in-use checks per apply, uniform, own pid namespace" in lines
    claim_time = lines["P9 claim-time NodePrepareResources"]
    assert "p99 120.00 ms" in claim_time and "p99 ≤ 100 ms" in claim_time and "**no**" in claim_time
    whole = lines["P10 whole-GPU NodePrepareResources"]
    assert "p99 900 ms" in whole and "unprepare" in whole and "p99 1500 ms" in whole and whole.rstrip(" |").endswith("yes")
    mig = lines["P11 MIG-backed claim-time NodePrepareResources"]
    assert "200 devices" in mig and "p99 ≤ 1000 ms, unprepare ≤ 2000 ms" in mig and mig.rstrip(" |").endswith("yes")


def test_changed_tasks_from_the_default_callback():
    output = "\n".join([
        "TASK [accelops.vgpu.sriov : Enable SR-IOV virtual functions] ***", "ok: [node-001]",
        "TASK [accelops.vgpu.vgpu_profiles : Install the node CLI] ***", "changed: [node-001]", "changed: [node-002]",
        "TASK [accelops.vgpu.vgpu_profiles : Install the boot unit] ***", "ok: [node-001]",
        "PLAY RECAP ***", "node-001 : ok=3 changed=1 unreachable=0 failed=0"])
    assert playbooks.changed_tasks(output) == ["accelops.vgpu.vgpu_profiles : Install the node CLI"]
    assert playbooks.RECAP.findall(output) == [("node-001", "3", "1", "0", "0")]
