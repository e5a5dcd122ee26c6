# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which of the files a role installs on the node are missing or differ (read-only).

Lets the module that applies the layout also answer "are the boot files in place?" in the same
round trip, so a converged node costs no separate look (stat/find) per run. A file is up to date
when it exists as a regular file with the given SHA-1 of its content, the given mode, owned by
root:root (what the role installs); anything else, unreadable included, counts as outdated.
"""

from __future__ import annotations

import hashlib
import os
import stat

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


def is_current(entry):
    """Whether `entry` ({path, checksum, mode}) is installed as described."""
    path = entry.get("path")
    if not path or not os.path.isabs(str(path)):
        raise BootFileError("boot_files: %r is not an absolute path" % (path,))
    if not entry.get("checksum"):
        raise BootFileError("boot_files: %s has no checksum" % path)
    mode = _mode(entry)
    try:
        info = os.lstat(path)
        if not stat.S_ISREG(info.st_mode) or stat.S_IMODE(info.st_mode) != mode or (info.st_uid, info.st_gid) != (0, 0):
            return False
        return _sha1(path) == str(entry["checksum"]).lower()
    except OSError:
        return False


def outdated(entries):
    """Paths of `entries` that are missing or differ, in the given order."""
    return [str(entry["path"]) for entry in entries or [] if not is_current(entry)]
