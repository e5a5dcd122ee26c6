"""`make bench` still measures something: the harness in --quick mode on a tiny gpusim case.

Runs P1 (engine vs floor, 1 GPU) and P3 (parallel VF enable, 2 GPUs, 0.3 s latency) the way the
Makefile does (`python -m tests.bench` from the repository root) and checks bench.json / bench.md.
The playbook parts (P2, P4) take a minute even when small, so they are left to `make bench`.
"""

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LATENCY_MS = 300


def test_quick_bench_writes_plausible_json_and_table(tmp_path):
    out = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, "-m", "tests.bench", "--quick", "--parts", "p1,p3", "--gpus", "1", "--gpus-p3", "2",
         "--latency-ms", str(LATENCY_MS), "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "bench.json").read_text())

    machine = report["machine"]
    assert machine["cores"] >= 1 and machine["python"].count(".") == 2 and machine["ansible_core"][0].isdigit()
    assert report["settings"]["quick"] is True and list(report["results"]) == ["p1", "p3"]

    p1 = report["results"]["p1"]
    assert (p1["uniform"]["writes"], p1["uniform"]["writes_min"]) == (32, 32)   # 32 x L40S-1Q on one GPU
    assert (p1["mixed"]["writes"], p1["mixed"]["writes_min"]) == (2, 2)         # 2 x L40S-24Q
    own = p1.get("own_pid_namespace")
    assert (own is None) == (p1["scan"] == "complete")     # a sandbox's walk: P1 again in a pid namespace
    if own is not None and "skipped" not in own:
        own = own["result"]
        assert own["scan"] == "complete" and own["uniform"]["writes"] == 32
        assert own["uniform"]["holder_counts"][0]["probes"] == 32     # only the O(1) probe before each write
    for case, data in [("uniform", p1["uniform"]), ("mixed", p1["mixed"])] + (
            [("uniform", own["uniform"])] if own and "uniform" in own else []):
        assert data["engine_s"]["n"] == data["floor_s"]["n"] == 1
        assert 0 < data["floor_s"]["median"] and 0 < data["engine_s"]["median"] < 120
        expected_ratio = data["engine_s"]["median"] / data["floor_s"]["median"]
        assert abs(data["ratio"]["median"] - expected_ratio) <= 0.01 * expected_ratio
        assert data["met"] == (case == "mixed" or data["ratio"]["median"] <= 2.5)
        # the VFs' addresses come from sriov_offset/stride, not a virtfn link each: the links read are each
        # VF's IOMMU group (asked before its write) and a few per GPU
        assert 32 <= data["engine_reads"]["readlink"] <= 32 + 8
        ops = data["ops_per_written_vf"]["median"]
        assert abs(ops - (sum(data["engine_reads"].values()) + data["writes"]) / data["writes"]) < 1e-5 and ops > 2
        assert data["met_ops"] == (ops <= 3.0)

    p3 = report["results"]["p3"]
    latency = LATENCY_MS / 1000.0
    assert p3["latency_s"] == latency and p3["gpus"] == 2
    # every sriov_numvfs write blocks for the latency: one PF at a time cannot beat 2 L
    assert latency <= p3["parallel_s"]["median"] and 2 * latency <= p3["sequential_s"]["median"]
    assert latency <= p3["floor_parallel_s"]["median"] and p3["parallel_over_floor"]["median"] > 0
    assert p3["writes_per_enable"]["by_name"]["sriov_numvfs"] == 2

    table = (out / "bench.md").read_text()
    assert table in proc.stdout
    namespace_rows = own is not None and "uniform" in own
    assert [line.split("|")[1].strip() for line in table.splitlines() if line[:4] in ("| P1", "| P3")] == [
        "P1 cold converge, uniform", "P1 cold converge, mixed"] + (
        ["P1 cold converge, uniform, own pid namespace"] if own is not None else []) + [
        "P1 sysfs round trips, uniform"] + (["P1 sysfs round trips, uniform, own pid namespace"] if namespace_rows
                                            else []) + [
        "P1 in-use checks per apply, uniform", "P1 in-use checks per apply, mixed"] + (
        ["P1 in-use checks per apply, uniform, own pid namespace"] if namespace_rows else []) + ["P3 VF enable"]
    for case in ("uniform", "mixed"):        # one walk of /proc per apply; each written VF probed before its write
        counts = p1[case]["holder_counts"]
        assert len(counts) == 1 and counts[0]["scans"] == 1 and counts[0]["probes"] >= p1[case]["writes"]


def test_quick_agent_bench_measures_a_label_change_and_an_idle_agent(tmp_path):
    """P5 in --quick mode on one GPU: the agent process converges, idles without writes, stays small."""
    out = tmp_path / "results"
    proc = subprocess.run([sys.executable, "-m", "tests.bench", "--quick", "--parts", "p5", "--gpus", "1",
                           "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    p5 = json.loads((out / "bench.json").read_text())["results"]["p5"]
    assert p5["writes_per_change"] == 2 * 2 + 2  # 2 VFs 24Q -> 0 -> 12Q, 2 more VFs set to 12Q
    assert p5["agent_s"]["n"] == p5["cli_s"]["n"] == 1 and 0 < p5["agent_s"]["median"] < 120
    idle = p5["idle"]
    assert idle["sysfs_writes"] == 0 and idle["api_writes"] == 0
    assert 0 <= idle["reconciles"] <= idle["reconciles_max"] == idle["seconds"] // idle["resync_interval_s"] + 1
    assert 10 < p5["rss_mb"] <= 200
    assert p5["met"] == (p5["ratio"]["median"] <= 1.2 and p5["rss_mb"] <= 60)
    assert "| P5 node agent, label change |" in (out / "bench.md").read_text()


def test_quick_manager_restart_bench_puts_the_layout_back_and_counts_the_idle_reads(tmp_path):
    """P8 in --quick mode on one GPU: gpusim's manager-restart, the agent's probe, the layout back."""
    out = tmp_path / "results"
    proc = subprocess.run([sys.executable, "-m", "tests.bench", "--quick", "--parts", "p8", "--gpus", "1",
                           "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    p8 = json.loads((out / "bench.json").read_text())["results"]["p8"]
    assert p8["restart_to_layout_s"]["n"] == 1 and 0 < p8["restart_to_layout_s"]["median"] < 120
    idle = p8["idle"]
    assert idle["sysfs_writes"] == 0 and 1 <= idle["sysfs_reads"] <= 2 and idle["files_read"] == 1
    assert p8["met"] == (p8["restart_to_layout_s"]["max"] <= 10 and idle["reads_per_gpu_per_10s"] <= 2)
    assert "| P8 vGPU-manager restart, agent |" in (out / "bench.md").read_text()


def test_quick_device_plugin_bench_times_the_update_and_allocate(tmp_path):
    """P6 in --quick mode on one GPU: the agent's device plugin and the test kubelet, over real gRPC."""
    out = tmp_path / "results"
    proc = subprocess.run([sys.executable, "-m", "tests.bench", "--quick", "--parts", "p6", "--gpus", "1",
                           "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    p6 = json.loads((out / "bench.json").read_text())["results"]["p6"]
    assert p6["update_after_success_s"]["n"] == 1 and p6["update_after_relabel_s"]["median"] > 0
    assert p6["allocate_ms"]["calls"] == 100 and 0 < p6["allocate_ms"]["median"] <= p6["allocate_ms"]["p99"]
    assert p6["idle"]["sysfs_writes"] == 0 and 10 < p6["rss_mb"] <= 200
    assert "| P6 device plugin (agent + test kubelet) |" in (out / "bench.md").read_text()


def test_small_dra_bench_prepares_every_claim_and_the_slices_follow_the_layout(tmp_path):
    """P7 on one GPU (32 vGPUs, 8 claims, one layout round trip): every prepare succeeds (the bench exits non-zero on
    a per-claim error or on slices that do not show the node's vGPUs) and the numbers are plausible."""
    out = tmp_path / "results"
    proc = subprocess.run([sys.executable, "-m", "tests.bench.dra", "--gpus", "1", "--claims", "8", "--runs", "1",
                           "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    p7 = json.loads((out / "dra.json").read_text())
    assert p7["vgpus"] == 32
    assert [p7[phase]["n"] for phase in ("prepare_first", "prepare_again", "unprepare")] == [8, 8, 8]
    assert 0 < p7["prepare_again"]["p50_ms"] <= p7["prepare_again"]["max_ms"]
    assert p7["slice_update"]["n"] == p7["slice_update_full_read_gpusim"]["n"] == 2
    assert p7["targets"]["slice_update_s<=1"] == (p7["slice_update"]["max_s"] <= 1.0)
