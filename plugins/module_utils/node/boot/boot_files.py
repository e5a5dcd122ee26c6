# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The boot persistence files on the node: which are missing or differ, and installing them.

Lets the module that applies the layout also own the files that re-apply it at boot, in the same
round trip, so a converged node costs no separate look (stat/find) per run and a cold one no file
transfers. A file is up to date when it exists as a regular file with the given SHA-1 of its
content, the given mode, owned by root:root; anything else, unreadable included, counts as outdated.

An entry is {path, mode} plus either `content` (bytes or text: installed when outdated), only
`checksum` (looked at, never written: a file someone else installs) or `remove` (a file that must not
stay, removed where it exists: the node agent's handover file when a play takes the node back). Installing writes a temporary
file in the target directory (mode, owner root:root, fsync) and renames it over the target, so a
reader sees the old file or the new one; missing parent directories are created 0755 root:root.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat

from ansible_collections.accelops.vgpu.plugins.module_utils.atomic_file import write_file
from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError

CHUNK = 1 << 16


class BootFileError(EngineError):
    """A file entry that cannot be checked (no absolute path, no checksum, a mode that is no octal)."""


def _sha1(path):
    digest = hashlib.sha1()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def _mode(entry):
    try:
        return int(str(entry["mode"]), 8)
    except (KeyError, TypeError, ValueError):
        raise BootFileError("boot_files: %s: mode %r is not an octal mode such as '0644'"
                            % (entry.get("path"), entry.get("mode"))) from None


def _content(entry):
    content = entry.get("content")
    return content.encode("utf-8") if isinstance(content, str) else content


def checksum_of(entry):
    """The expected SHA-1 (hex): of `content` when given, else `checksum`; validates the entry."""
    path = entry.get("path")
    if not path or not os.path.isabs(str(path)):
        raise BootFileError("boot_files: %r is not an absolute path" % (path,))
    _mode(entry)
    content = _content(entry)
    if content is not None:
        return hashlib.sha1(content).hexdigest()
    if not entry.get("checksum"):
        raise BootFileError("boot_files: %s has neither content nor a checksum" % path)
    return str(entry["checksum"]).lower()


def installed_checksum(entry):
    """SHA-1 of the installed file when it is a regular file with the entry's mode owned by
    root:root; None when missing or anything else (the file then counts as outdated)."""
    try:
        info = os.lstat(entry["path"])
        if not stat.S_ISREG(info.st_mode) or stat.S_IMODE(info.st_mode) != _mode(entry) or (info.st_uid, info.st_gid) != (0, 0):
            return None
        return _sha1(entry["path"])
    except OSError:
        return None


def validate(entries):
    """The expected checksum of every entry to install or look at, in order (entries to `remove` are only
    checked to name an absolute path that is no directory); raises BootFileError on the first bad one."""
    for entry in entries or []:
        if entry.get("remove"):
            _removable(entry)
    _once_each(entries)
    return [checksum_of(entry) for entry in _kept(entries)]


def validate_removal(entries):
    """What remove() checks before it removes anything (absolute paths, none a directory, each named once):
    the module asks it before the apply with state absent, so bad input writes nothing."""
    for entry in entries or []:
        _removable(entry)
    _once_each(entries)


def _once_each(entries):
    """A path that an entry writes or removes is named by no other entry (installed and removed in one run,
    or installed with two contents, it would change on every run); entries that only look may repeat."""
    seen, acting = set(), set()
    for entry in entries or []:
        path = os.path.normpath(str(entry.get("path")))
        acts = entry.get("remove") or _content(entry) is not None
        if path in acting or (acts and path in seen):
            raise BootFileError("boot_files: %s is named twice" % path)
        seen.add(path)
        if acts:
            acting.add(path)


def _kept(entries):
    """The entries that are installed or looked at (not removed)."""
    return [entry for entry in entries or [] if not entry.get("remove")]


def _removable(entry):
    path = entry.get("path")
    if not path or not os.path.isabs(str(path)):
        raise BootFileError("boot_files: %r is not an absolute path" % (path,))
    if os.path.isdir(path) and not os.path.islink(path):
        raise BootFileError("boot_files: %s is a directory, not a file to remove" % path)


def outdated(entries):
    """Paths of `entries` that are missing or differ, in the given order (every entry validated first)."""
    return install(entries, check_mode=True)["outdated"]


def _makedirs(directory):
    """Create `directory` and missing parents, each 0755 root:root (existing ones are left alone)."""
    if os.path.isdir(directory):
        return
    _makedirs(os.path.dirname(directory))
    try:
        os.mkdir(directory, 0o755)
    except FileExistsError:
        return
    os.chmod(directory, 0o755)  # mkdir's mode goes through the umask
    os.chown(directory, 0, 0)


def _write(entry, content):
    _makedirs(os.path.dirname(entry["path"]))
    write_file(entry["path"], content, _mode(entry), owner=(0, 0))


def install(entries, check_mode=False):
    """Bring the entries with `content` up to date; those with `checksum` are only looked at, those to
    `remove` left to remove().

    Returns {"outdated": paths that were missing or differed, "installed": paths written (in check
    mode: that would be), "diff": {"before": {path: sha1 or None}, "after": {...}}} for the outdated
    ones. Every entry is validated before the first write; a write that fails raises BootFileError
    naming the file (files written before it stay written: each is complete on its own).
    """
    entries = _kept(entries)
    wanted = validate(entries)
    result = {"outdated": [], "installed": [], "diff": {"before": {}, "after": {}}}
    for entry, checksum in zip(entries, wanted):
        have = installed_checksum(entry)
        if have == checksum:
            continue
        path = str(entry["path"])
        result["outdated"].append(path)
        result["diff"]["before"][path] = have
        if _content(entry) is None:
            result["diff"]["after"][path] = have
            continue
        result["diff"]["after"][path] = checksum
        result["installed"].append(path)
        if check_mode:
            continue
        try:
            _write(entry, _content(entry))
        except OSError as err:
            hint = " (only root can install files owned by root:root)" if err.errno == errno.EPERM else ""
            raise BootFileError("boot_files: cannot install %s: %s%s" % (path, err.strerror or err, hint)) from None
    return result


def remove(entries, check_mode=False):
    """Remove the entries' files (state absent); an entry with `own_directory` also takes its directory
    along once that is empty. Returns {"removed": paths (in check mode: that would be), "diff": ...}.

    Only regular files and links are removed: a directory where a boot file should be is an error
    naming it, before anything is removed.
    """
    entries = list(entries or [])
    validate_removal(entries)
    result = {"removed": [], "diff": {"before": {}, "after": {}}}
    for entry in entries:
        path = str(entry["path"])
        if not os.path.lexists(path):
            continue
        result["removed"].append(path)
        result["diff"]["before"][path] = _sha1(path) if os.path.isfile(path) else "present"
        result["diff"]["after"][path] = None
        if check_mode:
            continue
        try:
            os.unlink(path)
            if entry.get("own_directory"):
                with contextlib.suppress(OSError):  # not empty (someone else's files): kept
                    os.rmdir(os.path.dirname(path))
        except OSError as err:
            raise BootFileError("boot_files: cannot remove %s: %s" % (path, err.strerror or err)) from None
    return result
