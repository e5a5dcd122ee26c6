"""The orchestrator against gpusim: the driver's shrinking creatable lists, EBUSY, mixed-size mode."""

import threading
import time

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw import vgpu_types
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import vgpu_apply, vgpu_mdev
from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError
from ansible_collections.accelops.vgpu.plugins.module_utils.runner import CommandRunner
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import Sysfs
from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout.vgpu_layout import (
    GpuPlan, LayoutError, VgpuChange, from_layout)
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.vgpu_types import VgpuType

L40S_24Q = [{"device_filter": "0x26B910DE", "profiles": {"L40S-24Q": 2}}]
L40S_12Q = [{"device_filter": "0x26B910DE", "profiles": {"L40S-12Q": 4}}]


def engine_for(node, monkeypatch, tmp_path):
    """The engine on a gpusim node, its fake sriov-manage / nvidia-smi first on PATH."""
    for name in ("PATH", "GPUSIM_ROOT"):
        monkeypatch.setenv(name, node.env[name])
    return vgpu_apply.NodeEngine(Sysfs(node.root), CommandRunner(), node.dev_root, "/proc", cache_dir=str(tmp_path))


@pytest.fixture
def l40s(gpusim_node, monkeypatch, tmp_path):
    """Two L40S with VFs enabled."""
    node = gpusim_node("l40s:2")
    engine = engine_for(node, monkeypatch, tmp_path)
    vgpu_apply.apply(engine, from_layout([{"profiles": {}}]), enable_vfs=True)
    node.clear_log()
    return node, engine


def apply(engine, layout, **kwargs):
    return vgpu_apply.apply(engine, from_layout(layout), **kwargs)


def type_writes(node):
    return [(w["path"].split("/")[3], w["value"]) for w in node.log() if w["path"].endswith("current_vgpu_type")]


def test_apply_then_reapply_writes_nothing(l40s):
    node, engine = l40s
    first = apply(engine, L40S_24Q)
    assert first["changed"] and len(type_writes(node)) == 4
    node.clear_log()
    again = apply(engine, L40S_24Q)
    assert not again["changed"] and node.log() == []
    assert again["resources"] == [{"profile": "L40S-24Q", "type_name": "NVIDIA L40S-24Q",
                                   "resource_name": "nvidia.com/NVIDIA_L40S-24Q", "pci_vendor_selector": "10DE:26B9",
                                   "framework": "vendor-vfio", "count": 4}]
    assert again["gpus"][0]["vgpus"][0] == {"address": "0000:41:00.4", "before": "L40S-24Q", "after": "L40S-24Q",
                                            "type_id": 1155}


def test_check_mode_reports_the_real_change_and_writes_nothing(l40s):
    node, engine = l40s
    check = apply(engine, L40S_24Q, check_mode=True)
    assert node.log() == []
    real = apply(engine, L40S_24Q)
    assert check["changed"] is True and real["changed"] is True
    assert check["diff"] == real["diff"]
    assert real["diff"]["after"]["0000:41:00.0"] == {"0000:41:00.4": "L40S-24Q", "0000:41:00.5": "L40S-24Q"}


def test_resizing_clears_and_refills_only_what_is_needed(l40s):
    node, engine = l40s
    apply(engine, L40S_24Q)
    node.clear_log()
    apply(engine, L40S_12Q)
    writes = type_writes(node)
    assert writes[:2] == [("0000:41:00.4", "0"), ("0000:41:00.5", "0")]
    assert writes[2:6] == [("0000:41:00.%d" % f, "1153") for f in (4, 5, 6, 7)]
    assert len(writes) == 12 and all(w["result"] == "ok" for w in node.log())


def test_a_held_vf_stops_the_change_before_any_write(l40s):
    node, engine = l40s
    apply(engine, L40S_24Q)
    node.hold("0000:42:00.5")
    node.clear_log()
    with pytest.raises(LayoutError) as err:
        apply(engine, L40S_12Q)
    assert "VF 0000:42:00.5 of GPU 0000:42:00.0 is held by a VM" in str(err.value)
    assert node.log() == []
    assert vgpu_apply.check(engine, from_layout(L40S_24Q)) == []


def test_mixed_sizes_need_the_flag_and_switch_the_mode_once(l40s):
    node, engine = l40s
    mixed = [{"devices": ["0000:41:00.0"], "profiles": {"L40S-24Q": 1, "L40S-12Q": 2}}]
    with pytest.raises(LayoutError) as err:
        apply(engine, mixed)
    assert "different framebuffer sizes" in str(err.value) and node.log() == []
    result = apply(engine, mixed, mixed_size=True)
    assert result["changed"] and [p["mixed_size"] for p in node.state()["pfs"]][:1] == [True]
    assert sum(1 for c in engine.runner.calls if "-shm" in c) == 1
    again = apply(engine, mixed, mixed_size=True)
    assert not again["changed"] and sum(1 for c in engine.runner.calls if "-shm" in c) == 1


def test_switching_to_mixed_sizes_rebuilds_the_gpu_around_the_mode_change(l40s):
    node, engine = l40s
    apply(engine, L40S_24Q)
    node.clear_log()
    mixed = [{"devices": ["0000:41:00.0"], "profiles": {"L40S-24Q": 1, "L40S-12Q": 2}}]
    apply(engine, mixed, mixed_size=True)
    assert type_writes(node) == [("0000:41:00.4", "0"), ("0000:41:00.5", "0"), ("0000:41:00.4", "1155"),
                                 ("0000:41:00.5", "1153"), ("0000:41:00.6", "1153")]
    assert node.state()["pfs"][0]["mixed_size"] is True


def test_switching_to_mixed_sizes_plans_the_same_in_check_mode(l40s):
    node, engine = l40s
    apply(engine, L40S_24Q)
    node.clear_log()
    mixed = [{"devices": ["0000:41:00.0"], "profiles": {"L40S-24Q": 1, "L40S-12Q": 2}}]
    check = apply(engine, mixed, mixed_size=True, check_mode=True)
    assert node.log() == [] and node.state()["pfs"][0]["mixed_size"] is False
    real = apply(engine, mixed, mixed_size=True)
    assert check["changed"] is real["changed"] is True and check["diff"] == real["diff"]


def test_mixed_sizes_on_a_gpu_with_a_held_vgpu_fail_before_any_write(l40s):
    node, engine = l40s
    apply(engine, L40S_24Q)
    node.hold("0000:41:00.4")
    node.clear_log()
    with pytest.raises(LayoutError) as err:
        apply(engine, [{"devices": ["0000:41:00.0"], "profiles": {"L40S-24Q": 1, "L40S-12Q": 2}}], mixed_size=True)
    assert "VF 0000:41:00.4 is held by a VM" in str(err.value) and node.log() == []


@pytest.mark.parametrize("check_mode", [False, True])
def test_a_gpu_without_mixed_size_mode_fails_before_the_gpu_before_it_is_written(
        gpusim_node, monkeypatch, tmp_path, check_mode):
    node = gpusim_node("l40s:1,t4:1")
    engine = engine_for(node, monkeypatch, tmp_path)
    apply(engine, [{"device_filter": "0x26B910DE", "profiles": {}}], enable_vfs=True)
    node.clear_log()
    layout = [{"devices": ["0000:41:00.0"], "profiles": {"L40S-24Q": 1, "L40S-12Q": 1}},
              {"devices": ["0000:42:00.0"], "profiles": {"T4-4Q": 1, "T4-2Q": 2}}]
    with pytest.raises(LayoutError) as err:
        apply(engine, layout, mixed_size=True, check_mode=check_mode)
    assert str(err.value).startswith("GPU 0000:42:00.0 (T4) does not support mixed-size mode")
    assert node.log() == [] and not any("-shm" in call for call in engine.runner.calls)


def test_mixed_sizes_on_an_mdev_gpu_re_create_its_mdevs_around_the_mode_switch():
    view = vgpu_mdev.MdevGpu.__new__(vgpu_mdev.MdevGpu)
    kept_type = vgpu_types.MdevType("0000:42:00.0", "nvidia-222", "GRID X-4Q", 1, "")
    plan = GpuPlan("0000:42:00.0", vgpu_mdev.FRAMEWORK, "X", "10de:0000")
    plan.vgpus = [VgpuChange("0000:42:00.0", kept_type, kept_type, "u-kept"),
                  VgpuChange("0000:42:00.0", kept_type, None, "u-gone")]
    plan.steps = [("remove", "u-gone", "0000:42:00.0"), ("create", "u-new", "0000:42:00.0", "nvidia-221")]
    vgpu_mdev.rebuild(view, plan)
    assert plan.steps == [("remove", "u-gone", "0000:42:00.0"), ("remove", "u-kept", "0000:42:00.0"),
                          ("create", "u-kept", "0000:42:00.0", "nvidia-222"),
                          ("create", "u-new", "0000:42:00.0", "nvidia-221")]
    plan.vgpus[0].held = [4242]
    with pytest.raises(LayoutError) as err:
        vgpu_mdev.rebuild(view, plan)
    assert "mdev u-kept on 0000:42:00.0 is held by a VM" in str(err.value)


def test_absent_keeps_what_a_vm_holds(l40s):
    node, engine = l40s
    apply(engine, L40S_24Q)
    node.hold("0000:41:00.4")
    result = apply(engine, [{"profiles": {}}], state="absent")
    assert result["changed"] and any("0000:41:00.4" in w for w in result["warnings"])
    assert vgpu_apply.export(engine) == {"0000:41:00.0": {"L40S-24Q": 1}, "0000:42:00.0": {}}


def test_after_a_reboot_assert_differs_and_apply_restores(l40s):
    node, engine = l40s
    apply(engine, L40S_24Q)
    node.ctl("reboot")
    problems = vgpu_apply.check(engine, from_layout(L40S_24Q))
    assert problems == ["GPU 0000:41:00.0: SR-IOV VFs are not enabled", "GPU 0000:42:00.0: SR-IOV VFs are not enabled"]
    with pytest.raises(LayoutError):
        apply(engine, L40S_24Q)
    restored = apply(engine, L40S_24Q, enable_vfs=True)
    assert restored["vfs_enabled"] == ["0000:41:00.0", "0000:42:00.0"]
    assert vgpu_apply.check(engine, from_layout(L40S_24Q)) == []


def test_a_driver_unloaded_while_vfs_are_enabled_fails_at_once_naming_the_pf(gpusim_node, monkeypatch, tmp_path):
    node = gpusim_node("l40s:1", latency_ms=500, fresh=True)
    engine = engine_for(node, monkeypatch, tmp_path)
    unload = threading.Timer(0.2, node.ctl, ("driver", "unload"))
    unload.start()
    started = time.monotonic()
    try:
        with pytest.raises(EngineError) as err:
            apply(engine, L40S_24Q, enable_vfs=True, wait_timeout=600)
    finally:
        unload.join()
    assert str(err.value).startswith("0000:41:00.0: lost its driver (no driver link) during ")
    assert time.monotonic() - started < 60  # not hung: far below the 600 s wait_timeout


def test_mdev_gpus_share_the_flow(gpusim_node, monkeypatch, tmp_path):
    node = gpusim_node("t4:1,a16:1")
    engine = engine_for(node, monkeypatch, tmp_path)
    layout = [{"device_filter": "10de:1eb8", "profiles": {"T4-4Q": 4}},
              {"device_filter": "10de:25b6", "profiles": {"A16-8Q": 2}}]
    result = apply(engine, layout, enable_vfs=True)
    by_profile = dict((r["profile"], r) for r in result["resources"])
    assert by_profile["T4-4Q"]["count"] == 4 and by_profile["T4-4Q"]["mdev_name_selector"] == "GRID T4-4Q"
    assert by_profile["A16-8Q"]["count"] == 8 and by_profile["A16-8Q"]["framework"] == "mdev"
    node.clear_log()
    assert not apply(engine, layout)["changed"] and node.log() == []


class SmiRunner(CommandRunner):
    """nvidia-smi that prints `output` (exit `rc`) for every call."""

    def __init__(self, output, rc=0):
        super().__init__()
        self.output, self.rc = output, rc

    def which(self, name, extra_paths=()):
        return "/usr/bin/" + name

    def _execute(self, argv):
        return self.rc, self.output, ""


@pytest.mark.parametrize("output,expected", [
    ("GPU 00000000:41:00.0\n    vGPU Heterogeneous Mode : Enabled\n", True),
    ("GPU 00000000:41:00.0\n    Heterogeneous Mode          : Disabled\n", False),
    ("Disabled\n", False),
])
def test_heterogeneous_mode_is_read_tolerantly(output, expected):
    runner = SmiRunner(output)
    assert vgpu_apply.heterogeneous_mode(runner, "0000:41:00.0") is expected
    assert runner.calls == [["/usr/bin/nvidia-smi", "vgpu", "-i", "0000:41:00.0", "-ghm"]]


@pytest.mark.parametrize("output,rc,message", [("what?\n", 0, "cannot read the heterogeneous"),
                                               ("No devices were found\n", 6, "nvidia-smi vgpu -ghm failed")])
def test_unreadable_heterogeneous_mode_names_the_gpu(output, rc, message):
    with pytest.raises(LayoutError) as err:
        vgpu_apply.heterogeneous_mode(SmiRunner(output, rc), "0000:41:00.0")
    assert "GPU 0000:41:00.0" in str(err.value) and message in str(err.value)


def test_type_names_come_from_the_cache_then_nvidia_smi(tmp_path):
    smi = "    vGPU Type ID : 0x483\n        Name : NVIDIA L40S-24Q\n"
    names = vgpu_apply.TypeNames(Sysfs(str(tmp_path)), SmiRunner(smi), cache_dir=str(tmp_path))
    names.remember("0000:41:00.0", [VgpuType(1153, "NVIDIA L40S-12Q")])
    names.remember("0000:42:00.0", [VgpuType(1155, "NVIDIA L40S-24Q")], complete=True)
    names.save()
    again = vgpu_apply.TypeNames(Sysfs(str(tmp_path)), SmiRunner(smi), cache_dir=str(tmp_path))
    assert again("0000:41:00.0") == ([VgpuType(1153, "NVIDIA L40S-12Q"), VgpuType(0x483, "NVIDIA L40S-24Q")], True)
    assert again("0000:42:00.0") == ([VgpuType(1155, "NVIDIA L40S-24Q")], True)
    unknown = vgpu_apply.TypeNames(Sysfs(str(tmp_path)), SmiRunner("", rc=2), cache_dir=str(tmp_path))
    assert unknown("0000:41:00.0") == ([VgpuType(1153, "NVIDIA L40S-12Q")], False)


def test_a_cache_from_another_driver_version_names_nothing(tmp_path):
    version = tmp_path / "module/nvidia/version"
    version.parent.mkdir(parents=True)
    version.write_text("580.65.06\n")
    names = vgpu_apply.TypeNames(Sysfs(str(tmp_path)), None, cache_dir=str(tmp_path))
    names.remember("0000:42:00.0", [VgpuType(1155, "NVIDIA L40S-24Q")], complete=True)
    names.save()
    same = vgpu_apply.TypeNames(Sysfs(str(tmp_path)), None, cache_dir=str(tmp_path))
    assert same.supported("0000:42:00.0") == [VgpuType(1155, "NVIDIA L40S-24Q")]
    version.write_text("580.82.07\n")
    other = vgpu_apply.TypeNames(Sysfs(str(tmp_path)), None, cache_dir=str(tmp_path))
    assert other.supported("0000:42:00.0") is None and other("0000:42:00.0") == ([], False)


def test_without_the_cache_nvidia_smi_names_the_consumed_types(l40s, monkeypatch, tmp_path):
    node, engine = l40s
    apply(engine, L40S_24Q)
    fresh = engine_for(node, monkeypatch, tmp_path / "empty-cache")
    node.clear_log()
    assert not apply(fresh, L40S_24Q)["changed"] and node.log() == []
    assert any(call[1:3] == ["vgpu", "-s"] for call in fresh.runner.calls)
