"""A vGPU the device plugin allocated is held from Allocate until the kubelet lists no live pod with it: the record
(node/holders/pod_allocations.py) written before Allocate answers and synced with the test kubelet's PodResources v1."""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time

import grpc
import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet import device_plugin, pod_resources
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.device_plugin_server import DevicePluginHost
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.errors import AllocationError
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import kubelet_holders, pod_allocations

R24 = "nvidia.com/NVIDIA_L40S-24Q"
VF1, VF2 = "0000:41:00.4", "0000:41:00.5"


class Clock:
    """Wall-clock time as the record sees it: the test kubelet (its sockets) started `since` seconds ago."""

    def __init__(self, since=120.0):
        self.now = time.time() + since

    def __call__(self):
        return self.now


def vf(address):
    return device_plugin.PluginDevice(address, R24, device_plugin.PCI, address, 1155, True, (), "12", ())


@pytest.fixture
def served(kubelet, paths, kubelet_dir):
    """(record, clock): R24 with VF1 and VF2 served to the test kubelet, every Allocate recorded."""
    clock = Clock()
    record = pod_resources.AllocationRecord(kubelet_dir, clock=clock, grace=60)
    host = DevicePluginHost(paths, "test")
    host.publish(device_plugin.resource_views([vf(VF1), vf(VF2)], record.add))
    kubelet.wait("registered", lambda k: len(k.devices(R24)) == 2)
    yield record, clock
    host.close()


def held(kubelet_dir):
    found = {}
    for source in kubelet_holders.holder_sources(kubelet_dir):
        found.update(source())
    return found


def test_an_allocated_vgpu_is_held_from_allocate_until_its_pod_is_gone(kubelet, served, kubelet_dir):
    record, clock = served
    kubelet.allocate(R24, [VF1])              # Allocate answered: recorded before, the kubelet lists no pod yet
    assert held(kubelet_dir) == {VF1: ["a pod not listed yet (device plugin, %s)" % R24]}
    assert record.sync() and VF1 in held(kubelet_dir)           # within the grace: the kubelet lists it later
    clock.now += 61
    assert record.sync() and held(kubelet_dir) == {}            # never listed: an Allocate whose pod never ran
    kubelet.allocate(R24, [VF1])
    kubelet.pod_resources.add("vms", "virt-launcher-a", "compute", R24, [VF1])
    assert record.sync()
    assert held(kubelet_dir) == {VF1: ["pod vms/virt-launcher-a (device plugin, %s)" % R24]}
    kubelet.delete_pod("vms", "virt-launcher-a")      # listed once, gone now (the VM deleted): free at once
    clock.now += 1
    assert record.sync() and held(kubelet_dir) == {}
    assert json.load(open(pod_allocations.record_path(kubelet_dir)))["devices"] == {}


def test_run_pod_is_recorded_with_its_pod_and_one_allocated_before_the_record_is_learnt(
        kubelet, served, kubelet_dir):
    record, clock = served
    kubelet.run_pod("vms", "vm-a", R24, [VF1])
    kubelet.pod_resources.add("vms", "vm-old", "compute", R24, [VF2])   # allocated by an agent without the record
    clock.now += 600
    assert record.sync()
    assert held(kubelet_dir) == {VF1: ["pod vms/vm-a (device plugin, %s)" % R24],
                                 VF2: ["pod vms/vm-old (device plugin, %s)" % R24]}


def restart_listing_no_pod(kubelet):
    """A kubelet restart (its sockets made anew) whose List shows no pod until its pod sources synced; returns a
    function that makes them listed again."""
    pods = dict(kubelet.pod_resources.pods)
    kubelet.restart()
    kubelet.pod_resources.pods.clear()
    return lambda: kubelet.pod_resources.pods.update(pods)


def test_a_restarted_kubelet_listing_no_pod_yet_frees_nothing_its_pods_hold(kubelet, served, kubelet_dir):
    record, clock = served
    kubelet.run_pod("vms", "vm-a", R24, [VF1])
    clock.now += 600
    assert record.sync() and VF1 in held(kubelet_dir)
    synced = restart_listing_no_pod(kubelet)
    clock.now += 5
    assert record.sync()
    assert held(kubelet_dir) == {VF1: ["pod vms/vm-a (device plugin, %s)" % R24]}   # QEMU may not hold it yet
    synced()
    clock.now += 120
    assert record.sync()
    assert held(kubelet_dir) == {VF1: ["pod vms/vm-a (device plugin, %s)" % R24]}


def test_an_allocation_never_listed_before_a_kubelet_restart_stays_held_through_it(kubelet, served, kubelet_dir):
    """Issue 40.5a: allocated, the kubelet restarts before any sync saw it listed, the next sync comes more than the
    grace after the Allocate (syncs run per reconcile): the restart keeps it, not the Allocate's age."""
    record, clock = served
    assert record.sync()
    kubelet.allocate(R24, [VF2])
    synced = restart_listing_no_pod(kubelet)
    clock.now += 70
    assert record.sync() and VF2 in held(kubelet_dir)
    clock.now += 30                              # the window runs from the restart the sync saw
    assert record.sync() and VF2 in held(kubelet_dir)
    synced()
    clock.now += 31
    assert record.sync() and held(kubelet_dir) == {}    # restart over, still never listed: its pod never ran


def test_a_kubelet_that_started_moments_ago_is_a_restart_for_a_record_new_to_it(kubelet, kubelet_dir):
    """An agent started after the kubelet restarted (no earlier sync to compare with): the sockets' age says it."""
    pod_allocations.append(pod_allocations.record_path(kubelet_dir), R24, [VF1], time.time() - 3600)
    record = pod_resources.AllocationRecord(kubelet_dir, clock=Clock(since=10.0), grace=60)
    assert record.kubelet_restarting()
    assert record.sync() and VF1 in held(kubelet_dir)
    record.clock.now += 60
    assert record.sync() and held(kubelet_dir) == {}


def test_a_journal_line_the_snapshot_already_has_keeps_its_pod(kubelet_dir, monkeypatch):
    """A crash between the snapshot's rename and the journal's truncation replays the line on the next read: it must
    not strip the pod the snapshot names (then the device reads as never listed, and its allocation as old)."""
    path = pod_allocations.record_path(kubelet_dir)
    pod_allocations.append(path, R24, [VF1, VF2], 5.0)
    monkeypatch.setattr(pod_allocations, "journal_pending", lambda where: False)   # the truncation never ran
    pod_allocations.write(path, {VF1: {"resource": R24, "allocatedAt": 5.0, "pod": "vms/vm-a"},
                                 VF2: {"resource": R24, "allocatedAt": 4.0, "pod": "vms/vm-old"}})
    devices = pod_allocations.read(path)
    assert devices[VF1] == {"resource": R24, "allocatedAt": 5.0, "pod": "vms/vm-a"}
    assert devices[VF2] == {"resource": R24, "allocatedAt": 5.0}        # a newer Allocate: the journal's line


def test_podresources_unreachable_keeps_every_allocation_held(kubelet, served, kubelet_dir):
    record, clock = served
    kubelet.allocate(R24, [VF2])
    kubelet.pod_resources.unavailable = True
    clock.now += 3600
    assert record.sync() is False
    assert VF2 in held(kubelet_dir)
    kubelet.pod_resources.stop()                 # no socket at all
    assert record.sync() is False and VF2 in held(kubelet_dir)


def test_a_damaged_record_is_an_error_naming_it_unknown_is_held(kubelet, served, kubelet_dir):
    record, dummy = served
    kubelet.allocate(R24, [VF1])
    path = pod_allocations.record_path(kubelet_dir)
    with open(path, "w") as handle:
        handle.write('{"version": 1, "devices": {}, "checksum": "x"}')
    for source in (lambda: held(kubelet_dir), record.sync):
        with pytest.raises(pod_allocations.AllocationRecordError, match="record %s: checksum mismatch" % path):
            source()
    kubelet.allocate(R24, [VF2])        # still recorded (journal), and every reader still fails: held
    assert '"id": "%s"' % VF2 in open(pod_allocations.journal_path(path)).read()
    with open(path, "w") as handle:
        handle.write("{")
    with pytest.raises(pod_allocations.AllocationRecordError, match="record %s cannot be read" % path):
        held(kubelet_dir)


def test_a_journal_line_cut_short_is_an_allocate_that_never_answered_any_other_bad_line_is_damage(kubelet_dir):
    path = pod_allocations.record_path(kubelet_dir)
    pod_allocations.append(path, R24, [VF1], 5.0)
    journal = pod_allocations.journal_path(path)
    with open(journal, "a") as handle:
        handle.write('{"id": "%s", "resou' % VF2)         # power cut mid-write: that Allocate never answered
    assert pod_allocations.read(path) == {VF1: {"resource": R24, "allocatedAt": 5.0}}
    with open(journal, "a") as handle:
        handle.write("\n")
    with pytest.raises(pod_allocations.AllocationRecordError, match="journal %s: line 2 is damaged" % journal):
        pod_allocations.read(path)
    text = open(journal).read().replace(R24, "nvidia.com/NVIDIA_L40S-12Q", 1).splitlines()[0] + "\n"
    with open(journal, "w") as handle:
        handle.write(text)                                 # edited: its sum no longer matches
    with pytest.raises(pod_allocations.AllocationRecordError, match="journal %s: line 1 is damaged" % journal):
        pod_allocations.read(path)


def test_an_allocate_after_a_cut_write_drops_the_cut_line_instead_of_damaging_the_journal(kubelet_dir):
    path = pod_allocations.record_path(kubelet_dir)
    pod_allocations.append(path, R24, [VF1], 5.0)
    journal = pod_allocations.journal_path(path)
    with open(journal, "a") as handle:
        handle.write('{"id": "%s", "resou' % VF2)         # power cut mid-write, then the agent restarts
    pod_allocations.append(path, R24, [VF2], 7.0)         # the kubelet's retry of that Allocate
    assert pod_allocations.read(path) == {VF1: {"resource": R24, "allocatedAt": 5.0},
                                          VF2: {"resource": R24, "allocatedAt": 7.0}}
    assert len(open(journal).read().splitlines()) == 2


def test_sync_folds_the_journal_into_the_snapshot(kubelet, served, kubelet_dir):
    record, dummy = served
    kubelet.run_pod("vms", "vm-a", R24, [VF1])
    path = pod_allocations.record_path(kubelet_dir)
    assert pod_allocations.journal_pending(path)
    assert record.sync() and not pod_allocations.journal_pending(path)
    assert json.load(open(path))["devices"][VF1]["pod"] == "vms/vm-a"
    assert held(kubelet_dir) == {VF1: ["pod vms/vm-a (device plugin, %s)" % R24]}


def test_a_record_that_cannot_be_written_fails_the_allocate(kubelet_dir):
    with open(kubelet_dir + "/plugins", "w"):
        pass                                    # no directory can be made there
    record = pod_resources.AllocationRecord(kubelet_dir)
    with pytest.raises(AllocationError, match="resource %s: cannot record the allocation of %s" % (R24, VF1)):
        record.add(R24, [VF1])


def test_the_podresources_double_answers_get_and_allocatable(kubelet, served):
    from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.api import (
        podresources_v1_pb2 as pb, podresources_v1_pb2_grpc as pb_grpc)
    kubelet.run_pod("vms", "vm-a", R24, [VF1])
    with grpc.insecure_channel("unix:" + kubelet.pod_resources.path) as channel:
        stub = pb_grpc.PodResourcesListerStub(channel)
        pod = stub.Get(pb.GetPodResourcesRequest(pod_name="vm-a", pod_namespace="vms")).pod_resources
        assert [list(d.device_ids) for c in pod.containers for d in c.devices] == [[VF1]]
        with pytest.raises(grpc.RpcError) as missing:
            stub.Get(pb.GetPodResourcesRequest(pod_name="vm-b", pod_namespace="vms"))
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND
        allocatable = stub.GetAllocatableResources(pb.AllocatableResourcesRequest())
        assert [(d.resource_name, sorted(d.device_ids)) for d in allocatable.devices] == [(R24, [VF1, VF2])]


def test_an_allocate_landing_between_the_prune_read_and_its_rewrite_is_not_lost(
        kubelet, served, kubelet_dir, monkeypatch):
    """Another process's Allocate (a second agent during a rolled DaemonSet: its own AllocationRecord) lands right
    after this agent's sync read the record. It waits for the rewrite (the record's flock; flock conflicts between
    separate opens of the lock file, in one process as across two) and its journal line survives it."""
    record, dummy = served
    kubelet.run_pod("vms", "vm-a", R24, [VF1])
    other = pod_resources.AllocationRecord(kubelet_dir)
    path, real_read, threads = pod_allocations.record_path(kubelet_dir), pod_allocations.read, []

    def read_then_allocate(where):
        devices = real_read(where)
        if not threads:
            threads.append(threading.Thread(target=other.add, args=(R24, [VF2])))
            threads[0].start()
            threads[0].join(0.5)      # without the lock: appended now, before the rewrite below
        return devices

    monkeypatch.setattr(pod_allocations, "read", read_then_allocate)
    assert record.sync()
    threads[0].join(5)
    monkeypatch.setattr(pod_allocations, "read", real_read)
    devices = pod_allocations.read(path)
    assert sorted(devices) == [VF1, VF2] and devices[VF1]["pod"] == "vms/vm-a"
    assert held(kubelet_dir)[VF2] == ["a pod not listed yet (device plugin, %s)" % R24]


def test_an_allocate_waits_a_bounded_time_for_the_record_lock_then_fails_naming_it(kubelet_dir, monkeypatch):
    path = pod_allocations.record_path(kubelet_dir)
    lock = os.path.join(os.path.dirname(path), "allocations.lock")
    monkeypatch.setattr(pod_allocations, "APPEND_WAIT", 0.2, raising=False)
    record = pod_resources.AllocationRecord(kubelet_dir)
    os.makedirs(os.path.dirname(path))
    with open(lock, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)      # a rewrite that does not end (another process, stuck)
        started = time.monotonic()
        with pytest.raises(AllocationError, match="cannot record the allocation of %s in .*%s" % (VF1, lock)):
            record.add(R24, [VF1])
        assert 0.2 <= time.monotonic() - started < 2
    assert not pod_allocations.journal_pending(path) and pod_allocations.read(path) == {}
    record.add(R24, [VF1])                      # the lock released: recorded
    assert list(pod_allocations.read(path)) == [VF1]


def test_an_allocate_outwaits_a_slow_rewrite_of_the_other_agent_during_a_rollout(kubelet_dir):
    """Two agents overlap during a rollout; the other one's rewrite holds the lock for its read and two fsyncs, which
    a slow disk can stretch to seconds. The kubelet does not retry a failed Allocate (the VMI fails): it must wait."""
    path = pod_allocations.record_path(kubelet_dir)
    lock = os.path.join(os.path.dirname(path), "allocations.lock")
    record = pod_resources.AllocationRecord(kubelet_dir)
    os.makedirs(os.path.dirname(path))
    handle = open(lock, "w")
    fcntl.flock(handle, fcntl.LOCK_EX)          # the other agent's rewrite, 2 s on a slow disk
    releaser = threading.Timer(2.0, handle.close)
    releaser.start()
    try:
        started = time.monotonic()
        record.add(R24, [VF1])
        assert time.monotonic() - started >= 1.5
    finally:
        releaser.join()
    assert list(pod_allocations.read(path)) == [VF1]


def test_a_read_that_a_rewrite_overlapped_is_read_again(kubelet_dir, monkeypatch):
    """A reader (the engine, the CLI, the boot unit: no lock, the directory may be read-only to it) reads the old
    snapshot, then a rewrite folds the journal into a new snapshot and empties the journal, then the reader reads
    the journal: without a second read the allocated VF would look free."""
    path = pod_allocations.record_path(kubelet_dir)
    pod_allocations.write(path, {})
    pod_allocations.append(path, R24, [VF1], 5.0)
    real, calls = pod_allocations._read_journal, []

    def rewritten_meanwhile(journal):
        if not calls:
            calls.append(journal)
            pod_allocations.write(path, {VF1: {"resource": R24, "allocatedAt": 5.0}})
        return real(journal)

    monkeypatch.setattr(pod_allocations, "_read_journal", rewritten_meanwhile)
    assert pod_allocations.read(path) == {VF1: {"resource": R24, "allocatedAt": 5.0}}


def test_a_read_that_met_a_line_a_writer_was_repairing_is_read_again(kubelet_dir, monkeypatch):
    """A lock-free reader copying the journal while the appender drops a cut line and appends into the same page
    can see a spliced line once; the next read sees the repaired journal. Only damage that stays is an error."""
    path = pod_allocations.record_path(kubelet_dir)
    pod_allocations.write(path, {})
    pod_allocations.append(path, R24, [VF1], 5.0)
    real, calls = pod_allocations._read_journal, []

    def spliced_once(journal):
        calls.append(journal)
        if len(calls) == 1:
            raise pod_allocations.AllocationRecordError("device plugin allocation journal %s: line 1 is damaged"
                                                        % journal)
        return real(journal)

    monkeypatch.setattr(pod_allocations, "_read_journal", spliced_once)
    assert pod_allocations.read(path) == {VF1: {"resource": R24, "allocatedAt": 5.0}} and len(calls) == 2


def test_a_kubelet_restart_a_sync_sees_minutes_later_is_over_by_its_sockets_time(kubelet, kubelet_dir):
    """Syncs run per reconcile (RESYNC_INTERVAL 300 s): a restart that made its sockets between two syncs, minutes
    before the second, is over; it held every recorded vGPU for another grace from the sync that noticed it (a
    relabel after it refused for a VF of a VM deleted long ago)."""
    clock = Clock(since=0.0)
    record = pod_resources.AllocationRecord(kubelet_dir, clock=clock, grace=60)
    record.kubelet_restarting()                    # a sync; its sockets are the test kubelet's, made moments ago
    time.sleep(0.01)
    kubelet.restart()
    clock.now = time.time() + 240                  # the next sync, four minutes after the restart
    assert not record.kubelet_restarting()
    kubelet.restart()
    clock.now = time.time() + 5
    assert record.kubelet_restarting()             # a restart moments ago
    clock.now += 600
    kubelet.restart()
    clock.now += 10                                # a socket time not between the two syncs (a clock step): unsure
    assert record.kubelet_restarting()


def test_a_socket_time_in_the_future_is_a_restart_for_one_grace_not_until_the_clock_catches_up(kubelet, kubelet_dir):
    """The clock stepped back an hour after the kubelet made its sockets (a node whose clock was ahead until NTP):
    unsure when it started, so one grace from the sync that saw it; before, every recorded vGPU stayed held for
    the hour (no refused layout converged)."""
    clock = Clock(since=-3600.0)
    record = pod_resources.AllocationRecord(kubelet_dir, clock=clock, grace=60)
    assert record.kubelet_restarting()
    clock.now += 30
    assert record.kubelet_restarting()
    clock.now += 31
    assert not record.kubelet_restarting()
