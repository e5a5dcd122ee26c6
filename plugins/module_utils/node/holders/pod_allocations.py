# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which vGPUs the kubelet allocated to pods through the device plugin: the node layer's reading of the
allocation record (standard library only).

Between the kubelet's Allocate and QEMU opening the VF (image pull, volume attach: seconds to minutes) no process
holds the VF, so the /proc scan (node/holders/inuse.py) sees it free. The device plugin (kubelet/pod_resources.py, in the
agent) therefore records every device it hands out, durably, BEFORE it answers Allocate, in two files of
`<kubelet dir>/plugins/accelops-vgpu-device-plugin/` (not device-plugins/: the kubelet empties that one at start):

- `allocations.journal`, what Allocate appends: one JSON line per device, {"id", "resource", "allocatedAt" (unix
  s), "sum" (sha256 of the other fields)}, then fdatasync (one flush on the Allocate path, no rename). A last line
  without its newline is a write cut short: its Allocate never answered, so it is ignored; any other bad line is
  damage (an error naming the file and line);
- `allocations.json`, the snapshot the reconcile writes (atomic, file and directory fsynced), after which the
  journal is emptied (a crash between the two leaves lines the snapshot already has: same resource and
  allocatedAt, they keep the snapshot's entry and its pod): {"version": 1, "checksum": "<sha256 of the canonical
  devices JSON>", "devices": {"<VF address or mdev UUID>": {"resource", "allocatedAt", "pod": "<namespace>/<name>"
  once the kubelet lists it}}}.

The record is the snapshot with the journal's lines on top. Its writers are separate processes (an agent's device
plugin appends, an agent's reconcile rewrites; two agents overlap during a rolled DaemonSet), so each holds an
exclusive flock on `allocations.lock` (same directory) while it writes: the appender for its lines and their flush,
the rewriter from its read of the record to its emptied journal, so an Allocate can never land between the two
and be lost. Both wait a bounded time (APPEND_WAIT, REWRITE_WAIT) and fail naming the file when the lock stays
held. The engine also takes it, read-only, around each VF's re-check and type write (`vf_write_lock`), and an
Allocate checks the vGPU's current type under it before its line (`append(check=...)`): an Allocate lands before
the re-check or sees the new type, never between (issue 40.6). Readers take no lock (the directory may be read-only
to them): a read that a rewrite overlapped (the snapshot replaced while the journal was read) is read again. At
every reconcile the agent drops the devices no live pod holds any more, as the kubelet's PodResources API v1 says
(a device allocated moments ago and never listed is kept: the kubelet lists it only after Allocate returned;
during a kubelet restart every device is kept). Fail closed: when PodResources cannot be read nothing is dropped,
and a record that cannot be read or trusted is an error naming the file (never "nothing held"). The node engine,
the CLI, the modules, the boot unit and the manager image read it through `holders_source`
(node/holders/kubelet_holders.py gathers every kubelet source).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import time

from ansible_collections.accelops.vgpu.plugins.module_utils.atomic_file import DURABLE, write_file
from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import claim_holders
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders.claim_holders import DEFAULT_KUBELET_DIR

DIRECTORY = "accelops-vgpu-device-plugin"  # under <kubelet dir>/plugins/
FILE_NAME = "allocations.json"
JOURNAL_NAME = "allocations.journal"
LOCK_NAME = "allocations.lock"
# seconds an Allocate waits for a rewrite (which holds the lock for a read and two fsyncs): during a rollout two agents
# overlap, and on a slow disk the other's rewrite can take seconds; the kubelet does not retry a failed Allocate (the
# VMI fails), so the wait is long
APPEND_WAIT = 10.0
REWRITE_WAIT = 5.0   # seconds a reconcile waits for appenders
READ_TRIES = 5       # reads a rewrite overlapped before the reader gives up (an error naming the file)
VERSION = 1
HOLDER = "pod %s (device plugin, %s)"                        # a device the kubelet lists for a live pod
HOLDER_PENDING = "a pod not listed yet (device plugin, %s)"  # allocated, not (yet) in PodResources


class AllocationRecordError(EngineError):
    """The allocation record cannot be read or trusted; the message names the file."""


def record_path(kubelet_dir=DEFAULT_KUBELET_DIR):
    return os.path.join(kubelet_dir or DEFAULT_KUBELET_DIR, "plugins", DIRECTORY, FILE_NAME)


def _checksum(devices):
    """The DRA checkpoint's checksum (sha256 of the canonical JSON), over `devices`."""
    return claim_holders.checksum(claim_holders.canonical(devices))


def _valid(devices):
    return isinstance(devices, dict) and all(
        isinstance(entry, dict) and isinstance(entry.get("resource"), str) for entry in devices.values())


def journal_path(path):
    """The journal beside the snapshot `path`."""
    return os.path.join(os.path.dirname(path), JOURNAL_NAME)


def _line_sum(entry):
    return _checksum(dict((k, entry.get(k)) for k in ("id", "resource", "allocatedAt")))


def _read_journal(path):
    """{device: entry} of the journal's complete lines, in order; [] when there is none."""
    try:
        with open(path, "rb") as handle:
            lines = handle.read().split(b"\n")
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise AllocationRecordError("device plugin allocation journal %s cannot be read: %s" % (path, exc)) from None
    found = {}
    for number, line in enumerate(lines[:-1], 1):    # lines[-1]: after the last newline, a cut write or b""
        try:
            entry = json.loads(line)
            valid = isinstance(entry, dict) and entry.get("sum") == _line_sum(entry) and isinstance(entry["id"], str) \
                and isinstance(entry.get("resource"), str)
        except (ValueError, KeyError):
            valid = False
        if not valid:
            raise AllocationRecordError("device plugin allocation journal %s: line %d is damaged; move it away only "
                                        "when no pod on this node uses a vGPU resource" % (path, number))
        found[entry["id"]] = {"resource": entry["resource"], "allocatedAt": entry["allocatedAt"]}
    return found


def lock_path(path):
    """The lock file beside the snapshot `path`."""
    return os.path.join(os.path.dirname(path), LOCK_NAME)


def create_lock(path):
    """Make the lock file beside the snapshot `path` (and its directory): the device plugin does so before it serves
    anything, so that a VF writer (`vf_write_lock`) that finds no lock file knows no Allocate can be under way."""
    lock = lock_path(path)
    os.makedirs(os.path.dirname(lock), mode=0o755, exist_ok=True)
    os.close(os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))
    return lock


def _flock(handle, lock, wait):
    deadline, pause = time.monotonic() + wait, 0.0005
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise OSError(errno.EAGAIN, "held by another writer for %.1f s" % wait, lock) from None
            time.sleep(pause)
            pause = min(pause * 2, 0.01)


@contextlib.contextmanager
def locked(path, wait):
    """Hold the record's exclusive flock (`allocations.lock` beside the snapshot `path`), waiting at most `wait`
    seconds for another writer; OSError (EAGAIN, naming the lock file) when it stays held."""
    lock = create_lock(path)
    handle = os.open(lock, os.O_RDWR | os.O_CLOEXEC)
    try:
        _flock(handle, lock, wait)
        yield
    finally:
        os.close(handle)    # the lock goes with the last descriptor of this open


@contextlib.contextmanager
def vf_write_lock(path, wait=None):
    """The record's flock for a VF's re-check and type write (vgpu_apply), so that no Allocate lands between the two:
    an Allocate takes the same lock around its type check and its journal line (`append`). Opened read-only (flock
    needs no write access; the engine may see the kubelet directory read-only) and never created: no lock file means
    no device plugin ever started here (it makes the file before serving, `create_lock`). OSError after `wait`."""
    lock = lock_path(path)
    try:
        handle = os.open(lock, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        yield
        return
    try:
        _flock(handle, lock, REWRITE_WAIT if wait is None else wait)
        yield
    finally:
        os.close(handle)


def _identity(path):
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return None
    return (info.st_ino, info.st_mtime_ns, info.st_size)


def read(path):
    """The verified devices of the record whose snapshot is `path` (the journal's on top); {} when there is none.
    Lock-free: a read a rewrite overlapped (the old snapshot, then the journal the rewrite emptied) is read again,
    and so is one that found damage: a writer repairing a cut line or emptying the journal while this read copied
    it shows a spliced line for a moment. Damage still there after READ_TRIES reads is the error."""
    damaged = None
    for dummy in range(READ_TRIES):
        before = _identity(path)
        try:
            devices = _read_once(path)
        except AllocationRecordError as exc:
            damaged = exc
            time.sleep(0.01)
            continue
        if _identity(path) == before:
            return devices
        damaged = None
    if damaged is not None:
        raise damaged
    raise AllocationRecordError("device plugin allocation record %s: rewritten during %d reads in a row"
                                % (path, READ_TRIES))


def _read_once(path):
    try:
        with open(path) as handle:
            doc = json.load(handle)
    except FileNotFoundError:
        doc = {"version": VERSION, "devices": {}, "checksum": _checksum({})}
    except (OSError, ValueError) as exc:
        raise AllocationRecordError("device plugin allocation record %s cannot be read: %s" % (path, exc)) from None
    if not isinstance(doc, dict) or doc.get("version") != VERSION or not _valid(doc.get("devices")):
        raise AllocationRecordError("device plugin allocation record %s: not a version %d record" % (path, VERSION))
    if doc.get("checksum") != _checksum(doc["devices"]):
        raise AllocationRecordError("device plugin allocation record %s: checksum mismatch (edited or damaged); "
                                    "move it away only when no pod on this node uses a vGPU resource" % path)
    devices = doc["devices"]
    for device_id, entry in _read_journal(journal_path(path)).items():
        # a line the snapshot already holds (a crash between its rename and the journal's truncation: `write`) keeps
        # the snapshot's entry, which names the pod; a newer Allocate of the device replaces it
        if _replayed(devices.get(device_id), entry):
            continue
        devices[device_id] = entry
    return devices


def _replayed(recorded, line):
    return recorded is not None and all(recorded.get(k) == line[k] for k in ("resource", "allocatedAt"))


def append(path, resource, ids, allocated_at, wait=None, check=None):
    """Add `ids` of `resource` to the record whose snapshot is `path`: journal lines, flushed (fdatasync) before
    returning, under the record's lock (at most `wait` seconds waited for a rewrite: OSError); the directory is
    synced too when the journal is new. `check()`, called under the lock before anything is written, may raise to
    refuse (the Allocate's type check: a reconcile retypes a VF only under the same lock, `vf_write_lock`)."""
    journal = journal_path(path)
    lines = []
    for device_id in ids:
        entry = {"id": device_id, "resource": resource, "allocatedAt": allocated_at}
        entry["sum"] = _line_sum(entry)
        lines.append(json.dumps(entry, sort_keys=True) + "\n")
    with locked(path, APPEND_WAIT if wait is None else wait):
        if check is not None:
            check()
        new = not os.path.exists(journal)
        handle = os.open(journal, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            _drop_cut_line(handle)
            os.write(handle, "".join(lines).encode())
            os.fdatasync(handle)
        finally:
            os.close(handle)
        if new:
            _sync_dir(os.path.dirname(journal))


def _drop_cut_line(handle):
    """Cut the journal back to its last newline: a line without one is a write a crash cut short (its Allocate never
    answered); appended to, it would become a damaged line in the middle that stops every reader."""
    size = os.fstat(handle).st_size
    if not size or os.pread(handle, 1, size - 1) == b"\n":
        return
    keep = os.pread(handle, size, 0).rfind(b"\n") + 1
    os.ftruncate(handle, keep)


def journal_pending(path):
    """Whether the journal beside the snapshot `path` has lines."""
    try:
        return os.path.getsize(journal_path(path)) > 0
    except FileNotFoundError:
        return False


def _sync_dir(directory):
    handle = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def write(path, devices):
    """Replace the record: the snapshot atomically and durably (file and directory fsynced: it must survive a power
    cut), then the journal emptied (a cut between the two replays lines the snapshot already has: harmless). The
    caller holds `locked(path, ...)` from its read of the record to here (see `rewrite`)."""
    write_file(path, json.dumps({"version": VERSION, "checksum": _checksum(devices), "devices": devices},
                                sort_keys=True) + "\n", mode=0o600, sync=DURABLE)
    if journal_pending(path):
        handle = os.open(journal_path(path), os.O_WRONLY | os.O_TRUNC)
        try:
            os.fsync(handle)
        finally:
            os.close(handle)


def rewrite(path, change, wait=None):
    """Read the record, `change(devices)` -> the devices to keep (or None: nothing to write), write it: all under the
    record's lock, so no Allocate lands between the read and the rewrite (OSError after `wait` seconds)."""
    with locked(path, REWRITE_WAIT if wait is None else wait):
        kept = change(read(path))
        if kept is not None:
            write(path, kept)


def holders(devices):
    """{device ID: [holder description]} of every recorded device."""
    return dict((device, [HOLDER % (entry["pod"], entry["resource"]) if entry.get("pod")
                          else HOLDER_PENDING % entry["resource"]]) for device, entry in devices.items())


def holders_source(kubelet_dir=DEFAULT_KUBELET_DIR):
    """An inuse.held_devices() source: the vGPUs allocated to pods under `kubelet_dir`, read at every call (the
    device plugin runs in the agent). A damaged record raises: unknown is held."""
    path = record_path(kubelet_dir)
    return lambda: holders(read(path))
