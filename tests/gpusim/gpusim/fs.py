"""The FUSE server: serves a State's Tree, logs every sysfs write, counts open VFIO handles.

Multi-threaded (libfuse's default loop); every callback takes the State lock only briefly, so a
slow sriov_numvfs store on one PF never blocks reads or other PFs. libfuse 3.14's fuse_main ignores
max_threads (it logs "Ignoring invalid max threads value"), so at most 10 requests run at once:
more than 10 PFs enabling with latency at the same moment take a multiple of the latency. Mounted with allow_other (so
podman containers see it through a bind mount), direct_io and zero cache timeouts (every read and
lookup reaches the server, like sysfs).
"""

from __future__ import annotations

import errno
import itertools
import json
import os
import threading
import time

import mfusepy

from gpusim.devices import SimError
from gpusim.tree import GPUSIM_DIR, Tree, canonical

MOUNT_OPTIONS = {"foreground": True, "allow_other": True, "direct_io": True, "attr_timeout": 0,
                 "entry_timeout": 0, "negative_timeout": 0, "fsname": "gpusim", "subtype": "gpusim"}


class SimFS(mfusepy.Operations):
    use_ns = True

    def __init__(self, state):
        self.state = state
        self.tree = Tree(state, self)
        self._handles = {}
        self._contents = {}  # fh -> what its first read returned
        self._handles_lock = threading.Lock()
        self._next_fh = itertools.count(1)
        self._time = time.time_ns()

    def _node(self, path):
        node = self.tree.lookup(path)
        if node is None:
            raise SimError(errno.ENOENT)
        return node

    # ---- FUSE callbacks --------------------------------------------------------------------------
    def getattr(self, path, fh=None):
        node = self._node(path)
        size = {"dir": 0, "file": 4096, "link": len(node.target or "")}[node.kind]
        return {"st_mode": node.st_mode, "st_nlink": 2 if node.kind == "dir" else 1, "st_size": size,
                "st_uid": 0, "st_gid": 0, "st_atime": self._time, "st_mtime": self._time,
                "st_ctime": self._time}

    def readdir(self, path, fh):
        node = self._node(path)
        if node.kind != "dir":
            raise SimError(errno.ENOTDIR)
        return [".", ".."] + list(self.tree.entries(node))

    def readlink(self, path):
        node = self._node(path)
        if node.kind != "link":
            raise SimError(errno.EINVAL)
        return node.target

    def open(self, path, flags):
        node = self._node(path)
        if node.kind == "dir":
            raise SimError(errno.EISDIR)
        mode = flags & os.O_ACCMODE
        canon = canonical(path)
        if mode in (os.O_WRONLY, os.O_RDWR) and node.write is None:
            if not canon.startswith(GPUSIM_DIR + "/"):          # kernfs: no store -> EACCES on open
                self.state.record(canon, None, errno.EACCES)
            raise SimError(errno.EACCES)
        if mode in (os.O_RDONLY, os.O_RDWR) and node.read is None:
            raise SimError(errno.EACCES)
        if node.holds is not None:
            self.state.open_handle(node.holds, node.exclusive)   # EBUSY for a busy VFIO group
        if mode != os.O_WRONLY and not canon.startswith(GPUSIM_DIR + "/"):
            self.state.count_read(canon)        # one open for reading = one sysfs read of the tools
        fh = next(self._next_fh)
        with self._handles_lock:
            self._handles[fh] = (node, canon)
        return fh

    def release(self, path, fh):
        with self._handles_lock:
            node, dummy = self._handles.pop(fh, (None, None))
            self._contents.pop(fh, None)
        if node is not None and node.holds is not None:
            self.state.close_handle(node.holds)
        return 0

    def _handle(self, path, fh):
        handle = self._handles.get(fh)
        return handle if handle is not None else (self._node(path), canonical(path))

    @staticmethod
    def _check_owner(node):
        if node.owner is not None and not node.owner.alive:
            raise SimError(errno.ENODEV, "the device of this attribute is gone")

    def read(self, path, size, offset, fh):
        """Content is made at the first read of an open file and served from there on (the kernel's
        seq_file does the same), so a file read in several chunks (state.json) is never torn."""
        node, dummy = self._handle(path, fh)
        self._check_owner(node)
        with self._handles_lock:
            content = self._contents.get(fh) if offset else None
        if content is None:
            content = node.read().encode()
            with self._handles_lock:
                if fh in self._handles:
                    self._contents[fh] = content
        return content[offset:offset + size]

    def write(self, path, data, offset, fh):
        node, canon = self._handle(path, fh)
        text = data.decode("utf-8", "replace")
        if canon.startswith(GPUSIM_DIR + "/"):
            node.write(text)
            return len(data)
        value = text[:-1] if text.endswith("\n") else text
        injected = self.state.take_failure(canon)
        if injected is not None:
            self.state.record(canon, value, injected)
            raise SimError(injected, "injected by fail-next")
        try:
            self._check_owner(node)
            node.write(text)
        except OSError as exc:
            self.state.record(canon, value, exc.errno)
            raise
        self.state.record(canon, value)
        return len(data)

    def truncate(self, path, length, fh=None):
        # `echo 1 > attr` opens with O_TRUNC; sysfs ignores the truncate.
        if self._node(path).write is None:
            raise SimError(errno.EACCES)
        return 0

    def create(self, path, mode, fi=None):
        raise SimError(errno.EACCES)

    def mkdir(self, path, mode):
        raise SimError(errno.EPERM)

    def unlink(self, path):
        raise SimError(errno.EPERM)

    def rmdir(self, path):
        raise SimError(errno.EPERM)

    def utimens(self, path, times=None):
        self._node(path)
        return 0

    def statfs(self, path):
        return {"f_bsize": 4096, "f_frsize": 4096, "f_namemax": 255}

    # ---- .gpusim files ---------------------------------------------------------------------------
    def log_text(self):
        with self.state.lock:
            return "".join(json.dumps(entry) + "\n" for entry in self.state.log)

    def control(self, text):
        """One command per write to .gpusim/ctl (see cli.py for the user-facing spelling)."""
        args = text.split()
        state = self.state
        command = " ".join(args[:2]) if args[:1] == ["driver"] else (args[0] if args else "")
        if command == "reboot" and len(args) == 1:
            state.reboot()
        elif command == "manager-restart" and len(args) == 1:
            state.restart_manager()
        elif command == "reset" and len(args) == 1:
            state.reset()
        elif command == "clear-log" and len(args) == 1:
            with state.lock:
                state.log.clear()
                state.reads.clear()
        elif command == "fail-next" and len(args) == 3:
            code = getattr(errno, args[2].upper(), None) if args[2].upper().startswith("E") else None
            if not isinstance(code, int):
                raise SimError(errno.EINVAL, "unknown errno name %r" % args[2])
            real = self.tree.resolve(args[1])
            with state.lock:
                state.fail_next[canonical(real if real is not None else args[1])] = code
        elif command == "driver unload" and len(args) == 2:
            state.unload_nvidia()
        elif command == "driver load" and len(args) in (2, 3):
            state.load_nvidia(args[2] if len(args) == 3 else None)
        elif command == "mixed" and len(args) == 3 and args[2] in ("0", "1"):
            state.set_mixed(args[1], args[2] == "1")
        elif command == "mig" and len(args) == 3 and args[2] in ("0", "1"):
            state.set_mig(args[1], args[2] == "1")
        elif (command == "gi-create" and len(args) in (4, 5) and args[2].isdigit() and args[3] in ("0", "1")
              and all(a.isdigit() for a in args[4:])):
            state.create_gi(args[1], int(args[2]), args[3] == "1", *[int(a) for a in args[4:]])
        elif command in ("gi-destroy", "ci-destroy", "ci-create") and len(args) == 3 and args[2].isdigit():
            {"gi-destroy": state.destroy_gi, "ci-destroy": state.destroy_ci,
             "ci-create": state.create_ci}[command](args[1], int(args[2]))
        elif command == "latency" and len(args) == 2 and args[1].isdigit():
            state.latency_ms = int(args[1])
        elif command == "block-timeout" and len(args) == 2 and args[1].replace(".", "", 1).isdigit():
            with state.lock:
                state.block_timeout = float(args[1])
        else:
            raise SimError(errno.EINVAL, "unknown control command %r" % text[:80])


def serve(state, root):
    """Mount `root` and serve until unmounted (blocks)."""
    mfusepy.FUSE(SimFS(state), root, **MOUNT_OPTIONS)
