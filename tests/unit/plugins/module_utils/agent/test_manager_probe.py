"""agent/manager_probe.py: sentinels from an apply result, one read per armed GPU per interval."""

from __future__ import annotations

import errno

from ansible_collections.accelops.vgpu.plugins.module_utils.agent.manager_probe import ManagerProbe
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import SysfsError

L40S, T4 = "0000:41:00.0", "0000:43:00.0"
VF = "0000:41:00.5"
UUID = "aa7ba8c5-7b3c-4c5f-9a35-64c1c4d5b2a1"
TYPE_PATH = "bus/pci/devices/%s/nvidia/current_vgpu_type" % VF
MDEV_PATH = "bus/mdev/devices/" + UUID


class FakeSysfs:
    def __init__(self, files, dirs):
        self.files, self.dirs, self.reads = dict(files), set(dirs), []

    def read(self, rel):
        self.reads.append(rel)
        if rel not in self.files:
            raise SysfsError(rel, errno.ENOENT)
        return self.files[rel]

    def isdir(self, rel):
        self.reads.append(rel)
        return rel in self.dirs


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


RESULT = {"gpus": [
    {"address": L40S, "framework": "vendor-vfio", "vgpus": [
        {"address": "0000:41:00.4", "before": None, "after": "L40S-24Q", "type_id": 1155},
        {"address": VF, "before": None, "after": "L40S-24Q", "type_id": 1155},
        {"address": "0000:41:00.6", "before": None, "after": None, "type_id": None}]},
    {"address": "0000:42:00.0", "framework": "vendor-vfio", "vgpus": [
        {"address": "0000:42:00.4", "before": None, "after": None, "type_id": None}]},   # no vGPUs: no sentinel
    {"address": T4, "framework": "mdev", "vgpus": [
        {"address": T4, "uuid": UUID, "before": None, "after": "T4-8Q", "type_id": None}]}]}


def probe_of(sysfs, clock):
    probe = ManagerProbe(sysfs, 5, clock)
    probe.arm(RESULT)
    return probe


def test_an_idle_probe_reads_one_sentinel_per_gpu_with_vgpus_per_interval():
    sysfs, clock = FakeSysfs({TYPE_PATH: "1155"}, {MDEV_PATH}), Clock()
    probe = probe_of(sysfs, clock)
    assert probe.seconds_left() == 5.0 and probe.check() == [] and sysfs.reads == []   # not due yet
    for dummy in range(4):       # 20 s
        clock.now += 5
        assert probe.check() == []
        assert probe.check() == []   # a second look within the interval reads nothing
    assert sysfs.reads == [TYPE_PATH, MDEV_PATH] * 4 and probe.reads == 8   # 2 GPUs x 2 per 10 s


def test_a_reset_type_a_vanished_vf_or_mdev_is_a_lost_gpu():
    sysfs, clock = FakeSysfs({TYPE_PATH: "0"}, set()), Clock()
    probe = probe_of(sysfs, clock)
    clock.now += 5
    assert probe.check() == [L40S, T4]
    del sysfs.files[TYPE_PATH]       # VFs disabled (the manager's stop)
    clock.now += 5
    assert probe.check() == [L40S, T4]


def test_disarmed_or_empty_results_cost_nothing():
    sysfs, clock = FakeSysfs({}, set()), Clock()
    probe = probe_of(sysfs, clock)
    probe.disarm()
    clock.now += 60
    assert probe.check() == [] and probe.seconds_left() is None
    probe.arm({"gpus": [{"address": L40S, "vgpus": []}]})
    clock.now += 60
    assert probe.check() == [] and probe.seconds_left() is None and sysfs.reads == []


def test_claim_time_vfs_one_read_per_gpu_and_a_vf_the_apply_left_untyped_is_passed_over():
    ct = "0000:44:00.0"
    held, mine = "0000:44:00.4", "0000:44:00.5"      # vm-b's VF a process holds (left untyped), vm-a's VF typed
    path = "bus/pci/devices/%s/nvidia/current_vgpu_type"
    sysfs, clock = FakeSysfs({path % held: "0\n", path % mine: "1155\n"}, ()), Clock()
    probe = ManagerProbe(sysfs, 5, clock)
    probe.claimed = lambda: {ct: [(held, 1155), (mine, 1155)]}
    probe.arm({"gpus": []})            # a node with claim-time GPUs only: armed all the same
    sysfs.reads.clear()
    clock.now += 5
    assert probe.check() == [] and sysfs.reads == [path % mine]    # the held one is passed over: no restart loop
    sysfs.files[path % mine] = "0\n"                                 # the manager restarted
    clock.now += 5
    assert probe.check() == [ct]
