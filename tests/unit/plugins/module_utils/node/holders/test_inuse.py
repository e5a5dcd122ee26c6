import errno
import os
import shutil
import stat
import subprocess
import sys

import pytest

from fake_node import FakeNode

from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import inuse
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import Sysfs, SysfsError

PF = "0000:41:00.0"


def _raise(exc):
    raise exc


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


def test_a_vf_is_held_through_the_device_number_whatever_path_the_holder_used(node):
    # The holder opened a character device at a path of its own (as QEMU in a pod opens its
    # /dev/vfio/<group>): the fd's st_rdev is compared with the group cdev's `dev` in sysfs.
    group = node.group_of("0000:41:00.6")
    full = os.stat("/dev/full").st_rdev
    (node.sys / "class/vfio" / group).mkdir(parents=True)
    (node.sys / "class/vfio" / group / "dev").write_text("%d:%d\n" % (os.major(full), os.minor(full)))
    fd_dir = node.proc / "4321" / "fd"
    fd_dir.mkdir(parents=True)
    os.symlink("/dev/full", fd_dir / "7")       # not below dev_root at all
    assert held(node) == {"0000:41:00.6": [4321]}


def test_a_device_node_under_dev_root_identifies_its_char_device(node):
    group = node.group_of("0000:41:00.4")
    os.mknod(node.dev / "vfio" / group, 0o600 | stat.S_IFCHR, os.stat("/dev/full").st_rdev)
    fd_dir = node.proc / "4322" / "fd"
    fd_dir.mkdir(parents=True)
    os.symlink("/dev/full", fd_dir / "3")
    assert held(node) == {"0000:41:00.4": [4322]}


def test_a_path_below_dev_root_that_is_another_file_is_not_a_holder(node):
    group = node.group_of("0000:41:00.4")
    (node.dev / "vfio" / group).write_text("")
    fd_dir = node.proc / "4323" / "fd"
    fd_dir.mkdir(parents=True)
    other = node.dev / "elsewhere"
    other.write_text("")
    os.symlink(str(other), fd_dir / "3")
    assert held(node) == {}


def test_an_uninspectable_process_makes_the_kernel_probe_decide(node, monkeypatch):
    group = node.group_of("0000:41:00.5")
    (node.dev / "vfio" / group).write_text("")
    fd_dir = node.proc / "4400" / "fd"
    fd_dir.mkdir(parents=True)
    os.symlink("/nowhere", fd_dir / "3")
    real_readlink, real_open = os.readlink, os.open

    def readlink(path, *args, **kwargs):
        if str(path).startswith(str(fd_dir)):
            raise PermissionError(errno.EACCES, "denied")
        return real_readlink(path, *args, **kwargs)
    monkeypatch.setattr(os, "readlink", readlink)
    # the group node opens: free; the other VFs have no VFIO node at all: nothing can hold them
    assert held(node) == {}
    # the kernel answers EBUSY: held by someone we may not see
    monkeypatch.setattr(os, "open", lambda path, *a, **k: _raise(OSError(errno.EBUSY, "busy"))
                        if str(path).endswith("/" + group) else real_open(path, *a, **k))
    found = held(node)
    assert list(found) == ["0000:41:00.5"] and "EBUSY" in found["0000:41:00.5"][0]
    assert "4400" in found["0000:41:00.5"][0]
    # the kernel cannot be asked (EACCES on the node): unknown, so held
    monkeypatch.setattr(os, "open", lambda path, *a, **k: _raise(OSError(errno.EACCES, "no"))
                        if str(path).endswith("/" + group) else real_open(path, *a, **k))
    found = held(node)
    assert found["0000:41:00.5"][0].startswith("unknown: pid 4400") and "EACCES" in found["0000:41:00.5"][0]


def test_a_vfio_device_without_a_node_under_dev_root_is_unknown_when_the_scan_is_incomplete(node, monkeypatch):
    group = node.group_of("0000:41:00.7")
    (node.sys / "class/vfio" / group).mkdir(parents=True)
    (node.sys / "class/vfio" / group / "dev").write_text("510:%s\n" % group)   # the kernel has the cdev
    (node.proc / "4401" / "fd").mkdir(parents=True)   # a process whose fds we may not list:
    real_listdir = os.listdir
    monkeypatch.setattr(os, "listdir", lambda path: _raise(PermissionError(errno.EPERM, "no"))
                        if str(path).endswith("/4401/fd") else real_listdir(path))
    found = held(node)
    assert list(found) == ["0000:41:00.7"]
    assert "no VFIO group node %s" % group in found["0000:41:00.7"][0]


def test_out_of_scope_devices_are_not_probed_but_reported_unknown(node, monkeypatch):
    for vf in ("0000:41:00.4", "0000:41:00.5"):
        (node.dev / "vfio" / node.group_of(vf)).write_text("")
    real_listdir, opened = os.listdir, []
    monkeypatch.setattr(os, "listdir", lambda path: _raise(PermissionError(errno.EACCES, "no"))
                        if str(path).endswith("/1/fd") else real_listdir(path))
    real_open = os.open
    # the group probes (Sysfs.read opens the attributes it reads too: not counted)
    monkeypatch.setattr(os, "open", lambda path, *a, **k: (None if str(path).startswith(str(node.sys)) else
                                                           opened.append(str(path))) or real_open(path, *a, **k))
    found = inuse.held_devices(Sysfs(str(node.sys)), str(node.dev), str(node.proc), scope=["0000:41:00.5"])
    assert [os.path.basename(p) for p in opened] == [node.group_of("0000:41:00.5")]
    assert list(found) == ["0000:41:00.4"] and "out of scope" in found["0000:41:00.4"][0]
    # the PF in scope brings its VFs in
    opened.clear()
    assert inuse.held_devices(Sysfs(str(node.sys)), str(node.dev), str(node.proc), scope=[PF]) == {}
    assert len(opened) == 2


def test_extra_holder_sources_are_merged(node):
    pid = node.hold(node.group_of("0000:41:00.4"))

    def claims():
        return {"0000:41:00.4": ["DRA claim ns/a"], "0000:41:00.6": ["DRA claim ns/b"]}
    found = inuse.held_devices(Sysfs(str(node.sys)), str(node.dev), str(node.proc), sources=[claims])
    assert found == {"0000:41:00.4": [pid, "DRA claim ns/a"], "0000:41:00.6": ["DRA claim ns/b"]}
    assert inuse.describe(found["0000:41:00.4"]) == "pid %d; DRA claim ns/a" % pid


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


def test_open_directories_are_not_taken_for_device_nodes(node):
    """An apply's walk_cache holds directories open (a bus's device directory, /dev/vfio): the walk of this
    process's fd table must not record them, so they neither look like holders nor make every device's
    VFIO identity worth reading."""
    vfio = str(node.dev / "vfio")
    fd = os.open(vfio, os.O_PATH | os.O_DIRECTORY)
    try:
        scan = inuse.ProcessScan("/proc", (vfio + "/",))
    finally:
        os.close(fd)
    assert inuse.identity(os.stat(vfio)) not in scan.by_identity


def test_a_probe_inside_a_walk_cache_looks_the_group_up_in_the_open_vfio_directory(node, monkeypatch):
    group = node.group_of("0000:41:00.7")
    (node.dev / "vfio" / group).write_text("")
    sysfs, opened, real_open = Sysfs(str(node.sys)), [], os.open
    monkeypatch.setattr(os, "open", lambda path, *a, **k: opened.append((str(path), k.get("dir_fd"))) or
                        real_open(path, *a, **k))
    holders = inuse.Holders(sysfs, str(node.dev), str(node.proc))
    with sysfs.walk_cache():
        assert holders._probe(group) == "free"
        assert holders._probe(group) == "free"
    assert [name for name, dir_fd in opened if dir_fd is not None] == [group, group]
    assert holders._probe(group) == "free"          # outside the block: by its full path again
    assert opened[-1] == (str(node.dev / "vfio" / group), None)


def test_a_probe_through_a_vfio_directory_that_was_replaced_asks_by_path(node):
    """devtmpfs removes /dev/vfio once it is empty and makes it again for the next group: the directory the
    walk cache holds open is then gone, and the group is asked for by its full path, not "cannot tell"."""
    group = node.group_of("0000:41:00.7")
    sysfs = Sysfs(str(node.sys))
    holders = inuse.Holders(sysfs, str(node.dev), str(node.proc))
    with sysfs.walk_cache():
        assert holders._probe(group).startswith("cannot tell (no VFIO group node")
        os.rename(node.dev / "vfio", node.dev / "vfio-gone")
        shutil.rmtree(node.dev / "vfio-gone")
        (node.dev / "vfio").mkdir()
        (node.dev / "vfio" / group).write_text("")
        assert holders._probe(group) == "free"


def test_dev_root_reached_through_a_symlink_matches_resolved_fd_targets(node, tmp_path):
    os.symlink(str(node.dev), tmp_path / "devlink")
    pid = node.hold(node.group_of("0000:41:00.4"))
    assert inuse.held_devices(Sysfs(str(node.sys)), str(tmp_path / "devlink"), str(node.proc)) == \
        {"0000:41:00.4": [pid]}


def test_a_proc_root_that_shows_no_process_is_an_error_not_nothing_held(node, tmp_path):
    empty = tmp_path / "emptyproc"
    (empty / "self").mkdir(parents=True)
    with pytest.raises(inuse.InUseError) as err:
        inuse.held_devices(Sysfs(str(node.sys)), str(node.dev), str(empty))
    assert "shows no processes" in str(err.value) and str(empty) in str(err.value)


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
    real_listdir = os.listdir
    monkeypatch.setattr(os, "listdir", lambda path: listed.append(path) or real_listdir(path))
    assert held(node) == {"0000:41:00.5": [pid]}
    listed = [p for p in listed if str(p).startswith(str(node.proc))]
    # /proc, then each process's task list and fd dir once (a fake process has no tasks: its own table)
    assert len(listed) == 1 + 2 * 102 and len(set(listed)) == len(listed)


HOLDER = """
import os, sys
handle = os.open(sys.argv[1], os.O_RDWR)
print("ready", flush=True)
sys.stdin.read()
"""


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare(1)")
def test_a_holder_in_its_own_mount_namespace_through_a_bind_mounted_alias_is_found(node, tmp_path):
    # As in a cluster: QEMU opened the node at a path of its own namespace (here a bind mount of
    # dev_root at another path that the scanner's namespace does not even have).
    group = node.group_of("0000:41:00.5")
    (node.dev / "vfio" / group).write_text("")
    alias = tmp_path / "alias"
    alias.mkdir()
    script = 'mount --bind "$1" "$2" && exec "$3" -c "$4" "$2/vfio/$5"'
    holder = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh",
                               str(node.dev), str(alias), sys.executable, HOLDER, group],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        assert os.listdir(alias) == []                    # the alias exists only in the holder's namespace
        assert os.readlink("/proc/%d/fd/3" % holder.pid).startswith(str(alias))
        found = inuse.held_devices(Sysfs(str(node.sys)), str(node.dev), "/proc")
        assert found == {"0000:41:00.5": [holder.pid]}
    finally:
        holder.kill()
        holder.wait()


class LinkFailingSysfs(Sysfs):
    """sysfs whose readlink of paths ending in `failing` fails with EIO (a kernfs or FUSE error)."""

    def __init__(self, root, failing):
        super().__init__(root)
        self.failing = failing

    def readlink(self, rel):
        if rel.endswith(self.failing):
            raise SysfsError(rel, errno.EIO, "readlink")
        return super().readlink(rel)


def test_a_device_whose_iommu_group_cannot_be_read_is_unknown_so_held(node, monkeypatch):
    """32.6: an unreadable in-use fact is unknown, and unknown is held (also when an uninspectable process
    makes the probe decide: a device without a group to probe is not free)."""
    real_listdir = os.listdir
    monkeypatch.setattr(os, "listdir", lambda path: _raise(PermissionError(errno.EACCES, "no"))
                        if str(path).endswith("/1/fd") else real_listdir(path))
    for vf in ("0000:41:00.5", "0000:41:00.6"):
        (node.dev / "vfio" / node.group_of(vf)).write_text("")
    sysfs = LinkFailingSysfs(str(node.sys), "0000:41:00.5/iommu_group")
    found = inuse.held_devices(sysfs, str(node.dev), str(node.proc))
    assert list(found) == ["0000:41:00.5"] and found["0000:41:00.5"][0].startswith("unknown: readlink")
    # a holder open somewhere: the device whose group cannot be read is unknown too
    monkeypatch.setattr(os, "listdir", real_listdir)
    pid = node.hold(node.group_of("0000:41:00.6"))
    found = inuse.held_devices(sysfs, str(node.dev), str(node.proc))
    assert found["0000:41:00.6"] == [pid] and "EIO" in found["0000:41:00.5"][0]
