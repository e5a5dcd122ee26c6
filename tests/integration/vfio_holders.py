"""Processes that hold a VFIO node the way a VM does, for the in-use tests (issue 25).

`Holder(node, name, alias=None, uid=None)` opens the VF's (or mdev's) iommufd cdev node of a gpusim
node and keeps it open until stop():
- `alias`: the process runs in a mount namespace of its own (`unshare -m`) where the node's dev
  root is bind-mounted at `alias`, a path only it has, and opens the node through it: its
  /proc/PID/fd link names `alias/...`, as QEMU's names `/dev/vfio/...` of its pod;
- `uid`: after opening, the process becomes that uid (a holder a scanner without CAP_SYS_PTRACE may
  not inspect).
Needs root for both (`NEEDS_ROOT` is the skip mark).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

NEEDS_ROOT = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("setpriv"),
                                reason="needs root, unshare(1) and setpriv(1)")
NO_PTRACE = ["setpriv", "--inh-caps=-sys_ptrace", "--bounding-set=-sys_ptrace", "--"]

HOLDER = """
import os, sys
handle = os.open(sys.argv[1], os.O_RDWR)
if len(sys.argv) > 2:
    os.setgroups([]); os.setresgid(int(sys.argv[2]), int(sys.argv[2]), int(sys.argv[2]))
    os.setresuid(int(sys.argv[2]), int(sys.argv[2]), int(sys.argv[2]))
print("ready", flush=True)
sys.stdin.read()
"""
IN_OWN_NAMESPACE = 'mount --bind "$1" "$2" && exec "$3" -c "$4" "$2/$5"'


def own_namespace_prefix(source, alias):
    """argv prefix running a command in a mount namespace of its own with `source` bind-mounted at
    `alias` (created here, empty in every other namespace): how a DaemonSet sees the host's /dev."""
    os.makedirs(alias, exist_ok=True)
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", 'mount --bind "$0" "$1" && shift 2 && exec "$@"',
            source, alias]


def cdev_path(node, name):
    """The iommufd cdev node of a VF or mdev (what gpusim's own holders open)."""
    base = node.device_path(name) if ":" in name else node.path("bus/mdev/devices", name)
    cdev = os.listdir(os.path.join(base, "vfio-dev"))[0]
    return os.path.join(node.dev_root, "vfio", "devices", cdev)


class Holder:
    def __init__(self, node, name, alias=None, uid=None):
        path = os.path.relpath(cdev_path(node, name), node.dev_root)
        extra = [str(uid)] if uid is not None else []
        if alias is None:
            argv = [sys.executable, "-c", HOLDER, os.path.join(node.dev_root, path)] + extra
        else:
            os.makedirs(alias, exist_ok=True)
            argv = ["unshare", "-m", "--propagation", "private", "sh", "-c",
                    IN_OWN_NAMESPACE + "".join(' "$%d"' % (6 + i) for i in range(len(extra))),
                    "sh", node.dev_root, alias, sys.executable, HOLDER, path] + extra
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "ready"
        self.pid = self.proc.pid

    def fd_target(self):
        return os.readlink("/proc/%d/fd/3" % self.pid)

    def stop(self):
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def vfio_holders():
    """start(node, name, alias=None, uid=None) -> Holder; all stopped at teardown."""
    started = []
    yield lambda *args, **kwargs: started.append(Holder(*args, **kwargs)) or started[-1]
    for holder in started:
        holder.stop()
