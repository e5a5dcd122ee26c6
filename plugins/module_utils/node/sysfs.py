# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Sysfs access with an injectable root: the one place that touches /sys.

Plain Python, standard library only, no Ansible import: the modules, the node CLI and the tests
all share it. Every OSError becomes a SysfsError naming the path and the errno, so callers can
tell EBUSY from EINVAL and users get one line naming the object.
"""

from __future__ import annotations

import errno as errno_mod
import os
import threading

from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError


class SysfsError(EngineError):
    """A sysfs operation failed. `path` is relative to the sysfs root, `errno` the kernel's answer."""

    def __init__(self, path, errno, op="read", detail=None):
        self.path = path
        self.errno = errno
        self.op = op
        reason = detail or (os.strerror(errno) if errno else "failed")
        name = errno_mod.errorcode.get(errno, str(errno)) if errno else ""
        super().__init__("%s %s: %s%s" % (op, path, reason, " (%s)" % name if name else ""))


class Sysfs:
    """Reads and writes below `root` (default /sys); paths are given relative to it.

    `writes` counts successful writes and `write_log` keeps (path, value) pairs, so callers can
    report exactly what an apply changed. Safe to share between threads (PFs are applied in parallel).
    """

    def __init__(self, root="/sys"):
        self.root = os.path.abspath(root)
        self.writes = 0
        self.write_log = []
        self._log_lock = threading.Lock()

    def path(self, rel):
        """Absolute path of `rel`, refusing anything that would leave the root (`..`, absolute)."""
        rel = str(rel)
        if rel.startswith("/") or "\x00" in rel:
            raise SysfsError(rel, errno_mod.EINVAL, "resolve", "path must be relative to the sysfs root")
        parts = [p for p in rel.split("/") if p not in ("", ".")]
        if ".." in parts:
            raise SysfsError(rel, errno_mod.EINVAL, "resolve", "'..' is not allowed in sysfs paths")
        return os.path.join(self.root, *parts) if parts else self.root

    def exists(self, rel):
        return os.path.exists(self.path(rel))

    def isdir(self, rel):
        return os.path.isdir(self.path(rel))

    def read(self, rel):
        """Contents with the trailing newline removed."""
        try:
            with open(self.path(rel), "r") as handle:
                return handle.read().rstrip("\n")
        except OSError as exc:
            raise SysfsError(rel, exc.errno, "read") from None

    def read_optional(self, rel, default=None):
        """Like read(), but a missing (or unreadable) attribute gives `default`."""
        try:
            return self.read(rel)
        except SysfsError as exc:
            if exc.errno in (errno_mod.ENOENT, errno_mod.ENOTDIR, errno_mod.EACCES, errno_mod.EPERM,
                             errno_mod.ENODEV, errno_mod.EINVAL, errno_mod.EIO):
                return default
            raise

    def read_int(self, rel, default=None):
        """Integer attribute; accepts decimal and 0x-prefixed hex as sysfs prints them."""
        text = self.read_optional(rel)
        if text is None or text.strip() == "":
            return default
        try:
            return int(text.strip(), 0)
        except ValueError:
            raise SysfsError(rel, errno_mod.EINVAL, "read", "not an integer: %r" % text[:40]) from None

    def listdir(self, rel=""):
        try:
            return sorted(os.listdir(self.path(rel)))
        except OSError as exc:
            if exc.errno in (errno_mod.ENOENT, errno_mod.ENOTDIR):
                return []
            raise SysfsError(rel, exc.errno, "list") from None

    def readlink(self, rel):
        """Target of a symlink, or None when `rel` is not a link."""
        try:
            return os.readlink(self.path(rel))
        except OSError as exc:
            if exc.errno in (errno_mod.ENOENT, errno_mod.EINVAL, errno_mod.ENOTDIR):
                return None
            raise SysfsError(rel, exc.errno, "readlink") from None

    def link_name(self, rel):
        """Last element of a symlink's target (a driver name, a PCI address, an IOMMU group)."""
        target = self.readlink(rel)
        return os.path.basename(target.rstrip("/")) if target else None

    def opendir(self, rel):
        """A SysfsDir for the directory `rel` (close it, or use it as a context manager)."""
        return SysfsDir(self, rel)

    def write(self, rel, value):
        """Write `value` in one write(2) call, as the kernel's store functions expect."""
        data = str(value).encode()
        try:
            fd = os.open(self.path(rel), os.O_WRONLY)
        except OSError as exc:
            raise SysfsError(rel, exc.errno, "write") from None
        try:
            written = os.write(fd, data)
        except OSError as exc:
            raise SysfsError(rel, exc.errno, "write %r to" % str(value)) from None
        finally:
            os.close(fd)
        if written != len(data):
            raise SysfsError(rel, errno_mod.EIO, "write", "short write (%d of %d bytes)" % (written, len(data)))
        with self._log_lock:
            self.writes += 1
            self.write_log.append((rel, str(value)))


class SysfsDir:
    """One directory below the root, opened once; names in it are then looked up relative to it (openat).

    Checking many entries of one directory (a PF's `virtfn*` links and the VFs behind them) this way
    does not walk the root path again for every entry: on sysfs the path walk is only CPU, through
    FUSE (gpusim: no dentry cache) each path component is a round trip to the server. Names are
    relative, without `..`, like Sysfs paths; a name may pass through a link in the directory
    (`virtfn3/nvidia` is the `nvidia` directory of the VF that virtfn3 points to).
    """

    def __init__(self, sysfs, rel):
        self.rel = rel
        path = sysfs.path(rel)
        try:
            self.fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as exc:
            raise SysfsError(rel, exc.errno, "open") from None

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def _name(self, name):
        name = str(name)
        parts = name.split("/")
        if not name or name.startswith("/") or "\x00" in name or ".." in parts:
            raise SysfsError("%s/%s" % (self.rel, name), errno_mod.EINVAL, "resolve",
                             "names must be relative to the directory, without '..'")
        return name

    def listdir(self):
        """Sorted entry names (os.listdir on the open directory: one listing, no per-entry lookups)."""
        try:
            return sorted(os.listdir(self.fd))
        except OSError as exc:
            raise SysfsError(self.rel, exc.errno, "list") from None

    def readlink(self, name):
        """Target of the link `name`, or None when it is not a link (or absent)."""
        try:
            return os.readlink(self._name(name), dir_fd=self.fd)
        except OSError as exc:
            if exc.errno in (errno_mod.ENOENT, errno_mod.EINVAL, errno_mod.ENOTDIR):
                return None
            raise SysfsError("%s/%s" % (self.rel, name), exc.errno, "readlink") from None

    def link_name(self, name):
        target = self.readlink(name)
        return os.path.basename(target.rstrip("/")) if target else None

    def isdir(self, name):
        """Whether `name` (links followed) is a directory; like os.path.isdir, False on any error.
        An O_PATH open: one lookup per component, no stat or open round trip of its own."""
        try:
            fd = os.open(self._name(name), os.O_PATH | os.O_DIRECTORY, dir_fd=self.fd)
        except OSError:
            return False
        os.close(fd)
        return True
