# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which vGPUs prepared DRA claims hold: the node layer's reading of the DRA driver's checkpoint.

The driver (kubelet/dra/checkpoint.py, in the agent) writes `<kubelet dir>/plugins/vgpu.accelops.io/checkpoint.json`;
the node engine, the CLI, the boot unit and the modules only read it, through this module, so the node layer never
imports the kubelet layer above it. The format, the checksum and the holder names live here, once:

    {"version": 1, "checksum": "<sha256 of the canonical claims JSON>",
     "claims": {"<uid>": {"namespace", "name", "state", "bootID", "devices": [{..., "key", ...}]}}}

A checkpoint that cannot be read or trusted is an error naming the file: unknown is held.
"""

from __future__ import annotations

import hashlib
import json
import os

from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError

DRIVER = "vgpu.accelops.io"             # this collection's DRA driver name
DEFAULT_KUBELET_DIR = "/var/lib/kubelet"   # the kubelet's --root-dir default
FILE_NAME = "checkpoint.json"
VERSION = 1
HOLDER = "DRA claim %s/%s"      # how a prepared claim reads in the safety checks' messages
# what to do with a checkpoint that cannot be trusted (it alone says which vGPUs prepared claims hold)
DAMAGED_ADVICE = ("it cannot say which vGPUs prepared claims hold; drain the node's pods that use vGPU claims, "
                  "then move the file away and restart the agent")


class CheckpointError(EngineError):
    """The checkpoint cannot be read or trusted; the message names the file."""


def canonical(claims):
    return json.dumps(claims, sort_keys=True, separators=(",", ":"))


def checksum(canonical_claims):
    return hashlib.sha256(canonical_claims.encode()).hexdigest()


def checkpoint_path(plugin_dir):
    return os.path.join(plugin_dir, FILE_NAME)


def plugin_dir(kubelet_dir=DEFAULT_KUBELET_DIR, driver=DRIVER):
    """`<kubelet dir>/plugins/<driver>`: the driver's service socket and checkpoint (kubelet/paths.py agrees)."""
    return os.path.join(kubelet_dir, "plugins", driver)


def read_claims(path):
    """The verified `claims` of the checkpoint at `path`; {} when there is none."""
    try:
        with open(path) as handle:
            doc = json.load(handle)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise CheckpointError("checkpoint %s cannot be read: %s" % (path, exc.strerror or exc)) from None
    except ValueError:
        # empty or torn: written without fsync before a power loss (drivers before 2026-11), or damaged
        raise CheckpointError("checkpoint %s is empty or cut short (a power loss or a damaged disk): %s"
                              % (path, DAMAGED_ADVICE)) from None
    if not isinstance(doc, dict) or doc.get("version") != VERSION or not isinstance(doc.get("claims"), dict):
        raise CheckpointError("checkpoint %s: not a version %d checkpoint" % (path, VERSION))
    if doc.get("checksum") != checksum(canonical(doc["claims"])):
        raise CheckpointError("checkpoint %s: checksum mismatch (edited or damaged): %s" % (path, DAMAGED_ADVICE))
    for uid, entry in sorted(doc["claims"].items()):
        _check_claim(path, uid, entry)
    return doc["claims"]


def _check_claim(path, uid, entry):
    """A checksum-valid claim must still have what the readers use (namespace, name, each device's key):
    a file written by another version or by hand is an error naming it, never a traceback."""
    if not isinstance(entry, dict):
        raise CheckpointError("checkpoint %s: claim %s is not an object" % (path, uid))
    for field in ("namespace", "name"):
        if not isinstance(entry.get(field), str):
            raise CheckpointError("checkpoint %s: claim %s has no %s" % (path, uid, field))
    devices = entry.get("devices") or []
    if not isinstance(devices, list):
        raise CheckpointError("checkpoint %s: claim %s: devices is not a list" % (path, uid))
    for index, device in enumerate(devices):
        if not isinstance(device, dict) or not isinstance(device.get("key"), str) or not device["key"]:
            raise CheckpointError("checkpoint %s: claim %s (%s/%s): device %d has no key (the VF address or mdev "
                                  "UUID); unknown is held, fix or move the file only when no pod on this node uses "
                                  "a vGPU claim" % (path, uid, entry["namespace"], entry["name"], index))


def holders(claims):
    """{device key (VF address or mdev UUID): ["DRA claim ns/name", ...]} of every recorded claim,
    prepared or half-way (a half-way claim may be completed by the kubelet's retry)."""
    held = {}
    for entry in claims.values():
        for device in entry.get("devices") or ():
            held.setdefault(device["key"], []).append(HOLDER % (entry["namespace"], entry["name"]))
    return {key: sorted(set(names)) for key, names in held.items()}


def held_whole(claims):
    """{PF address: (claim holder name, the device's `whole` record)} of every claim holding a GPU whole (issue 42:
    kubelet/dra/whole_gpu.py, node/engine/whole_gpu.py). A PF in it is on vfio-pci (or on its way there or back)
    because OUR Prepare moved it, not because an operator reserved it: the one reading every path uses to tell
    them apart (the reconcile, vgpu_facts, sriov_vfs: node/holders/pf_driver.py)."""
    found = {}
    for entry in (claims or {}).values():
        for device in entry.get("devices") or ():
            if isinstance(device.get("whole"), dict):
                found[device["key"]] = (HOLDER % (entry["namespace"], entry["name"]), device["whole"])
    return found


def held_whole_of(kubelet_dir=DEFAULT_KUBELET_DIR, driver=DRIVER):
    """held_whole() of the checkpoint under `kubelet_dir`; none there: {}. A damaged checkpoint raises (unknown is
    held)."""
    return held_whole(read_claims(checkpoint_path(plugin_dir(kubelet_dir or DEFAULT_KUBELET_DIR, driver))))


def read_boot_id(proc_root="/proc"):
    """The running kernel's boot ID (`<proc_root>/sys/kernel/random/boot_id`), recorded with each prepared claim;
    None when it cannot be read."""
    try:
        with open(os.path.join(proc_root, "sys/kernel/random/boot_id")) as handle:
            return handle.read().strip() or None
    except OSError:
        return None


ANY_BOOT = object()


def claimed_types(claims, boot_id=ANY_BOOT):
    """{device key: vGPU type ID} the claims were prepared with (a device recorded twice with two IDs: left out,
    nobody can say which one to restore). `boot_id` given: only the claims recorded with that boot ID, as the
    driver tells a claim prepared this boot (kubelet/dra/checkpoint.py completed_this_boot): a claim of an earlier
    boot is prepared again by the kubelet, maybe on another VF or GPU, so its type is nobody's to restore."""
    types, conflicting = {}, set()
    for entry in claims.values():
        if boot_id is not ANY_BOOT and entry.get("bootID") != boot_id:
            continue
        for device in entry.get("devices") or ():
            type_id = device.get("typeID")
            if not isinstance(type_id, int) or isinstance(type_id, bool):
                continue
            if types.setdefault(device["key"], type_id) != type_id:
                conflicting.add(device["key"])
    return {key: type_id for key, type_id in types.items() if key not in conflicting}


def placed(claims):
    """The device keys (VFs) of MIG-backed claim-time records (their `mig` part, kubelet/dra/claim_time_mig.py): the
    driver chose their GPU instance when the type was written, a write without Prepare's checks may pick another."""
    return {device["key"] for entry in claims.values() for device in entry.get("devices") or ()
            if isinstance(device.get("mig"), dict)}


def is_claim_holder(holder):
    """Whether a holder description (inuse.held_devices) is a prepared claim, not a process."""
    return isinstance(holder, str) and holder.startswith(HOLDER.split("%", 1)[0])


def holders_of(driver_dir):
    """The holders recorded in the checkpoint of the driver directory `driver_dir`; no checkpoint: {}."""
    return holders(read_claims(checkpoint_path(driver_dir)))


def claimed_types_of(kubelet_dir=DEFAULT_KUBELET_DIR, driver=DRIVER):
    """claimed_types() of the checkpoint under `kubelet_dir`; none there: {}."""
    return claimed_types(read_claims(checkpoint_path(plugin_dir(kubelet_dir or DEFAULT_KUBELET_DIR, driver))))


def holders_source(kubelet_dir=DEFAULT_KUBELET_DIR, driver=DRIVER):
    """An inuse.held_devices() source: the vGPUs of the claims prepared under `kubelet_dir`, read at
    every call (the driver may run in another process). A damaged checkpoint raises: unknown is held."""
    directory = plugin_dir(kubelet_dir or DEFAULT_KUBELET_DIR, driver)
    return lambda: holders_of(directory)
