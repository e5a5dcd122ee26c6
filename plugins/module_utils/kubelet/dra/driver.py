# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Prepare and unprepare ResourceClaims on this node: the DRA driver's logic, without gRPC.

    driver = DraDriver(node_name, get_claim, node_view, plugin_dir, cdi_dir, node_lock=..., boot_id=...)
    driver.prepare([ClaimRef(namespace, name, uid)]) -> {uid: Prepared(devices, error)}
    driver.unprepare([ClaimRef(...)]) -> {uid: error or ""}
    driver.holders() -> {VF address or mdev UUID: ["DRA claim ns/name"]}   (prepared vGPUs are held)

Prepare, per claim (an error is that claim's, the others go on; every claim gets an answer):
1. recorded as completed in this boot with its files in place -> the recorded answer (idempotent);
2. the claim is read from the API server (`get_claim(namespace, name)`), its UID checked, the
   results of this driver taken (claims.results);
3. under the node lock (the one every layout apply takes; waited for at most LOCK_WAIT seconds): each
   device must be in this node's pool (`<node>/<driver>`, or the node's name for a claim allocated before
   issue 40), exist now with the profile it was published with (the name carries the profile, so a
   retyped VF no longer matches), and not be prepared for another claim; then the claim is
   recorded PrepareStarted, so from here on a layout change refuses to touch its vGPUs;
4. the CDI spec and, per request, the KEP-5304 metadata file and its CDI spec are written, the
   claim recorded PrepareCompleted, and its CDI IDs returned (the device's, then its request's
   metadata one). A failure while writing removes what was written and the record.
Unprepare removes the files (also those of a claim never recorded: a crash before the record
leaves nothing behind) and the record.

Start (issue 40.1): a driver made with `ready=False` (the agent's) prepares no new claim before `inventory_known()`
(the agent's first reconcile told it the fixed vGPUs and the claim-time offers; the agent registers with the
kubelet only then). A completed claim is answered from the checkpoint before that; any other claim waits for it
at most READY_WAIT s of its call's budget, else gets an error saying the driver is starting (the kubelet retries):
without the offers a claim-time device, also one whose prepare a crash cut short, would read as removed.

Cleanup (issue 40.8, after NVIDIA's cmd/gpu-kubelet-plugin/cleanup.go): `clean_stale(log)` drops a PrepareStarted
record (a prepare cut short: crash, failed write) at least STALE_AGE s old whose claim the API server answers 404
for, or has under another UID (deleted and re-created): its files are removed and its claim-time VF cleared when
nothing else holds it (unsure = held: the type stays, one line names the claim and the VF). Any other API error
leaves it for the next call. Completed claims are left to the kubelet's unprepare (docs/design.md "DRA driver").

Waits are bounded well under the kubelet's 45 s per call (pkg/kubelet/cm/dra/plugin/dra_plugin.go,
defaultClientCallTimeout): a claim whose node-lock wait (an apply runs) or API read would pass the
call's CALL_BUDGET gets an error naming it, and the kubelet retries it. The driver's own lock guards
only the checkpoint and the claim files, never a wait for the node lock or the API, so an Unprepare
never queues behind a Prepare that waits; a claim already being prepared by an earlier call (the
kubelet gave up on it and retried) gets an error instead of a second, concurrent prepare.
"""

from __future__ import annotations

import contextlib
import copy
import os
import threading
import time
from collections import namedtuple

from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import cdi, claims, metadata, slices
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.checkpoint import COMPLETED, STARTED, Checkpoint
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import claim_holders
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders.claim_holders import HOLDER
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders.node_lock import NodeLockError
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.claims import ClaimError
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.claim_time_prepare import VfHeld
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.devices import DRIVER

Prepared = namedtuple("Prepared", "devices error")   # devices: [{"requests", "pool", "device", "cdiIDs"}]
LOCK_WAIT = 10.0        # seconds a claim waits for the node lock (an apply holds it)
READY_WAIT = 10.0       # seconds a new claim waits for the driver's first inventory (an agent that just started)
STALE_AGE = 60.0        # seconds a PrepareStarted record lives before clean_stale asks the API about its claim
CALL_BUDGET = 25.0      # seconds one NodePrepareResources may wait in all (+ one API read); the kubelet gives up after 45


class DraDriver:
    def __init__(self, node_name, get_claim, node_view, plugin_dir, cdi_dir, driver=DRIVER, node_lock=None,
                 boot_id=None, lock_wait=LOCK_WAIT, call_budget=CALL_BUDGET, clock=time.monotonic, ready=True,
                 ready_wait=READY_WAIT, wall=time.time, typer=None, whole=None):
        """`node_lock(timeout)`: a context manager holding the node lock, NodeLockError after `timeout` s.
        `ready=False`: new claims wait for `inventory_known()` (module docstring, "Start").
        `typer`: a claim_time_prepare.ClaimTimePreparer (devices whose VF Prepare chooses and types), or None;
        `whole`: a whole_gpu.WholeGpuPreparer (claim-time GPUs given whole to one claim), or None."""
        self.node_name, self.get_claim, self.node_view = node_name, get_claim, node_view   # devices.NodeView
        self.plugin_dir, self.cdi_dir, self.driver = plugin_dir, cdi_dir, driver
        self.node_lock = node_lock or (lambda timeout: contextlib.nullcontext())
        self.lock_wait, self.call_budget, self.clock = lock_wait, call_budget, clock
        self.ready_wait, self.wall = ready_wait, wall    # wall: time.time, PrepareStarted's age across restarts
        self._ready = threading.Event()
        if ready:
            self._ready.set()
        self._first_seen = {}             # UID -> wall time clean_stale first saw a record without startedAt
        self.checkpoint = Checkpoint(plugin_dir, boot_id)
        # the pools a claim may name: `<node>/<driver>`, and the node's name (claims allocated from earlier releases)
        self.pools = slices.pools(node_name, driver)
        self.pool = self.pools[0]         # the pool published now (the agent's plugin sets it: agent_plugin.py)
        self._lock = threading.Lock()     # the checkpoint and the claim files; never held while waiting
        self._preparing = set()           # UIDs a call is preparing now
        self.typer = typer
        self.whole = whole          # whole_gpu.WholeGpuPreparer: claim-time GPUs given whole (issue 42 item 1)

    # --- the kubelet's calls ---------------------------------------------------------------------
    def prepare(self, refs):
        deadline = self.clock() + self.call_budget
        return {ref.uid: _guarded(lambda item: self._prepare_claim(item, deadline), ref,
                                  lambda message: Prepared([], message)) for ref in refs}

    def unprepare(self, refs):
        try:
            lock = self._claim_time_lock(refs)
            with lock:       # taken before the driver's lock: that one is never held while waiting
                with self._lock:     # held by a prepare only for its local steps, never while it waits
                    return {ref.uid: _guarded(self._unprepare_one, ref, lambda message: message) for ref in refs}
        except NodeLockError as exc:
            return {ref.uid: "%s: not unprepared within %.0f s (its claim-time VF is cleared under the node lock): %s; "
                             "the kubelet retries" % (ref, self.lock_wait, exc) for ref in refs}

    def inventory_known(self):
        """The node's devices are known (the agent's first reconcile): new claims are prepared from now on."""
        self._ready.set()

    def holders(self):
        with self._lock:
            return self.checkpoint.holders()

    def prepared_claims(self):
        """{uid: checkpoint entry} (a copy) of every recorded claim."""
        with self._lock:
            return copy.deepcopy(self.checkpoint.claims)

    # --- prepare ---------------------------------------------------------------------------------
    def _prepare_claim(self, ref, deadline):
        with self._lock:
            if ref.uid in self._preparing:
                raise ClaimError("%s: an earlier call is still preparing it; try again" % (ref,))
            self._preparing.add(ref.uid)
        try:
            return self._prepare_one(ref, deadline)
        finally:
            with self._lock:
                self._preparing.discard(ref.uid)

    def _left(self, ref, deadline):
        """Seconds this call may still wait; a ClaimError (the kubelet retries) when none are left."""
        left = deadline - self.clock()
        if left <= 0:
            raise ClaimError("%s: not prepared: this call waited %.0f s already (the node lock or the API server); "
                             "the kubelet retries" % (ref, self.call_budget))
        return left

    def _prepare_one(self, ref, deadline):
        with self._lock:
            entry = self.checkpoint.get(ref.uid)
            if self.checkpoint.completed_this_boot(ref.uid) and self._files_present(ref, entry):
                return Prepared(_answer_devices(entry), "")
        self._wait_ready(ref, deadline)
        self._left(ref, deadline)
        try:
            claim = self.get_claim(ref.namespace, ref.name)
        except EngineError as exc:
            if getattr(exc, "status", None) == 404:
                raise ClaimError("%s: not found in the API server" % (ref,)) from None
            raise ClaimError("%s: cannot read it from the API server: %s" % (ref, exc)) from None
        allocated = claims.results(ref, claim, self.driver)
        if not allocated:
            return Prepared([], "")
        entries = self._reserve(ref, allocated, min(self.lock_wait, self._left(ref, deadline)))
        with self._lock:
            if (self.checkpoint.get(ref.uid) or {}).get("state") != STARTED:
                # the kubelet gave up on this call and unprepared the claim between the reserve and here (the
                # driver's lock is not held in between): writing the files and COMPLETED would bring it back
                raise ClaimError("%s: unprepared while this call prepared it; nothing written, the kubelet "
                                 "prepares it again if it still wants it" % (ref,))
            try:
                devices = self._write(ref, claim, entries)
            except BaseException:
                self._remove_files(ref)
                if not any(d.get("claimTime") or d.get("whole")
                           for d in (self.checkpoint.get(ref.uid) or {}).get("devices") or ()):
                    self.checkpoint.drop(ref.uid)     # a typed claim-time VF, a GPU given whole stay recorded
                    self.checkpoint.save()
                raise
            _carry_whole(self.checkpoint.get(ref.uid), devices)
            self.checkpoint.set(ref.uid, ref.namespace, ref.name, COMPLETED, devices)
            self._with_mig(ref)      # the GI unprepare destroys
            self.checkpoint.save()
            return Prepared(_answer_devices(self.checkpoint.get(ref.uid)), "")

    def _wait_ready(self, ref, deadline):
        """Until the first inventory is known, at most READY_WAIT s of this call; then a retriable ClaimError."""
        if self._ready.is_set():
            return
        wait = min(self.ready_wait, self._left(ref, deadline))
        if not self._ready.wait(wait):
            raise ClaimError("%s: not prepared: the DRA driver on node %s is starting (it knows its devices after "
                             "its first reconcile; waited %g s); the kubelet retries" % (
                                 ref, self.node_name, round(wait, 1)))

    def _reserve(self, ref, allocated, wait):
        """Check every allocated device against the node now and record the claim as started."""
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(self.node_lock(wait))
            except NodeLockError as exc:
                raise ClaimError("%s: not prepared within %.0f s: %s; the kubelet retries" % (ref, wait, exc)) from None
            stack.enter_context(self._lock)
            if self.typer is not None and any(self._chosen_now(item) for item in allocated):
                self.typer.begin()     # one in-use engine for this claim (claim_time_prepare.py)
            current = self.node_view.current(sorted({item.device for item in allocated
                                                     if not (self._chosen_now(item) or self._whole(item.device))}))
            held = self.checkpoint.holders()
            mine = HOLDER % (ref.namespace, ref.name)
            prior = self.checkpoint.get(ref.uid)
            earlier = {d["device"]: d for d in _gis_this_boot(prior, self.checkpoint.boot_id)}
            earlier_whole = earlier if self.checkpoint.this_boot(prior) else {}   # a reboot reset the PF since
            entries, typed = [], []
            others = {key for key, names in held.items() if set(names) - {mine}}
            for item in allocated:
                if item.pool not in self.pools:
                    raise ClaimError("%s: device %s/%s is not in this node's pool (%s)" % (
                        ref, item.pool, item.device, self.pool))
                if self._whole(item.device):     # a claim-time GPU given whole: checked now (whole_gpu.py)
                    entries.append(claims.PreparedDevice(item.request, item.pool, self.whole.check(
                        ref, item.device, earlier_whole.get(item.device))))
                    continue
                if self._chosen_now(item):   # claim-time: a free VF of the allocated GPU (claim_time_prepare.py)
                    taken = others | {e.device.key for e in entries}
                    if item.device in [e.device.name for e in entries]:
                        raise ClaimError("%s: device %s is allocated twice in one claim; ask one vGPU per request"
                                         % (ref, item.device))
                    typed.append(self.typer.choose(ref, item.device, earlier.get(item.device), taken))
                    entries.append(claims.PreparedDevice(item.request, item.pool, typed[-1]))
                    continue
                device = current.get(item.device)
                if device is None:
                    raise ClaimError("%s: device %s (request %s) is not on node %s: its vGPU was retyped or removed "
                                     "after it was allocated" % (ref, item.device, item.request, self.node_name))
                others = [name for name in held.get(device.key, ()) if name != HOLDER % (ref.namespace, ref.name)]
                if others:
                    raise ClaimError("%s: device %s is prepared for %s" % (ref, item.device, ", ".join(others)))
                entries.append(claims.PreparedDevice(item.request, item.pool, device))
            self._record_started(ref, entries, typed, earlier)
            # durable: after a power loss this record is what keeps a layout change off the claim's vGPUs, and a
            # claim-time VF typed next is found recorded after a crash
            self.checkpoint.save()
            try:
                self._write_types(ref, entries, typed, others)
                self._take_whole(ref, entries)
            except BaseException as exc:
                entry = self.checkpoint.get(ref.uid)
                kept = {vf for vf, dummy in self._release_claim_time(ref, entry)}
                try:
                    self._give_back_whole(ref, self.checkpoint.get(ref.uid))
                except ClaimError as stuck:     # the record stays: the retry goes on, unprepare gives it back
                    raise ClaimError("%s; giving the GPU back failed too: %s" % (exc, stuck)) from None
                if not _gi_left(entry, kept):   # else its record says the GI is ours: a retry or unprepare destroys it
                    self.checkpoint.drop(ref.uid)
                self.checkpoint.save()
                raise
        return entries

    def _write_types(self, ref, entries, typed, others):
        """Type each chosen VF (claim_time_prepare.write: its holders asked right before the write). A VF found held
        there is written nothing: the next free VF of the GPU is chosen, recorded durably, and tried instead."""
        held_now = set()
        for index, device in enumerate(typed):
            while True:
                try:
                    self.typer.write(ref, device, note=lambda: self._save_mig(ref))
                    break
                except VfHeld as exc:
                    held_now.add(exc.vf)
                    taken = others | held_now | {e.device.key for e in entries if e.device is not device}
                    replacement = self.typer.choose(ref, device.name, None, taken)
                    entries[:] = [e._replace(device=replacement) if e.device is device else e for e in entries]
                    typed[index] = device = replacement
                    self._record_started(ref, entries, typed, {})
                    self.checkpoint.save()

    def _record_started(self, ref, entries, typed, earlier):
        """`earlier`: {device name: record} of this claim before (a whole GPU's step survives a retry)."""
        kept = {name: record for name, record in (earlier or {}).items() if "whole" in record}
        kept.update({r["device"]: r for r in (self.checkpoint.get(ref.uid) or {}).get("devices") or () if "whole" in r})
        self.checkpoint.set(ref.uid, ref.namespace, ref.name, STARTED, _record(entries, typed))
        for record, entry in zip(self.checkpoint.get(ref.uid)["devices"], entries):
            if self._whole(entry.device.name):
                record["whole"] = (kept.get(entry.device.name) or {}).get("whole") or self.whole.record_of(entry.device)
        self.checkpoint.get(ref.uid)["startedAt"] = int(self.wall())     # clean_stale's age, across restarts
        self._with_mig(ref)

    def _with_mig(self, ref):
        """Copy the MIG-backed devices' GI records (claim_time_mig.py) into the claim's checkpoint record."""
        for record in (self.checkpoint.get(ref.uid) or {}).get("devices") or ():
            found = self.typer.mig_record(ref.uid, record["device"]) if record.get("claimTime") else None
            if found is not None:
                record["mig"] = dict(found)

    def _save_mig(self, ref):
        """Before each GI step of a MIG-backed prepare: its record, durably (a crash finds what it was doing)."""
        self._with_mig(ref)
        self.checkpoint.save()

    # --- whole GPUs (whole_gpu.py): every step recorded in the claim's record before it is taken ----------------
    def _whole(self, name):
        return self.whole is not None and self.whole.owns(name)

    def _whole_step(self, ref, name):
        """A recorder for the whole GPU of device `name`: the step saved durably (the caller holds self._lock)."""
        def step(value):
            for record in (self.checkpoint.get(ref.uid) or {}).get("devices") or ():
                if record["device"] == name and isinstance(record.get("whole"), dict):
                    record["whole"]["step"] = value
            self.checkpoint.save()
        return step

    def _take_whole(self, ref, entries):
        for entry in entries:
            if self._whole(entry.device.name):
                self.whole.take(ref, entry.device, self._whole_step(ref, entry.device.name))

    def _give_back_whole(self, ref, entry):
        """Every GPU the record gives whole back to vGPUs (the caller holds the node lock); a ClaimError (the record
        stays) when one cannot be given back. A record of an earlier boot never rebinds the PF (whole_gpu.give_back)."""
        ours = self.checkpoint.this_boot(entry)     # a reboot puts the PF back on nvidia: else someone else bound it
        for record in (entry or {}).get("devices") or ():
            if isinstance(record.get("whole"), dict):
                if self.whole is None:
                    raise ClaimError("%s: GPU %s was given whole; this driver cannot give it back" % (ref, record["key"]))
                self.whole.give_back(ref, record["key"], self._whole_step(ref, record["device"]), ours)

    def _chosen_now(self, item):
        return self.typer is not None and self.typer.owns(item.device)

    def _release_claim_time(self, ref, entry, unsure_kept=False):
        """Clear the VFs a claim-time record typed, where nothing but the claim holds them; the caller holds the
        node lock. [(VF, why it keeps its type)]. `unsure_kept`: a VF whose holders cannot be read keeps its type
        (else the error goes to the caller). (A prepare that fails after the type write keeps its PrepareStarted
        record, VF typed: the kubelet's retry adopts the VF, its unprepare clears it.)"""
        records = [d for d in _gis_this_boot(entry, self.checkpoint.boot_id) if d.get("claimTime")]
        kept = []
        if records and self.typer is not None:
            # the in-use engine knows claims by name: a claim re-created under this name (another UID) is told
            # apart here, by the record
            others = claim_holders.holders({uid: e for uid, e in self.checkpoint.claims.items() if uid != ref.uid})
            begun = False
            for record in records:
                try:
                    if record.get("key") in others:
                        why = "%s holds it too" % ", ".join(others[record["key"]])
                    else:
                        if not begun:
                            self.typer.begin()     # this lock hold's in-use engine
                            begun = True
                        why = self.typer.release(ref, record)
                except (EngineError, OSError) as exc:
                    if not unsure_kept:
                        raise
                    why = "who holds it cannot be read (%s)" % exc
                if why:
                    kept.append((record.get("key"), why))
        return kept

    def _claim_time_lock(self, refs):
        """The node lock (at most lock_wait s) when an unprepare must clear claim-time VFs, else nothing."""
        with self._lock:
            entries = [self.checkpoint.get(ref.uid) or {} for ref in refs]
        if not any(d.get("claimTime") or d.get("whole") for entry in entries for d in entry.get("devices") or ()):
            return contextlib.nullcontext()
        return self.node_lock(self.lock_wait)

    def _write(self, ref, claim, entries):
        """The CDI spec and the metadata files; the record's devices with their CDI IDs."""
        cdi.write_claim_spec(self.cdi_dir, self.driver, ref.uid,
                             [(e.device, self.node_view.nodes(e.device)) for e in entries])
        by_request = {}
        for entry in entries:
            by_request.setdefault(claims.base_request(entry.request), []).append(entry)
        metadata_ids = {request: metadata.write_request(self.plugin_dir, self.cdi_dir, self.driver, ref, request, group,
                                                        claims.pod_claim_name(claim))
                        for request, group in sorted(by_request.items())}
        devices = _record(entries, [e.device for e in entries
                                    if self._chosen_now(claims.Allocated(e.request, e.pool, e.device.name))])
        for record, entry in zip(devices, entries):
            record["cdiIDs"] = [cdi.device_id(self.driver, ref.uid, entry.device.name),
                                metadata_ids[claims.base_request(entry.request)]]
        return devices

    def _files_present(self, ref, entry):
        paths = [cdi.spec_path(self.cdi_dir, self.driver, ref.uid)]
        for device in entry.get("devices") or ():
            for request in device["requests"]:
                base = claims.base_request(request)
                paths.append(metadata.spec_path(self.cdi_dir, self.driver, ref.uid, base))
                paths.append(metadata.file_path(self.plugin_dir, entry["namespace"], entry["name"], base))
        return all(os.path.exists(path) for path in paths)

    # --- unprepare -------------------------------------------------------------------------------
    def _unprepare_one(self, ref):
        entry = self.checkpoint.get(ref.uid)
        self._remove_files(ref)
        kept = self._release_claim_time(ref, entry)
        self._give_back_whole(ref, entry)     # fails: the record stays, the kubelet's retry goes on from its step
        if entry and (entry["namespace"], entry["name"]) != (ref.namespace, ref.name):
            self._remove_files(claims.ClaimRef(entry["namespace"], entry["name"], ref.uid))
        left = [(vf, why) for vf, why in kept if _gi_left(entry, {vf})]
        if left:    # the record is the only proof the GI is ours: it stays, the kubelet retries (unsure = held)
            vf, why = left[0]
            gi = next(d["mig"] for d in entry["devices"] if d.get("key") == vf)
            return ("%s: the GPU instance %s its prepare created on GPU %s at %d:%d stays (VF %s: %s); its record "
                    "stays, the kubelet retries the unprepare"
                    % (ref, gi.get("gi", "?"), gi["gpu"], gi["start"], gi["size"], vf, why))
        if entry is not None:
            self.checkpoint.drop(ref.uid)
            self.checkpoint.save()
        return ""

    # --- stale PrepareStarted records ------------------------------------------------------------------
    def clean_stale(self, log, min_age=STALE_AGE):
        """Drop the PrepareStarted records whose claim is gone from the API server (module docstring,
        "Cleanup"); the UIDs dropped. One API read per record old enough; none when there is no such record."""
        now = self.wall()
        with self._lock:
            started = {uid: copy.deepcopy(entry) for uid, entry in self.checkpoint.claims.items()
                       if entry.get("state") == STARTED and uid not in self._preparing}
        self._first_seen = {uid: self._first_seen.get(uid, now) for uid in started}
        dropped = []
        for uid, entry in sorted(started.items()):
            since = entry.get("startedAt")
            if not isinstance(since, (int, float)) or isinstance(since, bool):
                since = self._first_seen[uid]     # recorded by a driver before startedAt: from when we saw it
            if now - since < min_age:
                continue
            ref = claims.ClaimRef(entry["namespace"], entry["name"], uid)
            why = self._gone(ref, log)
            if why and self._drop_stale(ref, why, log):
                dropped.append(uid)
        return dropped

    def _gone(self, ref, log):
        """Why the claim is gone from the API server (404, another UID), or None (there, or the API did not say)."""
        try:
            claim = self.get_claim(ref.namespace, ref.name)
        except EngineError as exc:
            if getattr(exc, "status", None) == 404:
                return "not found in the API server"
            log("DRA driver: %s (UID %s), left PrepareStarted: cannot ask the API server about it (%s); its record "
                "stays, asked again at the next reconcile" % (ref, ref.uid, exc))
            return None
        uid = (claim.get("metadata") or {}).get("uid")
        if uid != ref.uid:
            return "the API server has it under UID %s (deleted and re-created)" % (uid,)
        return None

    def _drop_stale(self, ref, why, log):
        """Remove the stale record's files and record, clearing its claim-time VFs nothing else holds."""
        try:
            with self._claim_time_lock([ref]):
                with self._lock:
                    entry = self.checkpoint.get(ref.uid)
                    if (entry or {}).get("state") != STARTED or ref.uid in self._preparing:
                        return False    # the kubelet prepared, unprepared or is preparing it since the read
                    self._remove_files(ref)
                    kept = self._release_claim_time(ref, entry, unsure_kept=True)
                    self._give_back_whole(ref, entry)     # a GPU a cut-short prepare took goes back (ClaimError: kept)
                    if _gi_left(entry, {vf for vf, dummy in kept}):
                        log("DRA driver: %s (UID %s), left PrepareStarted: %s; its GPU instance stays (%s): its record "
                            "stays, cleaned again at the next reconcile" % (ref, ref.uid, why, kept[0][1]))
                        return False
                    self.checkpoint.drop(ref.uid)
                    self.checkpoint.save()
        except (NodeLockError, ClaimError) as exc:
            log("DRA driver: %s (UID %s), left PrepareStarted: %s; not cleaned now: %s" % (ref, ref.uid, why, exc))
            return False
        log("DRA driver: %s (UID %s), left PrepareStarted: %s; its record and files removed%s" % (
            ref, ref.uid, why, "".join("; VF %s keeps its type: %s (the reconcile clears it once nothing holds it)"
                                       % item for item in kept)))
        return True

    def _remove_files(self, ref):
        cdi.remove(cdi.spec_path(self.cdi_dir, self.driver, ref.uid))
        metadata.remove_claim(self.plugin_dir, self.cdi_dir, self.driver, ref)


def _guarded(call, ref, on_error):
    """`call(ref)`, or `on_error(one-line message)`: one claim's failure is its answer, never the call's."""
    try:
        return call(ref)
    except EngineError as exc:
        return on_error(str(exc))
    except OSError as exc:
        return on_error("%s: %s: %s" % (ref, exc.filename or "file", exc.strerror or exc))
    except Exception as exc:  # pylint: disable=broad-exception-caught
        # a bug must not fail the other claims or the kubelet's call: this claim's answer says so
        return on_error("%s: internal error: %s: %s" % (ref, type(exc).__name__, exc))


def _record(entries, claim_time_devices=()):
    """The checkpoint's device records of `entries` ([claims.PreparedDevice])."""
    records = [{"requests": [e.request], "pool": e.pool, "device": e.device.name, "key": e.device.key,
                "typeID": e.device.type_id, "cdiIDs": []} for e in entries]
    for record, entry in zip(records, entries):
        if entry.device in claim_time_devices:
            record["claimTime"] = True     # its VF was typed by this prepare: unprepare clears it
    return records


def _carry_whole(entry, devices):
    """A whole GPU's record (its step, its offers) kept from the PrepareStarted record into the completed one."""
    whole = {d["device"]: d["whole"] for d in (entry or {}).get("devices") or () if "whole" in d}
    for record in devices:
        if record["device"] in whole:
            record["whole"] = whole[record["device"]]


def _gi_left(entry, kept):
    """Whether a MIG-backed device of the entry whose release was kept from finishing (`kept`: its VF) may have left
    the GI its prepare created (claim_time_mig.py): then the record stays, the only proof that GI is ours."""
    return any(d.get("key") in kept and isinstance(d.get("mig"), dict)
               and (d["mig"].get("gi") is not None or d["mig"].get("before") is not None)
               for d in (entry or {}).get("devices") or ())


def _gis_this_boot(entry, boot_id):
    """The entry's device records; a MIG-backed one recorded in another boot without its GI record (claim_time_mig.py):
    a reboot removes every GI, so its GI ID may name another's GI now, never to be adopted or destroyed."""
    devices = (entry or {}).get("devices") or ()
    if (entry or {}).get("bootID") == boot_id:
        return list(devices)
    return [{k: v for k, v in d.items() if k != "mig"} for d in devices]


def _answer_devices(entry):
    return [{"requests": list(device["requests"]), "pool": device["pool"], "device": device["device"],
             "cdiIDs": list(device["cdiIDs"])} for device in entry.get("devices") or ()]
