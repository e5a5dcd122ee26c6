import os

import pytest

from fake_node import FakeNode

from ansible_collections.accelops.vgpu.plugins.module_utils.node import inuse
from ansible_collections.accelops.vgpu.plugins.module_utils.node.sysfs import Sysfs

PF = "0000:41:00.0"


@pytest.fixture
def node(tmp_path):
    node = FakeNode(tmp_path)
    node.pf(PF, total=4)
    node.set_numvfs(PF, 4)
    return node


def held(node):
    return inuse.held_devices(Sysfs(str(node.sys)), str(node.dev), str(node.proc))


def test_nothing_open_means_nothing_held(node):
    node.hold("vfio")            # the VFIO container node belongs to no device
    assert held(node) == {}


def test_a_vf_is_held_through_its_iommu_group(node):
    pid = node.hold(node.group_of("0000:41:00.5"))
    assert held(node) == {"0000:41:00.5": [pid]}


def test_a_vf_is_held_through_its_iommufd_cdev(node):
    # vfio-dev/vfio<N> of the third VF is vfio3 (FakeNode numbers them from 1)
    first, second = node.hold("devices/vfio3"), node.hold("devices/vfio3")
    assert held(node) == {"0000:41:00.6": sorted([first, second])}


def test_an_mdev_is_held_through_its_own_group_and_counts_for_its_parent(tmp_path):
    node = FakeNode(tmp_path)
    node.mdev_gpu(PF, total=2)
    uuid = "5c8f3b52-0c1c-4a4b-9f5e-111111111111"
    node.mdev(uuid, "0000:41:00.5")
    pid = node.hold(node.group_of(uuid, "bus/mdev/devices"))
    sysfs = Sysfs(str(node.sys))
    found = inuse.held_devices(sysfs, str(node.dev), str(node.proc))
    assert found == {uuid: [pid]}
    parents = inuse.mdev_parents(sysfs)
    assert parents == {uuid: "0000:41:00.5"}
    assert inuse.holders(found, "0000:41:00.5", parents) == [pid]
    assert inuse.holders(found, "0000:41:00.4", parents) == []


def test_vanished_and_odd_processes_are_skipped(node):
    (node.proc / "self").mkdir()            # not a pid
    (node.proc / "77").mkdir()              # exited: no fd directory any more
    (node.proc / "78").write_text("")       # fd path below a file: ENOTDIR
    fd_dir = node.proc / "79" / "fd"
    fd_dir.mkdir(parents=True)
    (fd_dir / "3").write_text("")           # not a link: EINVAL
    pid = node.hold(node.group_of("0000:41:00.4"))
    assert held(node) == {"0000:41:00.4": [pid]}


def test_a_real_open_handle_in_this_process_is_found(node):
    group = node.group_of("0000:41:00.7")
    (node.dev / "vfio" / group).write_text("")
    with open(node.dev / "vfio" / group):
        found = inuse.held_devices(Sysfs(str(node.sys)), str(node.dev), "/proc")
    assert found == {"0000:41:00.7": [os.getpid()]}


def test_dev_root_reached_through_a_symlink_matches_resolved_fd_targets(node, tmp_path):
    os.symlink(str(node.dev), tmp_path / "devlink")
    pid = node.hold(node.group_of("0000:41:00.4"))
    assert inuse.held_devices(Sysfs(str(node.sys)), str(tmp_path / "devlink"), str(node.proc)) == \
        {"0000:41:00.4": [pid]}


def test_a_missing_proc_root_is_an_error_not_nothing_held(node, tmp_path):
    with pytest.raises(inuse.InUseError) as err:
        inuse.held_devices(Sysfs(str(node.sys)), str(node.dev), str(tmp_path / "nope"))
    assert str(tmp_path / "nope") in str(err.value)


def test_the_process_table_is_read_once_whatever_the_number_of_vfs(tmp_path, monkeypatch):
    node = FakeNode(tmp_path)
    node.pf(PF, total=16)
    node.set_numvfs(PF, 16)
    for pid in range(10000, 10100):
        fd_dir = node.proc / str(pid) / "fd"
        fd_dir.mkdir(parents=True)
        for fd in range(2):
            os.symlink("/dev/null", fd_dir / str(fd))
    pid = node.hold("devices/vfio2")
    listed = []
    real_entries = inuse._entries
    monkeypatch.setattr(inuse, "_entries", lambda path: listed.append(path) or real_entries(path))
    assert held(node) == {"0000:41:00.5": [pid]}
    assert len(listed) == 1 + 101 and len(set(listed)) == len(listed)   # /proc, then each fd dir once
