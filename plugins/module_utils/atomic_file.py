# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Replace a file atomically: a reader (or a process killed with -9 mid-write) sees the old content or the
new, never a part. The one writer of every file this collection replaces: node files, the agent's status and
hand-over files, boot units, the DRA driver's CDI specs, metadata files and checkpoint, conformance reports.

How much survives a power loss is the caller's choice (`sync`):
- RENAME: temporary file + rename only; for files rewritten anyway after a reboot (CDI specs under /var/run,
  the status file, caches);
- FILE (default): the content is fsynced before the rename, so the new name never points at an empty file;
- DURABLE: FILE plus an fsync of the directory, so the rename itself survives (every DRA checkpoint record: what
  keeps a layout change off a prepared claim's vGPUs and what the kubelet was told).
"""

from __future__ import annotations

import contextlib
import os
import tempfile

RENAME, FILE, DURABLE = "rename", "file", "durable"


def write_file(path, content, mode=0o644, sync=FILE, owner=None):
    """Write `content` (str as UTF-8, or bytes) to `path` through a temporary file in the same directory
    (the directory is created when missing), with exactly `mode` (no umask) and, when given, `owner`
    (uid, gid); then rename it over `path`."""
    if sync not in (RENAME, FILE, DURABLE):
        raise ValueError("sync must be one of %s, %s, %s" % (RENAME, FILE, DURABLE))
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, mode=0o755, exist_ok=True)
    handle, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", dir=directory)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(content.encode("utf-8") if isinstance(content, str) else content)
            out.flush()
            os.fchmod(out.fileno(), mode)
            if owner is not None:
                os.fchown(out.fileno(), *owner)
            if sync != RENAME:
                os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if sync == DURABLE:
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
