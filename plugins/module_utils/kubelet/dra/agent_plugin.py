# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node agent's DRA driver: ResourceSlices published after every reconcile, claims prepared for the
kubelet over gRPC, device health. The agent imports this module only with DRA_DRIVER=true.

`start()` serves nothing yet: the sockets (the service, then the registration the kubelet's plugin watcher dials)
are served at the first `reconciled()`, once the driver knows the node's devices (the fixed vGPUs and the
claim-time offers), whether that reconcile's apply succeeded or not; as the kubeletplugin helper's drivers build
their state before they start the helper (NVIDIA's cmd/gpu-kubelet-plugin/driver.go NewDriver). Registered
before that, a claim-time device (also one whose prepare a crash cut short) read as removed from the node.

The agent calls, from its reconcile thread:
- `reconciled(node_uid, sysfs, result)` after every reconcile: the node's vGPUs are published as this node's
  pool (a layout change reaches the API in the same reconcile) and fed to the health stream. After an apply
  (changed or re-asserted) they are the apply result's (devices.from_apply: the reconcile's own inventory, no
  second scan, the GPUs the layout selects: the agent serves what it programs, as its device plugin does); after
  a failure, which may have changed part of the node, the devices last published that are still what they were
  (a few reads each; one full read of the node only when nothing was published yet); the claim-time offers then
  are those the failed apply planned before it failed, on the GPUs recorded as claim-time (`planned`), else the
  devices last published (a restarted agent: the API's slices and PUBLISHED_FILE).
  The API is only written when the devices differ from the last publish; a LIST that also removes stale or
  foreign-changed slices of this node runs on the first publish, after an API error and every
  FULL_PUBLISH_INTERVAL. An API error is logged and the next reconcile tries again.
  A claim-time profile device the apply no longer offers (an allow-list narrowed, a profile the driver dropped)
  stays published, tainted NoSchedule (claim_time.WITHDRAWN_TAINT), while a claim may use it (`_still_used`), so
  kube-scheduler keeps charging its GPU's counter; the pool is `<node>/<driver>` unless claims still use the pool
  named after the node (`_choose_pool`). Both ask the API for ResourceClaims only when the checkpoint does not
  already keep the device or the old pool: an answer that fails counts as "used". After a publish, the
  PrepareStarted records whose claim is gone from the API server are cleaned (driver.clean_stale);
- `close()` at SIGTERM: the sockets go (the kubelet stops calling); the slices stay for the next pod
  (a rolling update republishes them; the Node's deletion removes them through their owner reference).
A thread serves the sockets again when one was deleted (or could not be served at the first reconcile), and serves
them SERVE_WITHOUT_INVENTORY s after the start when no reconcile has finished by then. Slices
someone else deleted (a kubelet that starts deletes every slice of its node, then registers the plugin again) are
published again by the SliceKeeper (slice_keeper.py): at once when the kubelet registers the plugin, and about a
second after a deletion its watch of this node's slices sees, with the devices last published (no read of the node).
"""

from __future__ import annotations

import json
import os
import threading
import time

from ansible_collections.accelops.vgpu.plugins.module_utils.atomic_file import RENAME, write_file
from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError
from ansible_collections.accelops.vgpu.plugins.module_utils.kube_errors import KubeApiError, KubeUnavailable
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import claim_time, claims
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import devices as dra_devices
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.claim_time_prepare import ClaimTimePreparer
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.checkpoint import COMPLETED, read_boot_id
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.driver import DraDriver
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.grpc_service import DraService
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.publisher import SlicePublisher
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.whole_gpu import WholeGpuDevice, WholeGpuPreparer
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.slice_keeper import SliceKeeper
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.paths import KubeletPaths
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.vgpu_device_plugin import KubeletDirError
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import pod_allocations
from ansible_collections.accelops.vgpu.plugins.module_utils.runner import CommandRunner
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import claim_time_layout, facts, mig


def node_view(sysfs, type_names, serves=None):
    """The driver's NodeView: a full read is facts.gather with `type_names()` (a vgpu_apply.TypeNames, its cache as
    the reconcile left it); who holds a device does not matter here (no /proc scan). `serves(gpu address)`: the
    GPUs whose vGPUs the driver publishes (DRA_DRIVER_GPUS; None: every GPU)."""
    return dra_devices.NodeView(sysfs, lambda: facts.gather(sysfs, {}, type_names()), serves)


def claim_time_preparer(sysfs, holders, kubelet_dir, runner=None, mig_options=None):
    """Prepare's chooser and writer for claim-time devices, given the node's holders (an inuse.Holders asking every
    holder source): what cannot change under the node lock (the VFs' groups and VFIO identities) read once per claim,
    the chosen VF asked the O(1) way (its group's EBUSY probe and the holder sources) once, right before its type is
    written, never by a /proc walk per candidate; no node engine. `runner` (nvidia-smi) for MIG-backed placements,
    their compute instances as the layout's (`mig_options`: mig.MigOptions)."""
    return ClaimTimePreparer(sysfs, holders, pod_allocations.record_path(kubelet_dir), runner=runner,
                             compute_instances=(mig_options or mig.MigOptions()).compute_instances)


FULL_PUBLISH_INTERVAL = 600.0   # seconds between publishes that list the API even when nothing changed
CLAIM_READ_TIMEOUT = 10.0       # seconds a prepare waits for the API server's answer (the kubelet waits 45 in all)
# seconds a profile device no longer offered stays published (tainted) at least: an allocation kube-scheduler made
# before it saw the taint is written to the claim within its binding cycle, and a later listing then finds it
WITHDRAW_GRACE = 30.0
# the claim-time devices last published, kept next to the checkpoint: a kubelet that starts (after a reboot) deletes
# every slice of its node before the agent starts, and a device no longer offered must stay while claims use it
PUBLISHED_FILE = "claim-time-published.json"
# seconds after start the sockets are served even though no reconcile has finished (the API server is down, the
# Node cannot be read): prepared claims are then answered from the checkpoint and unprepared (a pod that goes must
# not wait for the API server), new claims hear the driver is starting (driver.READY_WAIT) until a reconcile knows
# the devices. Well below the kubelet's 45 s per call, above a normal first reconcile.
SERVE_WITHOUT_INVENTORY = 20.0


class VgpuDraPlugin:
    def __init__(self, settings, api, node_lock, log, sysfs, holders, type_names, watch_interval=1.0,
                 clock=time.monotonic, serves=None, serve_without_inventory=SERVE_WITHOUT_INVENTORY, runner=None):
        """`node_lock(timeout)`: the node's apply lock (node/holders/node_lock.py), waited for at most `timeout` s.
        `holders`: which VFs are held and by whom, for claim-time Prepare and Unprepare (an inuse.Holders asking every
        holder source: node/holders/kubelet_holders.node_holders); `type_names()`: a vgpu_apply.TypeNames for a full
        read of the node (node_view); `runner`: the command runner for MIG-backed placements (nvidia-smi)."""
        self.settings, self.api, self.log = settings, api, log
        self.paths = KubeletPaths(settings.kubelet_dir)
        self.publisher = SlicePublisher(api, settings.node_name)
        self.view = node_view(sysfs, type_names, serves)
        self.driver = DraDriver(settings.node_name, self._read_claim, self.view,
                                self.paths.plugin_dir(dra_devices.DRIVER), settings.cdi_dir, node_lock=node_lock,
                                boot_id=read_boot_id(settings.proc_root), ready=False,
                                typer=claim_time_preparer(sysfs, holders, settings.kubelet_dir, runner),
                                # claim-time GPUs given whole (issue 42.1): sriov-manage through the runner
                                whole=WholeGpuPreparer(sysfs, holders, runner or CommandRunner(),
                                                       pod_allocations.record_path(settings.kubelet_dir)))
        self.offers = []           # claim-time counter sets and devices (claim_time.offers) of the last apply
        self.claim_time_refused = None  # why the API server cannot take them (claim_time.FeatureMissing), for good
        self.withdrawing = {}          # profile device published withdrawn -> clock time it was first (_still_used)
        self.pool_settled = False      # publishing `<node>/<driver>`, no claim uses the node's name (_choose_pool)
        self.taints_said = False
        self.seeded = False            # the API's slices were asked what an earlier agent published (_published_before)
        self.saved = None              # the claim-time devices last written to PUBLISHED_FILE (_save_published)
        self.keeper = SliceKeeper(api, settings.node_name, dra_devices.DRIVER, self._republish, log)
        self.service = DraService(self.driver, self.paths, on_registered=self.keeper.resync)
        self.watch_interval = watch_interval
        self.clock = clock
        self.full_publish_due = None   # clock time of the next listing publish; None: at the next publish
        self._publishing = threading.Lock()     # the reconcile thread and the keeper's share the publisher
        self._stop = threading.Event()
        self.started = False            # start() was called: the first reconcile serves the sockets
        self.started_at = None          # clock time of start(): the watch serves after serve_without_inventory
        self.serve_without_inventory = serve_without_inventory
        self.serving = False            # the sockets were served once (the watch thread keeps them)
        self._opening = threading.Lock()    # the reconcile thread and the watch thread may both serve first

    def start(self):
        if not os.path.isdir(self.paths.plugins_registry):
            raise KubeletDirError("kubelet directory %s: no plugins_registry/ directory (KUBELET_DIR or --kubelet-dir "
                                  "names the kubelet's root directory)" % self.paths.root)
        self.keeper.start()
        self.started, self.started_at = True, self.clock()
        threading.Thread(target=self._watch, name="dra-watch", daemon=True).start()
        self.log("DRA driver %s: registering with the kubelet once the first reconcile knows the node's devices"
                 % dra_devices.DRIVER)
        return self

    def _serve(self):
        """At the first reconcile: the driver knows its devices; the sockets are served, the kubelet registers us."""
        self.driver.inventory_known()
        self._open()

    def _open(self):
        with self._opening:
            if not self.started or self.serving:
                return
            self.serving = True
        try:
            self.service.start()
        except Exception as exc:  # pylint: disable=broad-exception-caught
            self.log("DRA driver: cannot serve the kubelet: %s; trying again" % exc)     # the watch thread does
            return
        self.log("DRA driver %s: serving the kubelet at %s" % (dra_devices.DRIVER, self.service.socket))

    def _serve_without_inventory_due(self):
        return (not self.serving and self.started_at is not None
                and self.clock() - self.started_at >= self.serve_without_inventory)

    def _read_claim(self, namespace, name):
        return self.api.get_resource_claim(namespace, name, timeout=CLAIM_READ_TIMEOUT)

    def _watch(self):
        while not self._stop.wait(self.watch_interval):
            if self._serve_without_inventory_due():
                self.log("DRA driver: no reconcile finished within %.0f s of the start (is the API server "
                         "reachable?); serving the kubelet: prepared claims are answered from the checkpoint and "
                         "unprepared, new ones hear the driver is starting" % self.serve_without_inventory)
                self._open()
            elif self.serving and not self.service.alive():
                try:
                    self.service.restart()
                    self.log("DRA driver: a socket was gone; serving and registering again")
                except Exception as exc:  # pylint: disable=broad-exception-caught
                    self.log("DRA driver: cannot serve the kubelet: %s" % exc)

    def reconciled(self, node_uid=None, sysfs=None, result=None, planned=None):
        """`planned`: (sysfs, Modes.result()) of a failed apply that planned the claim-time GPUs' offers before it
        failed (a layout a VM refuses on another GPU): those GPUs are served as it found them."""
        allocated = _once(self._allocated)
        recorded = None
        if result is not None:
            current = self.view.remember(dra_devices.from_apply(sysfs, result))
            self._offer(sysfs, result.get("claim_time"), allocated)
        else:
            current = self.view.still_there()
            recorded = self._recorded_claim_time()
            if planned is not None and recorded is not None:
                # a GPU the failed apply did not finish moving to claim-time (not recorded) offers nothing yet
                self._offer(planned[0], [gpu for gpu in planned[1] if gpu["address"] in recorded], allocated)
            else:   # the devices stay as last published (a restarted agent: as the API has them)
                self.offers = self.offers or self._published_before()
                self._update_preparers()
        on_claim_time = claim_time.gpus_of(self.offers)   # their VFs are typed by Prepare: no fixed devices
        if result is None:      # no apply says which GPUs are claim-time now: the last one's record does too
            on_claim_time = None if recorded is None else on_claim_time | recorded
        current = [device for device in current if on_claim_time is not None and device.parent_gpu not in on_claim_time]
        with self._publishing:
            self._choose_pool(allocated)    # before the health list: it names the pool
        self.service.update_health(current)
        self._serve()       # before the publish: a slow API server must not keep prepared claims waiting
        if node_uid and not self.publisher.node_uid:
            self.publisher.node_uid = node_uid
        full = self.full_publish_due is None or self.clock() >= self.full_publish_due
        try:
            with self._publishing:
                try:
                    plan = self.publisher.publish(current + self.offers, force=full)
                except claim_time.FeatureMissing as exc:
                    self._refuse_claim_time(exc)
                    plan = self.publisher.publish(current, force=True)
        except (KubeApiError, KubeUnavailable) as exc:
            self.full_publish_due = None
            self.log("DRA driver: cannot publish the ResourceSlices of node %s: %s" % (self.settings.node_name, exc))
            return
        if full:
            self.full_publish_due = self.clock() + FULL_PUBLISH_INTERVAL
        if plan is not None and not plan.empty:
            self.log("DRA driver: published %d vGPU(s) in %d ResourceSlice(s)" % (
                len(current), len(plan.updates) + len(plan.creates) or 1))
        try:
            self.driver.clean_stale(self.log)     # the API answered: ask it about claims a prepare left half-way
        except (EngineError, OSError) as exc:     # the checkpoint: the next reconcile tries again
            self.log("DRA driver: cleaning PrepareStarted records: %s" % exc)
        if self.publisher.taints_dropped and not self.taints_said:
            self.taints_said = True
            self.log("DRA driver: the API server dropped the device taints of node %s (DRADeviceTaints off): a "
                     "claim-time profile no longer offered stays published untainted while claims use it, and new "
                     "claims may still get it" % self.settings.node_name)

    def _offer(self, sysfs, claim_time_result, allocated):
        """The claim-time devices published and prepared: the offers, and those still used (_still_used)."""
        offers = [] if self.claim_time_refused else claim_time.offers(sysfs, claim_time_result)
        # withdrawn devices keep their counters (a placement its memory slices): claim_time.with_withdrawn
        self.offers = claim_time.with_withdrawn(offers, self._still_used(offers, allocated))
        self._update_preparers()
        self._save_published()

    def _update_preparers(self):
        """The claim-time devices published now, told to Prepare's choosers (profiles, whole GPUs)."""
        self.driver.typer.update(self.offers)
        self.driver.whole.update(self.offers)

    def _allocated(self):
        """{(pool, device)} the API's ResourceClaims have allocated from this node's pools; None when the API cannot
        say (then every device counts as used: unsure = held)."""
        try:
            return claims.allocated_devices(self.api.list_resource_claims(), dra_devices.DRIVER, self.driver.pools)
        except (KubeApiError, KubeUnavailable) as exc:
            self.log("DRA driver: cannot list the ResourceClaims: %s; a device or pool claims may use stays "
                     "published" % exc)
            return None

    def _still_used(self, offers, allocated):
        """The profile and whole-GPU devices published before that `offers` no longer has, kept withdrawn (tainted
        NoSchedule) while a claim may use them: a prepared one (the checkpoint) or an allocated one
        (the API, asked only for a device no prepared claim keeps); each stays at least WITHDRAW_GRACE s."""
        offered = {item.name for item in offers}
        gone = [item for item in self.offers or self._published_before()
                if isinstance(item, (claim_time.ProfileDevice, WholeGpuDevice)) and item.name not in offered]
        now = self.clock()
        prepared = {name for dummy, name in claims.prepared_devices(self.driver.prepared_claims(), self.driver.pools)}
        kept = []
        for item in gone:
            since = self.withdrawing.get(item.name, now)
            if item.name in prepared or now - since < WITHDRAW_GRACE:
                kept.append(item)
                continue
            found = allocated()
            if found is None or item.name in {name for dummy, name in found}:
                kept.append(item)
            else:
                self.log("DRA driver: claim-time device %s is no longer offered and no claim uses it: withdrawn"
                         % item.name)
        for item in kept:
            if item.name not in self.withdrawing:
                self.log("DRA driver: claim-time device %s (GPU %s) is no longer offered; it stays published, tainted "
                         "%s:%s, while claims may use it" % (item.name, item.gpu, claim_time.WITHDRAWN_TAINT["key"],
                                                             claim_time.WITHDRAWN_TAINT["effect"]))
        self.withdrawing = {item.name: self.withdrawing.get(item.name, now) for item in kept}
        return [item.withdraw() for item in kept]

    def _published_before(self):
        """The claim-time devices the API's slices of this node hold (claim_time.from_slices), asked once per agent
        life: a restarted agent (a rolled DaemonSet, a changed config) knows nothing of what it published before, and
        a device no longer offered must stay while claims use it whoever published it. [] when the API cannot say
        (then the publish fails too, and the next reconcile asks again)."""
        if self.seeded:
            return []
        try:
            found = self.api.list_resource_slices(self.settings.node_name, dra_devices.DRIVER)
        except (KubeApiError, KubeUnavailable):
            return []
        self.seeded = True
        # the slices first (what kube-scheduler sees), then what this node recorded (PUBLISHED_FILE): the kubelet
        # deleted the slices since (it started: a reboot), or the API server lost them
        names = {entry.get("name") for item in found for entry in (item.get("spec") or {}).get("devices") or ()}
        kept = [entry for entry in self._read_published() if entry.get("name") not in names]
        return claim_time.from_slices(list(found) + [{"spec": {"devices": kept}}])

    def _published_path(self):
        return os.path.join(self.paths.plugin_dir(dra_devices.DRIVER), PUBLISHED_FILE)

    def _read_published(self):
        """The device entries PUBLISHED_FILE holds; [] when there is none or it cannot be read (one line)."""
        try:
            with open(self._published_path()) as handle:
                entries = json.load(handle).get("devices")
        except FileNotFoundError:
            return []
        except (OSError, ValueError, AttributeError) as exc:
            self.log("DRA driver: %s cannot be read (%s); only the API's slices say what was published"
                     % (self._published_path(), exc))
            return []
        return [entry for entry in entries if isinstance(entry, dict)] if isinstance(entries, list) else []

    def _save_published(self):
        """PUBLISHED_FILE holds the claim-time profile devices, when they changed (rarely: an allow-list edit, a
        claim-time GPU added, a device withdrawn for good)."""
        devices = [item.to_api() for item in self.offers
                   if isinstance(item, (claim_time.ProfileDevice, WholeGpuDevice))]
        if devices == self.saved:
            return
        try:
            write_file(self._published_path(), json.dumps({"devices": devices}, sort_keys=True) + "\n", 0o644,
                       sync=RENAME)
        except (EngineError, OSError) as exc:
            self.log("DRA driver: cannot record the claim-time devices published in %s: %s" % (
                self._published_path(), exc))
            return
        self.saved = devices

    def _choose_pool(self, allocated):
        """Publish as `<node>/<driver>` (slices.pool_name) unless a claim may still use the pool named after the node
        (earlier releases published that one): a prepared one (the checkpoint) or an allocated one (the API; unknown
        counts as used). Moving the pool under such a claim would hide its device from kube-scheduler, which would then
        hand the device (or its GPU's counter) to another claim (kubernetes#140806): the old name stays until they are
        gone, and the move deletes its slices (slices.plan). Once moved, it is not asked again."""
        if self.pool_settled:
            return
        new, legacy = self.driver.pools
        used = bool(claims.prepared_devices(self.driver.prepared_claims(), (legacy,)))
        if not used:
            found = allocated()
            used = found is None or any(pool == legacy for pool, dummy in found)
        pool = legacy if used else new
        if pool != self.publisher.pool:
            self.publisher.published = None     # a publish under the new name even when the devices are the same
            then = " while claims allocated from it remain (then %s)" % new if used else ""
            self.log("DRA driver: publishing node %s as pool %s%s" % (self.settings.node_name, pool, then))
        self.publisher.pool = self.driver.pool = pool
        self.pool_settled = not used

    def _recorded_claim_time(self):
        """The GPUs the last apply recorded as claim-time (node/engine/claim_time_layout.py's modes file); None when the
        record cannot be read (then no fixed device is offered: a prepared claim-time VF must not be offered twice)."""
        try:
            return set(claim_time_layout.read_modes(claim_time_layout.modes_path(self.settings.kubelet_dir)))
        except EngineError as exc:
            self.log("DRA driver: %s; publishing no fixed-profile vGPU until an apply succeeds" % exc)
            return None

    def _republish(self):
        """The keeper's: the devices last published, listed against the API again (only what is missing or
        different is written); nothing before the first publish (the reconcile makes it)."""
        with self._publishing:
            if self.publisher.published is None:
                return
            plan = self.publisher.publish(self.publisher.published)
        if not plan.empty:
            self.log("DRA driver: the ResourceSlices of node %s had been changed or deleted (a kubelet restart "
                     "deletes them); published %d vGPU(s) again" % (self.settings.node_name,
                                                                    len(self.publisher.published)))

    def claim_time_vfs(self):
        """{GPU address: [(VF, type ID)]}: per claim-time GPU the VFs completed claims were prepared on and their types
        (the agent's manager probe reads one: a vGPU-manager restart resets them under the claims)."""
        found = {}
        for entry in self.driver.prepared_claims().values():
            if entry.get("state") != COMPLETED:
                continue
            for device in entry.get("devices") or ():
                offer = self.driver.typer.devices.get(device.get("device"))
                if device.get("claimTime") and offer is not None and device.get("typeID"):
                    found.setdefault(offer.gpu, []).append((device["key"], device["typeID"]))
        return found

    def _refuse_claim_time(self, exc):
        """Claim-time mode off for this agent's life: its devices withdrawn, fixed-profile vGPUs still published."""
        self.claim_time_refused = str(exc)
        self.log("DRA driver: claim-time mode refused on node %s: %s; the claim-time GPUs %s offer nothing, "
                 "fixed-profile vGPUs are published" % (self.settings.node_name, exc,
                                                        ", ".join(sorted(claim_time.gpus_of(self.offers)))))
        self.offers = []
        self._update_preparers()

    def close(self):
        self._stop.set()
        self.keeper.stop()
        self.service.stop()


def _once(call):
    """`call` made at most once: later calls return the first answer (one ResourceClaims listing per reconcile)."""
    answers = []

    def once():
        if not answers:
            answers.append(call())
        return answers[0]
    return once
