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

Written atomically and durably (atomic_file.write_file DURABLE: temporary file, fsync, rename, fsync of the directory), so
a kill -9 leaves the old or the new checkpoint, never a mix. A file whose checksum does not match
is an error naming it (nothing is then prepared or unprepared: guessing could hand a held vGPU out).
"""

from __future__ import annotations

import hashlib
import json
import os

from ansible_collections.accelops.vgpu.plugins.module_utils.atomic_file import DURABLE, RENAME, write_file
from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.devices import DRIVER
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.paths import DEFAULT_KUBELET_DIR, KubeletPaths

FILE_NAME = "checkpoint.json"
HOLDER = "DRA claim %s/%s"      # how a prepared claim reads in the safety checks' messages
VERSION = 1
STARTED, COMPLETED = "PrepareStarted", "PrepareCompleted"


class CheckpointError(EngineError):
    """The checkpoint cannot be read or trusted; the message names the file."""


def _canonical(claims):
    return json.dumps(claims, sort_keys=True, separators=(",", ":"))


def _checksum(claims):
    return hashlib.sha256(_canonical(claims).encode()).hexdigest()


def read_boot_id(proc_root="/proc"):
    try:
        with open(os.path.join(proc_root, "sys/kernel/random/boot_id")) as handle:
            return handle.read().strip() or None
    except OSError:
        return None


class Checkpoint:
    """The prepared claims of one driver instance; `save()` after every change."""

    def __init__(self, plugin_dir, boot_id=None):
        self.path = os.path.join(plugin_dir, FILE_NAME)
        self.boot_id = boot_id
        self.claims = {}
        self.load()

    def load(self):
        try:
            with open(self.path) as handle:
                doc = json.load(handle)
        except FileNotFoundError:
            self.claims = {}
            return self
        except (OSError, ValueError) as exc:
            raise CheckpointError("checkpoint %s cannot be read: %s" % (self.path, exc)) from None
        if not isinstance(doc, dict) or doc.get("version") != VERSION or not isinstance(doc.get("claims"), dict):
            raise CheckpointError("checkpoint %s: not a version %d checkpoint" % (self.path, VERSION))
        if doc.get("checksum") != _checksum(doc["claims"]):
            raise CheckpointError("checkpoint %s: checksum mismatch (edited or damaged); move it away only when "
                                  "no pod on this node uses a vGPU claim" % self.path)
        self.claims = doc["claims"]
        return self

    def save(self, durable=True):
        """Write the checkpoint (durable: fsync, for the records that must survive a power loss); the claims
        are encoded once, for the checksum and the file. Atomic either way: a kill -9 loses nothing written."""
        claims = _canonical(self.claims)
        digest = hashlib.sha256(claims.encode()).hexdigest()
        write_file(self.path, '{"checksum":"%s","claims":%s,"version":%d}\n' % (digest, claims, VERSION),
                   mode=0o600, sync=DURABLE if durable else RENAME)

    def get(self, uid):
        return self.claims.get(uid)

    def completed_this_boot(self, uid):
        """Whether `uid` was fully prepared since the node last booted (its files are all there)."""
        entry = self.claims.get(uid)
        return bool(entry) and entry.get("state") == COMPLETED and entry.get("bootID") == self.boot_id

    def set(self, uid, namespace, name, state, devices):
        self.claims[uid] = {"namespace": namespace, "name": name, "state": state, "bootID": self.boot_id,
                            "devices": devices}

    def drop(self, uid):
        return self.claims.pop(uid, None)

    def holders(self):
        """{device key (VF address or mdev UUID): ["DRA claim ns/name", ...]} of every recorded claim,
        prepared or half-way (a half-way claim may be completed by the kubelet's retry)."""
        held = {}
        for entry in self.claims.values():
            for device in entry.get("devices") or ():
                held.setdefault(device["key"], []).append(HOLDER % (entry["namespace"], entry["name"]))
        return {key: sorted(set(names)) for key, names in held.items()}


def holders_of(plugin_dir):
    """Checkpoint(plugin_dir).holders() for any process (the CLI, the boot unit, another agent);
    no checkpoint: {}."""
    return Checkpoint(plugin_dir).holders()


def holders_source(kubelet_dir=DEFAULT_KUBELET_DIR, driver=DRIVER):
    """An inuse.held_devices() source: the vGPUs of the claims prepared under `kubelet_dir`, read at
    every call (the driver may run in another process). A damaged checkpoint raises: unknown is held."""
    plugin_dir = KubeletPaths(kubelet_dir).plugin_dir(driver)
    return lambda: holders_of(plugin_dir)
