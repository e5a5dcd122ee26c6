# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The agent's config file (CONFIG_FILE), usually a key of a mounted ConfigMap, re-read when it changes.

A ConfigMap volume is not a plain file: the kubelet writes `..<timestamp>/<key>`, points `..data`
at that directory and `<key>` at `..data/<key>`, and an update swaps `..data` with a rename
(test-environment 13). inotify on the file misses that, so `poll()` compares a cheap signature
(the directory's `..data` target and the file's inode, size and mtime) and, when it moved, the
content's digest: only a different content counts as a change. Polling costs two syscalls and
no sysfs access.

The document is parsed (JSON, else YAML) once per content (`document()`), whoever asks in a reconcile: the
layout's entries, the claim-time declaration, the hand-over to the boot unit all read the same parsed document.
"""

from __future__ import annotations

import hashlib
import os

from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout import vgpu_layout
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import claim_time_layout


class ConfigSource:
    def __init__(self, path):
        self.path = path
        self.signature = None
        self.text = None
        self.error = None
        self.digest = None
        self._parsed = None     # (digest, document, LayoutError or None) of the last parse
        self.poll()

    def _signature(self):
        try:
            data_link = os.readlink(os.path.join(os.path.dirname(os.path.abspath(self.path)), "..data"))
        except OSError:
            data_link = None
        try:
            st = os.stat(self.path)
        except OSError as exc:
            return (data_link, "missing", exc.errno)
        return (data_link, st.st_ino, st.st_size, st.st_mtime_ns)

    def poll(self):
        """True when the file's content changed since the last poll (or it appeared/vanished)."""
        signature = self._signature()
        if signature == self.signature:
            return False
        self.signature = signature
        try:
            with open(self.path, "rb") as handle:
                data = handle.read()
            self.text, self.error = data.decode("utf-8", "replace"), None
            digest = hashlib.sha256(data).hexdigest()
        except OSError as exc:
            self.text, self.error = None, "cannot read %s: %s" % (self.path, exc.strerror)
            digest = "error:" + self.error
        changed, self.digest = digest != self.digest, digest
        return changed

    def document(self):
        """The parsed document, parsed again only when the content changed; LayoutError (naming the file) when it
        cannot be read or parsed."""
        if self.error:
            raise vgpu_layout.LayoutError(self.error)
        if self._parsed is None or self._parsed[0] != self.digest:
            try:
                self._parsed = (self.digest, vgpu_layout.load_document(self.text, self.path), None)
            except vgpu_layout.LayoutError as exc:
                self._parsed = (self.digest, None, str(exc))
        if self._parsed[2] is not None:
            raise vgpu_layout.LayoutError(self._parsed[2])
        return self._parsed[1]

    def entries(self, selected):
        """[LayoutEntry] of config `selected`; LayoutError (naming the file) when broken or unknown."""
        return vgpu_layout.from_document(self.document(), selected, self.path)

    def claim_time(self):
        """The file's claim-time Declaration (node/engine/claim_time_layout.py; empty when it declares none)."""
        return claim_time_layout.declaration(self.document(), self.path)
