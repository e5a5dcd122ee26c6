"""A device-plugin Allocate racing a reconcile that retypes the same VF (issue 40 item 6): the engine's per-VF re-check
and write run under the allocation record's lock, which Allocate takes around its type check and journal line, so an
Allocate lands either before the re-check (the reconcile stops, the VF keeps its type) or after the write (refused,
naming the resource and the VF). Driven through the engine's write path on gpusim, the Allocate injected in between."""

from __future__ import annotations

import re
import subprocess
import threading

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet import device_plugin, pod_resources
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.errors import AllocationError
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.vgpu_device_plugin import VgpuDevicePlugin
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw import vgpu_types
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import inuse, pod_allocations
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import vgpu_apply
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import Sysfs
from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout.vgpu_layout import LayoutError, from_layout
from ansible_collections.accelops.vgpu.plugins.module_utils.runner import CommandRunner

R24 = "nvidia.com/NVIDIA_L40S-24Q"
L40S_24Q = [{"device_filter": "0x26B910DE", "profiles": {"L40S-24Q": 2}}]
L40S_12Q = [{"device_filter": "0x26B910DE", "profiles": {"L40S-12Q": 4}}]


@pytest.fixture
def served(gpusim_node, monkeypatch, tmp_path, kubelet_dir):
    """(engine, view, record, VF): one L40S at 2 x 24Q, served as the agent serves it (record lock made at start)."""
    node = gpusim_node("l40s:1")
    for name in ("PATH", "GPUSIM_ROOT"):
        monkeypatch.setenv(name, node.env[name])
    engine = vgpu_apply.NodeEngine(Sysfs(node.root), CommandRunner(), node.dev_root, "/proc", cache_dir=str(tmp_path),
                                   kubelet_dir=kubelet_dir)
    result = vgpu_apply.apply(engine, from_layout(L40S_24Q), enable_vfs=True)
    record = pod_resources.AllocationRecord(kubelet_dir)
    with pod_allocations.locked(record.path, 1):              # the lock file, as VgpuDevicePlugin.start makes it
        pass
    devices = device_plugin.devices_from_apply(engine.sysfs, result)
    view = device_plugin.resource_views(devices, record.add)[R24]
    view.types = device_plugin.CurrentTypes(engine.sysfs)
    return engine, view, record, devices[0].id


def allocate_in_thread(view, vf):
    """Allocate `vf` from another thread (the gRPC server's); returns (thread, outcome list)."""
    outcome = []

    def run():
        try:
            outcome.append(view.allocate([vf]))
        except AllocationError as exc:
            outcome.append(exc)
    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


def test_an_allocate_between_the_vf_recheck_and_its_write_is_refused_not_recorded(served, monkeypatch):
    engine, view, record, vf = served
    real, calls = inuse.Holders.recheck, []

    def recheck_then_allocate(holders, names, sources=True, **kwargs):
        found = real(holders, names, sources=sources, **kwargs)
        if list(names) == [vf] and kwargs.get("watched") is None and not calls:   # the vGPU writer's re-check of
            # that VF, right before its write (node/engine/vgpu_writer.py)
            calls.append(allocate_in_thread(view, vf))
            calls[0][0].join(0.5)                         # unordered: recorded now, and the VF retyped below
        return found

    announced = []
    engine.before_writes = lambda names: announced.append((list(names), engine.sysfs.writes))
    monkeypatch.setattr(inuse.Holders, "recheck", recheck_then_allocate)
    writes = engine.sysfs.writes
    vgpu_apply.apply(engine, from_layout(L40S_12Q))
    thread, outcome = calls[0]
    thread.join(15)
    assert vgpu_types.read_current(engine.sysfs, vf) == 1153                      # retyped to 12Q
    assert vf not in pod_allocations.read(record.path)                           # ... and not allocated
    assert isinstance(outcome[0], AllocationError), outcome
    assert re.match("resource %s: vGPU %s now has type (0|1153), not the 1155 this resource serves"
                    % (re.escape(R24), vf), str(outcome[0])), outcome    # cleared or set: after a write
    assert announced and vf in announced[0][0] and announced[0][1] == writes     # before the first write


def test_an_allocate_after_the_gpus_source_read_stops_the_write_of_its_vf(served, monkeypatch):
    engine, view, record, vf = served
    real = vgpu_apply.NodeEngine.stop_if_newly_held

    def then_allocate(node, plans, done=(), probe=True):
        real(node, plans, done, probe)
        if not probe:                                     # execute's read before the GPU's first write
            view.allocate([vf])
    monkeypatch.setattr(vgpu_apply.NodeEngine, "stop_if_newly_held", then_allocate)
    with pytest.raises(LayoutError, match="VF %s became held by a VM \\(a pod not listed yet \\(device plugin, %s\\)\\)"
                       % (vf, R24)):
        vgpu_apply.apply(engine, from_layout(L40S_12Q))
    assert vgpu_types.read_current(engine.sysfs, vf) == 1155 and vf in pod_allocations.read(record.path)


def test_an_allocate_of_an_unhealthy_vgpu_is_refused(served):
    engine, view, record, vf = served
    view.devices[0] = view.devices[0]._replace(healthy=False)    # withdrawn: a reconcile is changing it
    with pytest.raises(AllocationError, match="resource %s: vGPU %s is Unhealthy" % (R24, vf)):
        view.allocate([vf])
    assert pod_allocations.read(record.path) == {}


def test_vgpus_withdrawn_for_a_write_that_failed_are_healthy_again_even_with_a_damaged_record(
        served, kubelet, kubelet_dir):
    # the agent after a failed apply (_serve_programmed -> not_applied): the record found damaged meanwhile made
    # not_applied raise out of the reconcile (a traceback, no `failed` label) and the withdrawn vGPUs stayed Unhealthy
    engine, dummy, record, vf = served
    lines = []
    plugin = VgpuDevicePlugin(kubelet_dir, lines.append).start()
    try:
        plugin.applied(engine.sysfs, vgpu_apply.apply(engine, from_layout(L40S_24Q)))
        plugin.withdraw([vf])                                  # the reconcile's writes announced, then they fail
        assert [d.id for d in plugin.devices if not d.healthy] == [vf]
        with open(pod_allocations.journal_path(record.path), "w") as handle:
            handle.write("not a journal line\n")
        plugin.not_applied(engine.sysfs)
        assert all(d.healthy for d in plugin.devices), plugin.devices
        with pytest.raises(pod_allocations.AllocationRecordError, match="line 1 is damaged"):
            plugin.check(engine.sysfs)                         # the next reconcile still fails on it, naming it
        assert all(d.healthy for d in plugin.devices)
    finally:
        plugin.close()


def test_a_vf_removed_and_made_again_with_another_type_is_read_anew_not_through_the_old_descriptor(served):
    # CurrentTypes keeps a descriptor per VF: a sysfs attribute of a device gone answers ENODEV, never the new VF's
    engine, view, record, vf = served
    view.record = None                  # not recorded: its pod is gone by the time the VF is made again
    view.allocate([vf])
    assert vf in view.types._fds        # the descriptor kept open
    subprocess.run(["gpusim", "ctl", engine.sysfs.root, "reboot"], check=True)   # SR-IOV off: the VFs go
    vgpu_apply.apply(engine, from_layout(L40S_12Q), enable_vfs=True)   # VFs again, now 12Q
    assert vgpu_types.read_current(engine.sysfs, vf) not in (None, 0, 1155), vgpu_types.read_current(engine.sysfs, vf)
    with pytest.raises(AllocationError, match="vGPU %s now has type %d, not the 1155" % (
            re.escape(vf), vgpu_types.read_current(engine.sysfs, vf))):
        view.allocate([vf])
    view.types.keep(set())
    assert view.types._fds == {}
