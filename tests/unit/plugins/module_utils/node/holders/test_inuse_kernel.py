"""The holder scan against the real kernel (issue 32 items 2 and 3): a holder whose descriptor lives only in a
thread's own fd table, and a procfs mounted hidepid=2 scanned by a user it hides processes from.

Real processes and a real procfs: a FakeNode provides sysfs and the device node (a regular file, matched by
inode as gpusim's are); the holders and the /proc they are found in are the kernel's."""

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time

import pytest

from fake_node import FakeNode
# the fixture: a PF with 4 VFs
from test_inuse import node  # noqa: F401 pylint: disable=unused-import

from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import inuse
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import Sysfs

PF, VF = "0000:41:00.0", "0000:41:00.5"

# A holder whose fd is in a thread's table only: after unshare(CLONE_FILES) (the thread's table is its own), or
# opened by a thread in the shared table after which the main thread exits (the leader, a zombie, has no table).
THREADED = r"""
import ctypes, os, sys, threading, time
libc = ctypes.CDLL(None, use_errno=True)
path, mode = sys.argv[1], sys.argv[2]
opened = threading.Event()

def worker():
    if mode == "unshare" and libc.unshare(0x400) != 0:       # CLONE_FILES
        raise OSError(ctypes.get_errno(), "unshare")
    os.open(path, os.O_RDWR)
    opened.set()
    time.sleep(120)

threading.Thread(target=worker, daemon=False).start()
opened.wait()
print("ready", flush=True)
if mode == "leader-exits":
    libc.pthread_exit(None)
time.sleep(120)
"""


def _state(pid):
    with open("/proc/%d/status" % pid) as handle:
        return [line for line in handle if line.startswith("State:")][0]


def _started(argv):
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux procfs")
@pytest.mark.parametrize("mode", ["unshare", "leader-exits"])
def test_a_holder_whose_fd_is_in_a_threads_own_table_is_found(node, mode):
    group = node.group_of(VF)
    (node.dev / "vfio" / group).write_text("")
    holder = _started([sys.executable, "-c", THREADED, str(node.dev / "vfio" / group), mode])
    try:
        deadline = time.monotonic() + 10
        while mode == "leader-exits" and "zombie" not in _state(holder.pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        leader = os.listdir("/proc/%d/fd" % holder.pid)
        assert not any(os.readlink("/proc/%d/fd/%s" % (holder.pid, fd)).endswith("/vfio/" + group)
                       for fd in leader if os.path.islink("/proc/%d/fd/%s" % (holder.pid, fd)))   # not in /proc/PID/fd
        assert inuse.held_devices(Sysfs(str(node.sys)), str(node.dev), "/proc") == {VF: [holder.pid]}
    finally:
        holder.kill()
        holder.wait()


def test_threads_sharing_a_table_are_not_read_twice(node, monkeypatch):
    """One table per process, not one per thread, where kcmp(2) can tell (issue 34: no multiplied cost)."""
    if inuse._kcmp is None:
        pytest.skip("no kcmp(2) on this architecture")
    group = node.group_of(VF)
    (node.dev / "vfio" / group).write_text("")
    holder = _started([sys.executable, "-c", THREADED, str(node.dev / "vfio" / group), "shared"])
    try:
        assert len(os.listdir("/proc/%d/task" % holder.pid)) >= 2
        listed, real_listdir = [], os.listdir
        monkeypatch.setattr(os, "listdir", lambda path: listed.append(str(path)) or real_listdir(path))
        assert inuse.held_devices(Sysfs(str(node.sys)), str(node.dev), "/proc") == {VF: [holder.pid]}
        mine = [p for p in listed if p.startswith("/proc/%d/" % holder.pid)]
        assert mine == ["/proc/%d/task" % holder.pid, "/proc/%d/fd" % holder.pid]     # no task's fd listed
    finally:
        holder.kill()
        holder.wait()


# the scanning user runs a Python whose standard library it may read (a root-only pyenv is not one)
SYSTEM_PYTHON = next((p for p in ("/usr/bin/python3", "/usr/local/bin/python3") if os.access(p, os.X_OK)), None)
SCAN_AS_NOBODY = r"""
import json, os, sys
sys.path[:0] = [sys.argv[1]]
os.setgroups([]); os.setgid(65534); os.setuid(65534)
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import inuse
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import Sysfs
print(json.dumps(inuse.held_devices(Sysfs(sys.argv[2]), sys.argv[3], sys.argv[4])))
"""


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare") or not SYSTEM_PYTHON,
                    reason="needs root, unshare(1) and a Python another user may run")
def test_a_hidepid_procfs_makes_the_scan_incomplete_never_nothing_held():
    """hidepid=2 hides root's VM from the scanning user: the listing looks complete; the scan must not say free."""
    top = tempfile.mkdtemp(prefix="hidepid-")
    try:
        os.chmod(top, 0o755)
        from pathlib import Path
        node = FakeNode(Path(top))
        node.pf(PF, total=4)
        node.set_numvfs(PF, 4)
        group = node.group_of(VF)
        path = node.dev / "vfio" / group
        path.write_text("")
        os.chmod(path, 0o600)               # root's VM node: the scanning user cannot open (probe) it either
        for dirpath, dirnames, filenames in os.walk(top):
            os.chmod(dirpath, 0o755)
        proc_dir = Path(top) / "hostproc"
        proc_dir.mkdir()
        os.chmod(proc_dir, 0o755)
        holder = _started([sys.executable, "-c", THREADED, str(path), "shared"])
        try:
            collections = os.path.abspath(".build/collections")
            script = 'mount -t proc -o hidepid=2 proc "$1" && shift && exec "$@"'
            out = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", str(proc_dir),
                                  SYSTEM_PYTHON, "-c", SCAN_AS_NOBODY, collections, str(node.sys), str(node.dev),
                                  str(proc_dir)], capture_output=True, text=True, timeout=60, check=False)
            assert out.returncode == 0, out.stderr
            found = json.loads(out.stdout)
            assert list(found) == [VF], found         # unknown is held; before: {} (the hidden VM's VF free)
            assert "is mounted hidepid=invisible" in found[VF][0] and "EACCES" in found[VF][0]   # the kernel says 2 so
        finally:
            holder.kill()
            holder.wait()
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_the_mount_table_says_which_procfs_hides_processes(tmp_path):
    text = ("22 1 0:21 / /proc rw,nosuid - proc proc rw\n"
            "40 22 0:50 / /host/proc rw - proc proc rw,hidepid=invisible\n"
            "41 1 0:51 / /host\\040x rw - proc proc rw,hidepid=2\n"
            "42 1 0:52 / /other rw - proc proc rw,hidepid=0\n")
    assert inuse._mount_of(text, "/host/proc") == ("/host/proc", "proc", "rw,hidepid=invisible")
    assert inuse._mount_of(text, "/host x") == ("/host x", "proc", "rw,hidepid=2")
    assert inuse._mount_of(text, "/proc/1") == ("/proc", "proc", "rw")
    assert inuse.procfs_filter(str(tmp_path)) is None          # not procfs: nothing hidden
    assert stat.S_ISDIR(os.stat("/proc").st_mode) and inuse.procfs_filter("/proc") in (None, inuse.procfs_filter("/proc"))


def test_a_recheck_for_a_free_device_asks_the_kernel_and_walks_no_proc(gpusim_node):
    """recheck(name_holders=False), what claim-time Prepare asks of each candidate VF: a held VF is reported
    busy by its group's EBUSY probe alone; naming the holder's pid is what costs a /proc walk."""
    gpu = gpusim_node("l40s:1")
    subprocess.run(["sriov-manage", "-e", gpu.pfs()[0]], env=gpu.env, check=True, capture_output=True)
    held, free = gpu.vfs(gpu.pfs()[0])[:2]
    pid = gpu.hold(held)
    holders = inuse.Holders(Sysfs(gpu.root), gpu.dev_root, "/proc")
    quick = holders.recheck([held, free], name_holders=False)
    assert list(quick) == [held] and quick[held][0].startswith("VFIO group")
    assert holders.counts["scans"] == 0 and holders.counts["probes"] == 2
    assert holders.recheck([held])[held] == [pid] and holders.counts["scans"] == 1
