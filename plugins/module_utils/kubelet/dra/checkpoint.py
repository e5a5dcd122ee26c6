# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The driver's record of prepared claims: `<plugin dir>/checkpoint.json`.

What makes Prepare and Unprepare idempotent and crash-safe, and what says which vGPUs prepared
claims hold (a layout change must not retype them). The model is NVIDIA's DRA driver
(cmd/gpu-kubelet-plugin/checkpoint.go): versioned, checksummed, per claim a state
PrepareStarted (recorded before the first file is written) or PrepareCompleted (after the last),
and the node's boot ID, since a reboot empties /var/run/cdi.

    {"version": 1, "checksum": "<sha256 of the canonical claims JSON>",
     "claims": {"<uid>": {"namespace", "name", "state", "bootID", "devices": [{"requests", "pool",
                 "device", "key", "typeID", "cdiIDs"}]}}}

The format is read in one place, node/holders/claim_holders.py (the node engine reads the holders too); this module
adds what only the driver does: recording claims and writing the file.

Every record, PrepareStarted included, is written atomically and durably (atomic_file.write_file DURABLE:
temporary file, fsync, rename, fsync of the directory), so a kill -9 or a power loss leaves the old or the new
checkpoint, never an empty or torn one: the record is what says a layout change must not retype the claim's vGPUs,
and the kubelet may have been told about it. A file that is empty, cut short or whose checksum does not match is
an error naming it and what to do (nothing is then prepared or unprepared: guessing could hand a held vGPU out).
"""

from __future__ import annotations

from ansible_collections.accelops.vgpu.plugins.module_utils.atomic_file import DURABLE, write_file
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import claim_holders
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders.claim_holders import VERSION

STARTED, COMPLETED = "PrepareStarted", "PrepareCompleted"


read_boot_id = claim_holders.read_boot_id     # the node layer reads it too (claim-time types restored this boot only)


class Checkpoint:
    """The prepared claims of one driver instance; `save()` after every change."""

    def __init__(self, plugin_dir, boot_id=None):
        self.path = claim_holders.checkpoint_path(plugin_dir)
        self.boot_id = boot_id
        self.claims = {}
        self.load()

    def load(self):
        self.claims = claim_holders.read_claims(self.path)
        return self

    def save(self):
        """Write the checkpoint atomically and durably (file and directory fsynced before the answer); the
        claims are encoded once, for the checksum and the file."""
        claims = claim_holders.canonical(self.claims)
        write_file(self.path, '{"checksum":"%s","claims":%s,"version":%d}\n' % (
            claim_holders.checksum(claims), claims, VERSION), mode=0o600, sync=DURABLE)

    def get(self, uid):
        return self.claims.get(uid)

    def this_boot(self, entry):
        """Whether a claim's record was written since the node last booted."""
        return bool(entry) and entry.get("bootID") == self.boot_id

    def completed_this_boot(self, uid):
        """Whether `uid` was fully prepared since the node last booted (its files are all there)."""
        entry = self.claims.get(uid)
        return self.this_boot(entry) and entry.get("state") == COMPLETED

    def set(self, uid, namespace, name, state, devices):
        self.claims[uid] = {"namespace": namespace, "name": name, "state": state, "bootID": self.boot_id,
                            "devices": devices}

    def drop(self, uid):
        return self.claims.pop(uid, None)

    def holders(self):
        return claim_holders.holders(self.claims)
