"""The agent's metrics and probe state: what a reconcile, an API error and a watch report."""

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.agent.kube import KubeApiError, KubeUnavailable
from ansible_collections.accelops.vgpu.plugins.module_utils.agent.telemetry import Telemetry, vgpu_counts


class Clock:
    def __init__(self):
        self.now = 50.0

    def __call__(self):
        return self.now


def test_a_reconcile_reports_result_duration_state_and_last_success():
    clock = Clock()
    telemetry = Telemetry(clock=clock, wall=lambda: 1764100000.0)
    telemetry.reconcile_started()
    clock.now += 2.5
    telemetry.reconciled("l40s-2x24q", "success", True, {("L40S-24Q", "free"): 2})
    telemetry.reconcile_started()
    telemetry.reconciled("l40s-6x8q", "failed", False)
    text = telemetry.registry.render()
    assert 'accelops_vgpu_agent_applies_total{result="changed"} 1' in text
    assert 'accelops_vgpu_agent_applies_total{result="failed"} 1' in text
    assert "accelops_vgpu_agent_apply_duration_seconds_count 2" in text
    assert "accelops_vgpu_agent_apply_duration_seconds_sum 2.5" in text
    assert "accelops_vgpu_agent_last_success_timestamp_seconds 1764100000" in text
    assert 'accelops_vgpu_agent_config_state{config="l40s-6x8q",state="failed"} 1' in text
    assert 'accelops_vgpu_agent_config_state{config="l40s-6x8q",state="success"} 0' in text
    assert 'config="l40s-2x24q"' not in text  # the previous config's series went
    assert 'accelops_vgpu_agent_vgpus{profile="L40S-24Q",state="free"} 2' in text  # kept: no new count
    assert telemetry.health.readiness() == (True, "ok")


class FakeApi:
    def __init__(self, events=(), error=None):
        self.events, self.error = list(events), error

    def get_node(self, name):
        raise KubeApiError("forbidden", 403, "Forbidden")

    def patch_node(self, name, patch):
        raise KubeUnavailable("connection refused")

    def list_node(self, name):
        return {"metadata": {"name": name}}, "1"

    def list_pods(self, namespace, node_name, selector):
        return []

    def create_event(self, namespace, event):
        return event

    def watch_node(self, name, resource_version, timeout_seconds):
        yield from self.events
        if self.error:
            raise self.error


def test_api_errors_are_counted_by_operation_and_status_and_still_raised():
    telemetry = Telemetry()
    api = telemetry.instrument(FakeApi())
    with pytest.raises(KubeApiError):
        api.get_node("gpu-a")
    with pytest.raises(KubeUnavailable):
        api.patch_node("gpu-a", {})
    assert api.list_node("gpu-a")[1] == "1"
    text = telemetry.registry.render()
    assert 'accelops_vgpu_agent_api_errors_total{operation="get_node",code="403"} 1' in text
    assert 'accelops_vgpu_agent_api_errors_total{operation="patch_node",code="unavailable"} 1' in text
    assert "list_node" not in text


def test_watch_streams_after_the_first_count_as_restarts_and_keep_the_watch_alive():
    clock = Clock()
    telemetry = Telemetry(clock=clock)
    api = telemetry.instrument(FakeApi([{"type": "MODIFIED", "object": {}}]))
    for dummy in range(3):
        clock.now += 300
        assert len(list(api.watch_node("gpu-a", "1", 300))) == 1
    assert telemetry.watch_restarts.value() == 2
    assert telemetry.health.watch_beat == clock.now
    gone = telemetry.instrument(FakeApi([{"type": "ERROR", "object": {"code": 410}}], error=KubeUnavailable("eof")))
    with pytest.raises(KubeUnavailable):
        list(gone.watch_node("gpu-a", "1", 300))
    assert telemetry.api_errors.value(operation="watch_node", code="410") == 1
    assert telemetry.api_errors.value(operation="watch_node", code="unavailable") == 1


def test_vgpus_by_profile_and_state_from_node_facts():
    facts = {"vfs": [
        {"vgpu_type_id": 1155, "vgpu_type": "NVIDIA L40S-24Q", "held": True, "iommu_group": "41"},
        {"vgpu_type_id": 1155, "vgpu_type": "NVIDIA L40S-24Q", "held": False, "iommu_group": "42"},
        {"vgpu_type_id": 1155, "vgpu_type": "NVIDIA L40S-24Q", "held": False, "iommu_group": None},
        {"vgpu_type_id": 0, "vgpu_type": None, "held": False, "iommu_group": "44"},       # no vGPU
        {"vgpu_type_id": 999, "vgpu_type": None, "held": False, "iommu_group": "45"}],    # a type nobody names
        "mdevs": [{"type_name": "GRID A16-2B", "held": False, "iommu_group": "7"}]}
    assert vgpu_counts(facts) == {
        ("L40S-24Q", "in_use"): 1, ("L40S-24Q", "free"): 1, ("L40S-24Q", "unhealthy"): 1,
        ("unknown", "unhealthy"): 1, ("unknown", "free"): 0, ("unknown", "in_use"): 0,
        ("A16-2B", "free"): 1, ("A16-2B", "in_use"): 0, ("A16-2B", "unhealthy"): 0}


def test_the_counts_after_a_reconcile_reuse_its_walk_of_proc_and_its_groups(gpusim_node, monkeypatch, tmp_path):
    """Issue 34: one walk of /proc per resync. The counts read the node through the reconcile's own engine:
    no second walk, no IOMMU group link read again, one read per VF (a full facts.gather reads ~10)."""
    from ansible_collections.accelops.vgpu.plugins.module_utils.agent.telemetry import node_vgpu_counts
    from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import vgpu_apply
    from fake_node import RecordingSysfs
    from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout.vgpu_layout import from_layout
    from ansible_collections.accelops.vgpu.plugins.module_utils.runner import CommandRunner

    node = gpusim_node("l40s:2")
    for name in ("PATH", "GPUSIM_ROOT"):
        monkeypatch.setenv(name, node.env[name])
    engine = vgpu_apply.NodeEngine(RecordingSysfs(node.root), CommandRunner(), node.dev_root, "/proc", cache_dir=str(tmp_path))
    vgpu_apply.apply(engine, from_layout([{"profiles": {"L40S-24Q": 2}}]), enable_vfs=True)
    scans = engine.holders.counts["scans"]
    engine.sysfs.reads, engine.sysfs.links = [], []
    import os
    real_open, opened = os.open, []
    monkeypatch.setattr(os, "open", lambda path, *a, **k: opened.append((str(path), k.get("dir_fd"))) or
                        real_open(path, *a, **k))
    counts = node_vgpu_counts(lambda: engine)
    monkeypatch.undo()
    # each VF read walked from its bus's directory, as in the apply (Sysfs.walk_cache)
    types_read = [dir_fd for path, dir_fd in opened if path.endswith("/current_vgpu_type")]
    assert len(types_read) == 64 and None not in types_read
    assert counts[("L40S-24Q", "free")] == 4 and counts[("L40S-24Q", "in_use")] == 0
    assert engine.holders.counts["scans"] == scans == 1
    assert not [rel for rel in engine.sysfs.links if rel.endswith("/iommu_group")]
    vf_reads = [rel for rel in engine.sysfs.reads if "/nvidia/" in rel]
    assert len(vf_reads) == 64 and all(rel.endswith("/current_vgpu_type") for rel in vf_reads)
