# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One apply per node at a time: an exclusive flock on a per-node lock file.

The lock file is named after the real path of the node's sysfs root, so several simulated nodes on
one machine do not block each other while the real node (/sys) has exactly one lock. It lives in
/run/accelops-vgpu/ (tmpfs: nothing stale survives a reboot), or below the temporary directory when
/run is not writable. The file is never removed (removing a flock file races with waiters); the
holder's pid is written into it for the error message of whoever waits.

    with node_lock(sysfs.root, timeout=120):
        ...plan and apply...
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import re
import tempfile
import threading
import time

from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError

RUN_DIR = "/run/accelops-vgpu"
LOCK_KEY_ENV = "ACCELOPS_VGPU_LOCK_KEY"


# lock file names this process holds (NodeLock.acquire/release): `held_here` lets the vGPU writer
# (node/engine/vgpu_writer.py) see that its caller holds the lock. Process-wide, not per thread: an apply's PFs are
# written from worker threads (sriov.apply_vfs), and a second flock of this process would wait for itself.
_HELD = {}
_HELD_LOCK = threading.Lock()


class NodeLockError(EngineError):
    """The node lock could not be taken; the message names the lock file and its holder."""


def lock_name(sysfs_root):
    """`sys-<hash>.lock` for /sys: readable, and unique per real path.

    A process that sees the host's /sys elsewhere (a container with the host under /host) names the
    host's path in ACCELOPS_VGPU_LOCK_KEY, so it takes the same lock as the host's boot unit.
    """
    real = os.environ.get(LOCK_KEY_ENV) or os.path.realpath(sysfs_root)
    digest = hashlib.sha256(real.encode("utf-8", "surrogateescape")).hexdigest()[:12]
    label = re.sub(r"[^A-Za-z0-9_.-]+", "_", os.path.basename(real) or "root")[-32:]
    return "%s-%s.lock" % (label, digest)


def lock_dir(preferred=RUN_DIR):
    """`preferred` when it can be created and written, else <tempdir>/accelops-vgpu."""
    for candidate in (preferred, os.path.join(tempfile.gettempdir(), "accelops-vgpu")):
        try:
            os.makedirs(candidate, mode=0o755, exist_ok=True)
        except OSError:
            continue
        if os.access(candidate, os.W_OK | os.X_OK):
            return candidate
    raise NodeLockError("no writable directory for the node lock (tried %s and the temporary directory)"
                        % preferred)


def lock_path(sysfs_root, directory=None):
    return os.path.join(directory or lock_dir(), lock_name(sysfs_root))


def _holder(fd):
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return "unknown"
    return text if text.isdigit() else "unknown"


class NodeLock:
    """Context manager holding the node's apply lock; waits up to `timeout` seconds for it, or until
    `stop` (a threading.Event: the agent's SIGTERM) is set."""

    def __init__(self, sysfs_root, timeout=120.0, directory=None, poll_interval=0.1, stop=None):
        self.path = lock_path(sysfs_root, directory)
        self.timeout = float(timeout)
        self.poll_interval = poll_interval
        self.stop = stop
        self._fd = None

    def acquire(self):
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        except OSError as exc:
            raise NodeLockError("cannot open node lock %s: %s" % (self.path, os.strerror(exc.errno))) from None
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EACCES, errno.EINTR) or time.monotonic() >= deadline:
                    holder = _holder(fd)
                    os.close(fd)
                    raise NodeLockError("another accelops-vgpu apply holds the node lock %s (pid %s)"
                                        % (self.path, holder)) from None
                if self.stop is not None and self.stop.wait(self.poll_interval):
                    holder = _holder(fd)
                    os.close(fd)
                    raise NodeLockError("stopped while waiting for the node lock %s (held by pid %s); nothing was "
                                        "written" % (self.path, holder)) from None
                if self.stop is None:
                    time.sleep(self.poll_interval)
        os.ftruncate(fd, 0)
        os.pwrite(fd, ("%d\n" % os.getpid()).encode("ascii"), 0)
        self._fd = fd
        with _HELD_LOCK:
            _HELD[os.path.basename(self.path)] = _HELD.get(os.path.basename(self.path), 0) + 1
        return self

    def release(self):
        if self._fd is not None:
            fd, self._fd = self._fd, None
            with _HELD_LOCK:
                name = os.path.basename(self.path)
                _HELD[name] -= 1
                if not _HELD[name]:
                    del _HELD[name]
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc_info):
        self.release()


def node_lock(sysfs_root, timeout=120.0, directory=None, stop=None):
    """`with node_lock(sysfs_root, timeout):` holds the node's apply lock (see NodeLock)."""
    return NodeLock(sysfs_root, timeout, directory, stop=stop)


def held_here(sysfs_root):
    """Whether this process holds the node lock of `sysfs_root` (NodeLock, any thread)."""
    with _HELD_LOCK:
        return lock_name(sysfs_root) in _HELD
