# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Sysfs access with an injectable root: the one place that touches /sys.

Plain Python, standard library only, no Ansible import: the modules, the node CLI and the tests
all share it. Every OSError becomes a SysfsError naming the path and the errno, so callers can
tell EBUSY from EINVAL and users get one line naming the object.
"""

from __future__ import annotations

import contextlib
import errno as errno_mod
import os
import stat
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
        self._walks = None          # the WalkCache of the current walk_cache() block, if any
        self._walk_depth = 0

    @contextlib.contextmanager
    def walk_cache(self):
        """A block (one apply) in which PCI device paths are walked from their bus's directory.

        `bus/pci/devices/<address>/<name>` is then looked up relative to an open descriptor of the directory the
        kernel put that bus's devices in (learned once per bus from one device's link), not through the link and
        the whole path again: on a node that is less path walking per operation, on gpusim (no dentry cache)
        a few FUSE round trips instead of a dozen. Answers are the same as without it (a name that is not where
        its bus's devices are is looked up by its full path). Re-entrant; descriptors are closed at the end."""
        with self._log_lock:
            if self._walk_depth == 0:
                self._walks = WalkCache(self)
            self._walk_depth += 1
        try:
            yield self._walks
        finally:
            with self._log_lock:
                self._walk_depth -= 1
                if self._walk_depth == 0:
                    walks, self._walks = self._walks, None
                    walks.close()

    def cached_dir(self, path):
        """An open descriptor of the absolute directory `path` for lookups relative to it, inside a
        walk_cache() block (kept until its end); None outside one or when it cannot be opened."""
        walks = self._walks
        return walks.directory(path) if walks is not None else None

    def _at(self, rel, op):
        """op(name, dir_fd) for `rel`: relative to its bus's directory inside a walk_cache() block, else
        op(absolute path, None). A name missing there is looked up by its full path only when its device is
        missing there too (the device is elsewhere, or was re-created), so a missing attribute costs no more."""
        path = self.path(rel)
        walks = self._walks
        found = walks.locate(rel) if walks is not None else None
        if found is not None:
            fd, device, name = found
            try:
                return op(name, fd)
            except FileNotFoundError:
                if walks.has(fd, device):
                    raise
        return op(path, None)

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
        return self._stat_mode(rel) is not None

    def isdir(self, rel):
        mode = self._stat_mode(rel)
        return mode is not None and stat.S_ISDIR(mode)

    def _stat_mode(self, rel):
        """st_mode of `rel` (links followed), None where os.path.exists would say False."""
        try:
            return self._at(rel, lambda name, dir_fd: os.stat(name, dir_fd=dir_fd).st_mode)
        except (OSError, ValueError):
            return None

    def read(self, rel):
        """Contents with the trailing newline removed."""
        def read(name, dir_fd):
            return _read_text(os.open(name, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0), dir_fd=dir_fd))
        try:
            return self._at(rel, read)
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
            return sorted(self._at(rel, _listdir))
        except OSError as exc:
            if exc.errno in (errno_mod.ENOENT, errno_mod.ENOTDIR):
                return []
            raise SysfsError(rel, exc.errno, "list") from None

    def readlink(self, rel):
        """Target of a symlink, or None when `rel` is not a link."""
        try:
            return self._at(rel, lambda name, dir_fd: os.readlink(name, dir_fd=dir_fd))
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
            fd = self._at(rel, lambda name, dir_fd: os.open(name, os.O_WRONLY, dir_fd=dir_fd))
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


READ_SIZE = 65536


def _read_text(fd):
    """The text of the open file `fd` (closed here) without its trailing newlines, in one read() where it is
    shorter than READ_SIZE (a sysfs attribute is at most a page): a short read is the end of a sysfs attribute,
    a regular file and a FUSE file alike. Not open(): its buffered text file also asks fstat() and isatty() and
    reads again for the end, on gpusim's FUSE tree (no attribute cache) each a round trip to the simulator
    (a read 0.7-1.0 -> 0.5-0.7 ms there)."""
    try:
        chunks = [os.read(fd, READ_SIZE)]
        while len(chunks[-1]) == READ_SIZE:
            chunks.append(os.read(fd, READ_SIZE))
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", "surrogateescape").rstrip("\n")


def _listdir(name, dir_fd):
    if dir_fd is None:
        return os.listdir(name)
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=dir_fd)
    try:
        return os.listdir(fd)
    finally:
        os.close(fd)


class WalkCache:
    """The open directories of one Sysfs.walk_cache() block: each PCI bus's device directory (the parent the
    kernel gives every device on that bus, pci_device_add: dev.parent = bus->bridge), learned from the first
    device of the bus that is looked up, and absolute directories asked for by cached_dir()."""

    PREFIX = "bus/pci/devices/"

    def __init__(self, sysfs):
        self.sysfs = sysfs
        self._lock = threading.Lock()
        self._buses = {}    # "<domain>:<bus>" -> fd of its devices' directory, or None (not learnable)
        self._dirs = {}     # absolute path -> fd or None

    def locate(self, rel):
        """(bus directory fd, device, name below it) for `bus/pci/devices/<device>/<attribute...>`, else None."""
        if not rel.startswith(self.PREFIX):
            return None
        parts = [p for p in rel[len(self.PREFIX):].split("/") if p not in ("", ".")]
        if len(parts) < 2 or parts[0].count(":") != 2:
            return None     # the bus link itself, or not a PCI address
        device = parts[0]
        bus = device.rsplit(":", 1)[0]
        with self._lock:
            if bus not in self._buses:
                learned = self._learn(device)
                if learned is False:
                    return None     # this device has no link (yet): another one of its bus may teach it
                self._buses[bus] = learned
            fd = self._buses[bus]
        return (fd, device, "/".join(parts)) if fd is not None else None

    def _learn(self, device):
        """The directory the kernel's link `bus/pci/devices/<device>` points into, opened, once the device found
        below it is the one the full path reaches (same st_dev/st_ino: one stat each, once per bus); None where it
        cannot be used (full paths then, for the whole bus), False where the device has no readable link."""
        try:
            target = os.readlink(self.sysfs.path(self.PREFIX + device))
        except OSError as exc:
            return False if exc.errno == errno_mod.ENOENT else None
        resolved = os.path.normpath(os.path.join(self.PREFIX.rstrip("/"), target))
        if os.path.isabs(target) or resolved.startswith("..") or os.path.basename(resolved) != device:
            return None
        fd = self._open(self.sysfs.path(os.path.dirname(resolved)))
        if fd is not None and not self._same(fd, device):
            os.close(fd)    # the link's text names another directory than the one it reaches (a linked `bus`)
            return None
        return fd

    def _same(self, fd, device):
        """Whether `device` below `fd` is the directory the full path through the bus link reaches."""
        try:
            below = os.stat(device, dir_fd=fd)
            linked = os.stat(self.sysfs.path(self.PREFIX + device))
        except OSError:
            return False
        return (below.st_dev, below.st_ino) == (linked.st_dev, linked.st_ino)

    def has(self, fd, device):
        """Whether the device's directory is below `fd` (an attribute missing there is missing)."""
        try:
            os.close(os.open(device, os.O_PATH | os.O_DIRECTORY, dir_fd=fd))
        except OSError:
            return False
        return True

    def directory(self, path):
        with self._lock:
            if path not in self._dirs:
                self._dirs[path] = self._open(path)
            return self._dirs[path]

    @staticmethod
    def _open(path):
        try:
            return os.open(path, os.O_PATH | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            return None

    def close(self):
        with self._lock:
            for fd in list(self._buses.values()) + list(self._dirs.values()):
                if fd is not None:
                    os.close(fd)
            self._buses, self._dirs = {}, {}


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
