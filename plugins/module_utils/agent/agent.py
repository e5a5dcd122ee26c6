# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node agent: reconcile this node's vGPU layout with its `nvidia.com/vgpu.config` label.

A watcher thread follows the Node (node_watch) and keeps the latest object; the main thread
reconciles whenever the wanted (config name, config file digest) differs from what it last
reconciled, or when RESYNC_INTERVAL has passed (a failed layout is retried then; a good one is
re-asserted, which reads sysfs but writes nothing when the node still matches). Changes that
arrive while an apply runs are not lost: the latest one is reconciled next (last change wins).

One reconcile (VDM's flow, NVIDIA/vgpu-device-manager `cmd/nvidia-k8s-vgpu-dm/main.go`, through the engine
`accelops-vgpu apply` uses):
1. the config is parsed and, under the node lock, the engine plans and validates: errors (unknown
   config, broken file, a VF a VM holds) fail before any sysfs or label write;
2. already applied: no `pending`, no pause; leftover paused operands are restored, state `success`;
3. else (the engine's `before_changes` hook, still before any write) state `pending` and operands
   paused (only deploy labels at "true"); the engine writes (enabling VFs as needed) and verifies;
   operands restored also when the apply fails, state `success` with the profile labels, or
   `failed` with the reason (annotation + Event).
Between reconciles a cheap probe (agent/manager_probe.py: one sysfs read per GPU with vGPUs every
MANAGER_PROBE_INTERVAL, 5 s) notices a vGPU-manager restart that took the vGPUs away: a Warning Event
VGPUManagerRestarted, then the re-apply at once (retried with backoff while it fails).
A layout refused because something holds a vGPU (a VM's open VFIO group, a pod the device plugin allocated it to,
a prepared DRA claim) is tried again within seconds of its last holder going away, not at the resync: while the
last reconcile was refused for holders, every HOLDER_POLL seconds the allocation record is synced with the kubelet's
PodResources and the devices the refusal was for (the error's `held`) are asked again, cheaply, by that reconcile's
inuse.Holders (their VFIO groups' EBUSY probes and the holder sources, no /proc walk, no new engine); once one is
free, the agent reconciles.
Any error becomes state `failed` with its reason; API errors are retried with backoff. The agent
exits only on SIGTERM/SIGINT (0).
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import sys
import threading
import time
import traceback

from ansible_collections.accelops.vgpu.plugins.module_utils.agent import kube, protocol as vdm
from ansible_collections.accelops.vgpu.plugins.module_utils.agent import settings as agent_settings
from ansible_collections.accelops.vgpu.plugins.module_utils.agent.config_source import ConfigSource
from ansible_collections.accelops.vgpu.plugins.module_utils.agent.kube import KubeApiError, KubeUnavailable
from ansible_collections.accelops.vgpu.plugins.module_utils.agent.manager_probe import ManagerProbe
from ansible_collections.accelops.vgpu.plugins.module_utils.agent.node_watch import Backoff, NodeWatcher
from ansible_collections.accelops.vgpu.plugins.module_utils.agent.http_endpoint import HttpEndpoint
from ansible_collections.accelops.vgpu.plugins.module_utils.agent.telemetry import Telemetry, node_vgpu_counts
from ansible_collections.accelops.vgpu.plugins.module_utils.atomic_file import RENAME, write_file
from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import claim_holders, kubelet_holders
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import pod_allocations
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import claim_time_layout
from ansible_collections.accelops.vgpu.plugins.module_utils.node.boot import handover
from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout import vgpu_layout
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import mig, vgpu_apply
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders.node_lock import LOCK_KEY_ENV, node_lock
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import Sysfs
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders.roots import check_roots
from ansible_collections.accelops.vgpu.plugins.module_utils.runner import CommandRunner
from ansible_collections.accelops.vgpu.plugins.module_utils.vgpu_labels import profiles_in_use

COMPONENT = "accelops-vgpu-agent"
EVENT_FAILED, EVENT_APPLIED = "VGPUConfigFailed", "VGPUConfigApplied"
EVENT_MANAGER_RESTART = "VGPUManagerRestarted"
EVENT_SKIPPED = "VGPUPassthroughSkipped"    # GPUs passed through that the layout leaves alone (node/holders/pf_driver.py)
CONFLICT_RETRIES = 5
HOLDER_POLL = 2.0   # seconds between checks of the holders a refused layout named
DESCRIPTION = ("Reconcile this node's vGPU layout with its nvidia.com/vgpu.config label (vgpu-device-manager's "
               "protocol: nvidia.com/vgpu.config.state pending/success/failed, sandbox operands paused and "
               "restored). Settings come from the environment variables named below; a flag wins over its "
               "variable. Exit 0 on SIGTERM/SIGINT, 2 on bad settings or credentials (one line); apply "
               "failures never end it (state failed, reason in the annotation accelops.io/vgpu.config.reason "
               "and a VGPUConfigFailed Event).")


def _now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def log(message):
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    sys.stderr.write("%s %s: %s\n" % (stamp, COMPONENT, message))
    sys.stderr.flush()


def _meta(node, key):
    return dict(((node or {}).get("metadata") or {}).get(key) or {})


class Agent:
    def __init__(self, settings, api, namespace, clock=time.monotonic, device_plugin=None, dra_plugin=None,
                 telemetry=None, smi_answers=None):
        self.settings, self.api, self.namespace, self.clock = settings, api, namespace, clock
        self.telemetry = telemetry or Telemetry(settings, clock)  # metrics and probe state (agent/telemetry.py)
        self.device_plugin = device_plugin  # kubelet.vgpu_device_plugin.VgpuDevicePlugin, or None
        self.dra_plugin = dra_plugin        # kubelet.dra.agent_plugin.VgpuDraPlugin, or None
        self.config = ConfigSource(settings.config_file)
        self.stop, self.wake, self._lock = threading.Event(), threading.Event(), threading.Lock()
        self.latest = None          # the node as last listed/watched
        self.reconciled = None      # (config name, config digest, node uid) of the last finished reconcile
        self.written = None         # labels we own (state, profiles) as our last reconcile left them
        self.own_versions = set()   # resourceVersions our own writes of that reconcile produced
        self.next_resync = 0.0
        self.retry_at = 0.0         # after an API error: no reconcile before (backoff, Retry-After)
        self.api_backoff = Backoff(base=1.0, cap=30.0)
        self.last_event = None
        self.serial = time.time_ns()
        self.checks = 0             # reconciles run: each reads the node's sysfs once (a check-mode plan)
        self.reconcile_engine = None  # the engine of the reconcile under way (its in-use answers, read once)
        # nvidia-smi answers fixed while the driver stays loaded (node/engine/mig.py FixedAnswers): asked once, not
        # at every reconcile under the node lock
        self.smi_answers = mig.FixedAnswers() if smi_answers is None else smi_answers
        self.planned = None     # (sysfs, claim-time offers) a failed apply planned before it failed
        # a vGPU-manager restart between reconciles (agent/manager_probe.py): noticed, re-applied, reported; the DRA
        # driver's prepared claim-time VFs too (a restart resets them under the claims)
        self.probe = ManagerProbe(Sysfs(settings.sysfs_root), settings.manager_probe_interval, clock,
                                  claimed=dra_plugin.claim_time_vfs if dra_plugin is not None else None)
        self.restart_backoff = Backoff(base=settings.manager_probe_interval, cap=settings.resync_interval)
        self.manager_restarts = 0   # restarts noticed (status file `manager_restarts`)
        self.restart_pending = False  # a re-apply after a restart has not succeeded yet
        self.skipped = []           # GPUs passed through the last apply left alone (status file `reserved`)
        self.allocations = None     # with the device plugin off: kubelet.pod_resources.AllocationRecord, once a
        # record an earlier device plugin left is found (pruned at every reconcile, see _plugin_check)
        self.warned = []            # the last apply's warnings, logged when they change
        self.refused_by = set()     # the held devices the last reconcile was refused for (watched until one is free)
        self.next_holder_check = 0.0
        self.holder_error = None    # the last error of that check, logged once (it may stay for hours, every 2 s)

    # --- threads ---------------------------------------------------------------------------------
    def on_node(self, node):
        with self._lock:
            self.latest = node
        self.wake.set()

    def run(self):
        watcher = NodeWatcher(self.api, self.settings.node_name, self.on_node, self.stop,
                              watch_timeout=self.settings.watch_timeout, log=log)
        threading.Thread(target=watcher.run, name="node-watch", daemon=True).start()
        log("reconciling node %s from %s (default config %s)" % (
            self.settings.node_name, self.settings.config_file, self.settings.default_vgpu_config))
        while not self.stop.is_set():
            self.telemetry.loop_beat()
            try:
                self.step()
            except Exception:  # pylint: disable=broad-exception-caught
                # never crash-loop the pod: log, and try again after a backoff
                log(traceback.format_exc().rstrip())
                self.reconciled, self.next_resync = None, self.clock() + self.api_backoff.next()
                self.retry_at = self.next_resync
            timeout = min(self.settings.config_poll_interval, max(0.05, self.next_resync - self.clock()),
                          *[t for t in (self.probe.seconds_left(), self._holder_check_in()) if t is not None])
            self.wake.wait(timeout)
            self.wake.clear()
        if self.device_plugin is not None:
            self.device_plugin.close()  # sockets removed: the kubelet marks the vGPUs unhealthy
        if self.dra_plugin is not None:
            self.dra_plugin.close()
        self.write_status("stopped", None, None)
        return 0

    def shutdown(self, *dummy):
        """Stop the loop (SIGTERM, SIGINT: through relay_signals, never from the handler itself)."""
        self.stop.set()
        self.wake.set()

    def step(self):
        if self.config.poll():
            log("config file %s changed" % self.settings.config_file)
        with self._lock:
            node = self.latest
        if node is None or self.clock() < self.retry_at:
            return
        wanted = (vdm.selected_config(node, self.settings.default_vgpu_config), self.config.digest,
                  _meta_field(node, "uid"))   # a Node deleted and created again is another uid
        lost = self.probe.check()
        if lost and wanted == self.reconciled:
            self._manager_restarted(node, wanted[0], lost)
        elif wanted == self.reconciled and self.clock() < self.next_resync and not self._labels_drifted(node) \
                and not self._holders_freed(wanted[0]):
            return
        self.reconcile(node, wanted)

    def _holder_check_in(self):
        """Seconds to the next check of the holders that refused the last reconcile; None when none did."""
        return max(0.05, self.next_holder_check - self.clock()) if self.refused_by else None

    def _holders_freed(self, name):
        """Whether a device the last reconcile was refused for is free now (checked every HOLDER_POLL seconds): the
        allocation record synced with PodResources (a deleted VM's pod frees its VF at once), then each device's
        VFIO group probed and the holder sources (record, DRA claims) read. Unsure (an error) is still held."""
        if not self.refused_by or self.clock() < self.next_holder_check:
            return False
        self.next_holder_check = self.clock() + HOLDER_POLL
        try:
            # the refused reconcile's holders (every holder source), not a new engine per check; their device facts
            # (groups, VFIO identities) read again, a few reads per device: VFs may have been re-enabled since
            holders = (self.reconcile_engine or self.engine()).in_use
            holders.forget()
            if self.device_plugin is not None:   # the record only: the served devices' health waits for the reconcile
                self.device_plugin.allocations.sync()
            else:
                self._prune_allocations()
            still = holders.recheck(sorted(self.refused_by), name_holders=False)
        except (EngineError, OSError) as exc:
            if str(exc) != self.holder_error:
                log("config %s: cannot tell whether the vGPUs that refused it are free: %s" % (name, exc))
            self.holder_error = str(exc)
            return False
        self.holder_error = None
        freed = sorted(self.refused_by - set(still))
        if freed:
            log("config %s: %s no longer held; reconciling" % (name, ", ".join(freed)))
        return bool(freed)

    def _labels_drifted(self, node):
        """The labels we own differ from what our last reconcile left, in a version we did not write
        (someone removed the state or a profile label): reconcile now, not at the next resync."""
        if self.written is None or _meta_field(node, "resourceVersion") in self.own_versions:
            return False
        if vdm.owned_labels(_meta(node, "labels")) == self.written:
            return False
        log("labels this agent owns changed on node %s; reconciling" % self.settings.node_name)
        return True

    def _manager_restarted(self, node, name, gpus):
        """The probe found GPUs without the vGPUs the last apply left: report it; the caller re-applies."""
        self.manager_restarts += 1
        self.telemetry.manager_restarts.inc()
        self.restart_pending = True
        message = ("vGPUs of config %s gone on GPU(s) %s (vGPU manager restarted?); re-applying"
                   % (name, ", ".join(gpus)))
        log(message)
        self._event(node, EVENT_MANAGER_RESTART, message, warning=True)

    # --- one reconcile ---------------------------------------------------------------------------
    def engine(self, claim_time=None):
        """A node engine for one reconcile; `claim_time`: the config's claim-time Declaration (the GPUs whose profiles
        DRA claims choose: not the layout's). What the writes will change is served Unhealthy by the device plugin
        before the first (`before_writes`)."""
        s = self.settings
        check_roots(s.sysfs_root, s.dev_root, s.proc_root)  # a mount lost while running fails the reconcile
        return vgpu_apply.NodeEngine(Sysfs(s.sysfs_root), CommandRunner(), s.dev_root, s.proc_root,
                                     sriov_manage_path=s.sriov_manage, kubelet_dir=s.kubelet_dir,
                                     claim_time_declaration=claim_time,
                                     before_writes=self.device_plugin.withdraw if self.device_plugin else None,
                                     smi_answers=self.smi_answers)

    def reconcile(self, node, wanted):
        name = wanted[0]
        self.checks += 1
        self.written, self.own_versions = None, set()
        self.reconcile_engine = self.planned = None
        self.telemetry.reconcile_started()
        try:
            state, profiles, reason, changed, applied = self._converge(node, name)
        except (KubeApiError, KubeUnavailable) as exc:
            self.telemetry.reconcile_aborted()
            delay = kube.retry_delay(exc, self.api_backoff.next())
            log("config %s: API server: %s; trying again in %.1f s" % (name, exc, delay))
            self.reconciled, self.next_resync = None, self.clock() + delay
            self.retry_at = self.next_resync
            return
        self.api_backoff.reset()
        self.reconciled, self.next_resync = wanted, self.clock() + self.settings.resync_interval
        if self.dra_plugin is not None:     # the node as it is now, applied or not, reaches the slices
            self.dra_plugin.reconciled(_meta_field(node, "uid"), *(applied or (None, None)), planned=self.planned)
        if applied is not None:
            # armed once the DRA plugin knows this apply's claim-time offers: before, its claim_time_vfs (the probe's
            # `claimed`) names no VF on the first reconcile, so a claim's VF left untyped on purpose (a process holds
            # it) would not be passed over and would read as a vGPU-manager restart at the first check
            self.probe.arm(applied[1])
        if state == vdm.FAILED and self.restart_pending:
            # the manager may still be coming back: retry sooner than the resync, backing off
            self.next_resync = self.clock() + self.restart_backoff.next()
        elif state != vdm.FAILED:
            self.restart_pending = False
            self.restart_backoff.reset()
        if state == vdm.FAILED:
            log("config %s: failed: %s" % (name, reason))
        elif changed:
            log("config %s: applied (%s)" % (name, _profiles_text(profiles)))
        # the counts read the node through this reconcile's engine: its walk of /proc and groups stand
        counts = node_vgpu_counts(lambda: self.reconcile_engine or self.engine(), log)
        self.telemetry.reconciled(name, state, changed, counts)
        self.write_status(state, name, reason)

    def _converge(self, node, name):
        """(state, profiles, reason, changed, applied); labels and Events written on the way. `applied`: (sysfs,
        apply result) of a successful apply, the kubelet plugins' inventory; None after a failure."""
        s = self.settings
        changing = []

        def before_changes():  # validated, and something will be written: VDM's pending + pause
            log("config %s: applying" % name)
            changing.append(self._patch(node, vdm.outcome_patch(_meta(node, "labels"), {}, vdm.PENDING)))
            paused, patched = self._pause(changing[-1])
            changing.append(patched)
            if paused and s.operand_namespace:   # also labels a failed or killed earlier try paused
                self._wait_for_operands(paused)

        engine = entries = None
        self.refused_by = set()
        try:
            try:
                declared, broken = self.config.claim_time(), None
            except EngineError as exc:      # reported after the layout's own errors, which name the file first
                declared, broken = None, exc
            engine = self.reconcile_engine = self.engine(declared)
            self._plugin_check(engine)
            entries = self.config.entries(name)
            if broken is not None:
                raise broken
            if engine.claim_time_declaration:       # served by the DRA driver only (DEVICE_PLUGIN_GPUS naming one: an error)
                every = vgpu_layout.nvidia_gpus(engine.sysfs)
                agent_settings.check_claim_time(s, every, engine.claim_time_declaration.select(every))
            result = vgpu_apply.apply(engine, entries, mixed_size=s.mixed_size, lock_timeout=s.lock_timeout,
                                      enable_vfs=True, wait_timeout=s.wait_timeout, before_changes=before_changes,
                                      stop=self.stop)
        except (KubeApiError, KubeUnavailable):
            raise  # retried with backoff; the retry's finish restores operands this one paused
        except EngineError as exc:
            self.probe.disarm()
            reason = vdm.reason_text(exc)
            self._watch_holders(name, exc)
        except Exception as exc:  # a bug must not crash-loop the pod: report it like any failure
            log(traceback.format_exc().rstrip())
            self.probe.disarm()
            reason = vdm.reason_text("internal error: %s: %s" % (type(exc).__name__, exc))
        else:
            self.refused_by = set()
            if self.device_plugin is not None:
                self.device_plugin.applied(engine.sysfs, result)
            profiles = profiles_in_use(result["resources"])
            self._report_skipped(node, name, result.get("reserved") or [])
            if result["warnings"] != self.warned:   # e.g. a claim's VF a restart reset that a process holds
                for warning in result["warnings"]:
                    log("config %s: warning: %s" % (name, warning))
                self.warned = list(result["warnings"])
            self.hand_over_to_boot(name)
            self._finish(changing[-1] if changing else node, vdm.SUCCESS, profiles, None, applied=bool(changing),
                         config=name)
            return vdm.SUCCESS, profiles, None, bool(changing), (engine.sysfs, result)
        self._serve_programmed(engine, entries)
        if engine is not None and engine.offers_planned:   # a refused layout leaves the claim-time GPUs' offers good
            self.planned = (engine.sysfs, engine.modes.result())
        self._finish(changing[-1] if changing else node, vdm.FAILED, None, reason, applied=bool(changing),
                     config=name)
        return vdm.FAILED, None, reason, False, None

    def _watch_holders(self, name, exc):
        """After a failed reconcile: the held devices its error was refused for (`EngineError.held`: a VF or mdev
        the plan found held, or one that became held since, HeldSincePlan) are watched (_holders_freed); none:
        nothing is watched."""
        refused = set(exc.held)
        if refused and refused != self.refused_by:
            log("config %s: refused for held vGPU(s) %s; checking every %g s whether they are freed"
                % (name, ", ".join(sorted(refused)), HOLDER_POLL))
        self.refused_by = refused
        self.next_holder_check = self.clock() + HOLDER_POLL

    def _report_skipped(self, node, name, skipped):
        """A Normal Event naming the GPUs passed through that the config leaves alone, when that set changes."""
        if skipped and skipped != self.skipped:
            self._event(node, EVENT_SKIPPED, "config %s: left alone: %s" % (
                name, "; ".join("%s %s" % (s["address"], s["reason"]) for s in skipped)), warning=False)
        self.skipped = skipped

    def _plugin_check(self, engine):
        """The served vGPUs' health as the node says now, before the reconcile may change them; the allocation
        record pruned against PodResources (by the device plugin, or here when it is off)."""
        if self.device_plugin is not None:
            self.device_plugin.check(engine.sysfs)   # its AllocationRecord synced first
        else:
            self._prune_allocations()

    def _prune_allocations(self):
        """The device plugin off (a DRA-only node, or its GPUs switched to DRA) and an allocation record left by an
        earlier one: still pruned against PodResources at every reconcile, so entries of pods long gone do not hold
        their VFs forever (kubelet/pod_resources.py; nothing is dropped while PodResources cannot be read)."""
        if self.allocations is None:
            path = pod_allocations.record_path(self.settings.kubelet_dir)
            if not (os.path.exists(path) or pod_allocations.journal_pending(path)):
                return
            try:    # grpc lives in the agent image only
                from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet import pod_resources
            except ImportError as exc:
                log("allocation record %s not pruned (needs grpcio and protobuf: %s); its vGPUs stay held"
                    % (path, exc))
                return
            self.allocations = pod_resources.AllocationRecord(self.settings.kubelet_dir, log,
                                                              grace=self.settings.kubelet_restart_grace)
        self.allocations.sync()

    def _serve_programmed(self, engine, entries):
        """After a failed apply the device plugin serves what the node has programmed (the DRA driver does the
        same in its `reconciled`): read back from sysfs on the GPUs the layout selects, or on every GPU when the
        layout cannot say (unknown config, broken file: `entries` None); never on a claim-time GPU (its VFs are
        typed by DRA claims at prepare time: `_claim_time_gpus`). The device plugin keeps to DEVICE_PLUGIN_GPUS
        itself (device_plugin.devices_programmed `serves`)."""
        if self.device_plugin is None or engine is None:
            return
        sysfs = engine.sysfs
        try:
            every = vgpu_layout.nvidia_gpus(sysfs)
        except EngineError:
            every = []
        gpus = {gpu.address for gpu in every}
        try:
            if entries is not None:
                gpus = set(vgpu_layout.resolve(entries, every, sysfs))
        except EngineError:
            pass
        claim_time = self._claim_time_gpus(engine, every)
        if claim_time is None:
            log("device plugin: serving nothing programmed: which GPUs are claim-time cannot be told")
        self.device_plugin.not_applied(sysfs, gpus - claim_time if claim_time is not None else set(), engine.names)

    def _claim_time_gpus(self, engine, gpus):
        """The claim-time GPUs: those the last apply recorded (claim_time_layout's modes file) and those the config
        file declares where it can be read; None when the record cannot be read (unknown: none may be served)."""
        try:
            found = set(claim_time_layout.read_modes(engine.modes_file))
        except EngineError as exc:
            log("%s" % exc)
            return None
        try:
            found.update(self.config.claim_time().select(gpus))
        except EngineError:
            pass        # the file cannot be read: the record is what the last apply declared
        return found

    def hand_over_to_boot(self, name):
        """The boot unit and the vGPU manager image re-apply what this agent last applied (node/boot/handover.py):
        the config goes to the hand-over file after each success. A failure to write is logged, never fatal."""
        path = self.settings.handover_file
        if not path:
            return
        try:
            document = self.config.document()
            configs = document.get("vgpu-configs") if isinstance(document, dict) else None
            if isinstance(configs, dict) and name in configs:
                handover.write(path, name, configs[name])  # False: no boot unit on this node, nothing to hand over
            else:
                log("config %s: not handed over to the boot unit: %s is no vgpu-configs document"
                    % (name, self.settings.config_file))
        except (EngineError, OSError) as exc:
            log("config %s: cannot hand it over to the boot unit in %s: %s" % (name, path, exc))

    def _patch(self, node, patch):
        """Merge-patch our Node; returns the updated object (or `node` when there is nothing to do)."""
        if not patch:
            return node
        return self._wrote(self.api.patch_node(self.settings.node_name, patch))

    def _wrote(self, node):
        """Remember the resourceVersion our write produced (its watch event is no drift)."""
        version = _meta_field(node, "resourceVersion")
        if version:
            self.own_versions.add(version)
        return node

    def _pause(self, node):
        """Pause the operands whose deploy label is "true" (resourceVersion-guarded, 409 retried);
        returns (every operand label now paused, the Node as the API server returned it last): those
        paused here and those an earlier try left paused (a pod list that failed, an agent killed
        mid-wait), whose pods must be gone too."""
        for attempt in range(CONFLICT_RETRIES):
            labels = _meta(node, "labels")
            patch = vdm.pause_patch(labels)
            already = [key for key in vdm.OPERAND_LABELS if labels.get(key) == vdm.PAUSED]
            if not patch:
                return already, node
            try:
                version = ((node or {}).get("metadata") or {}).get("resourceVersion")
                pause = {"metadata": {"resourceVersion": version, "labels": patch}}
                node = self._wrote(self.api.patch_node(self.settings.node_name, pause))
                log("paused %s" % ", ".join(sorted(patch)))
                return sorted(set(patch) | set(already)), node
            except KubeApiError as exc:
                if exc.status != 409 or attempt == CONFLICT_RETRIES - 1:
                    raise
                node = self.api.get_node(self.settings.node_name)
        return [], node

    def _wait_for_operands(self, paused):
        """Until no pod of the paused operands runs on this node (VDM: the device plugin must not
        advertise VFs while they change); OperandWaitError after OPERAND_WAIT_TIMEOUT."""
        s = self.settings
        deadline = self.clock() + s.operand_wait_timeout
        for key in paused:
            selector = vdm.OPERAND_PODS[key]
            while self.api.list_pods(s.operand_namespace, s.node_name, selector):
                if self.clock() >= deadline:
                    what = (s.operand_wait_timeout, key.rpartition(".")[2], selector, s.operand_namespace, s.node_name)
                    raise vdm.OperandError("timed out after %g s waiting for the %s pods (%s in %s) on node %s "
                                           "to terminate" % what)
                if self.stop.wait(1.0):
                    what = (key.rpartition(".")[2], selector, s.node_name)
                    raise vdm.OperandError("stopped (SIGTERM) while waiting for the %s pods (%s) on node %s to "
                                           "terminate; nothing was written" % what)
            log("%s pods are gone" % selector)

    def _finish(self, current, state, profiles, reason, applied, config=None):
        """One patch: state, reason, profile labels, and every operand still paused put back.

        `current`: the Node as our own last patch returned it (the API server's object after the write),
        or as the watch delivered it when this reconcile wrote nothing yet: no re-read."""
        labels = _meta(current, "labels")
        patch = vdm.outcome_patch(labels, _meta(current, "annotations"), state, profiles, reason) or {"metadata": {}}
        restore = vdm.restore_patch(labels)
        if restore:
            patch["metadata"].setdefault("labels", {}).update(restore)
            log("restored %s" % ", ".join(sorted(restore)))
        final = self._patch(current, patch if patch["metadata"] else None)
        self._wrote(final)
        self.written = vdm.owned_labels(_merged_labels(labels, patch))
        if state == vdm.FAILED:
            self._event(current, EVENT_FAILED, "config %s: %s" % (config, reason), warning=True)
        elif applied:
            self._event(current, EVENT_APPLIED, "config %s applied: %s" % (config, _profiles_text(profiles)),
                        warning=False)

    def _event(self, node, reason, message, warning):
        if (reason, message) == self.last_event and warning:
            return  # the same failure again (a resync retry): one Event is enough
        self.last_event = (reason, message)
        self.serial += 1
        try:
            self.api.create_event(self.namespace, vdm.event(node, self.namespace, reason, message, warning,
                                                            COMPONENT, _now(), self.serial))
        except (KubeApiError, KubeUnavailable) as exc:
            log("cannot create the Event (%s): %s" % (reason, exc))

    def write_status(self, state, config, reason):
        path = self.settings.status_file
        if not path:
            return
        try:   # read by the probes and people: never half a file; rewritten every reconcile, so no fsync
            write_file(path, json.dumps({"state": state, "config": config, "reason": reason, "time": _now(),
                                         "pid": os.getpid(), "checks": self.checks, "reserved": self.skipped,
                                         "manager_restarts": self.manager_restarts}), sync=RENAME)
        except OSError as exc:
            log("cannot write the status file %s: %s" % (path, exc.strerror))


def _meta_field(node, key):
    return ((node or {}).get("metadata") or {}).get(key)


def _merged_labels(labels, patch):
    """Labels after a merge patch (None removes a key)."""
    merged = dict(labels)
    for key, value in ((patch or {}).get("metadata") or {}).get("labels", {}).items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    return merged


def _profiles_text(profiles):
    return ", ".join("%d x %s" % (n, p) for p, n in sorted((profiles or {}).items())) or "no vGPUs"


def main(args):
    """`accelops-vgpu agent`: settings from flags/environment, credentials, then run until
    SIGTERM/SIGINT (exit 0). Bad settings or credentials raise (the CLI exits 2, one line)."""
    settings = agent_settings.resolve(args)
    check_roots(settings.sysfs_root, settings.dev_root, settings.proc_root)  # a typo is no empty node
    if settings.kubeconfig:
        credentials = kube.from_kubeconfig(settings.kubeconfig)
    else:
        credentials = kube.in_cluster()
    if settings.lock_key:
        os.environ[LOCK_KEY_ENV] = settings.lock_key  # the engine names the node lock after it
    telemetry = Telemetry(settings)
    api = telemetry.instrument(kube.KubeClient(credentials))  # API errors and the watch counted
    answers = mig.FixedAnswers()     # one for the reconciles and the DRA driver's full reads
    device_plugin, dra_plugin = kubelet_plugins(settings, api, answers)
    agent = Agent(settings, api, settings.namespace or credentials.namespace or "default",
                  device_plugin=device_plugin, dra_plugin=dra_plugin, telemetry=telemetry, smi_answers=answers)
    if settings.metrics_port is not None:  # /metrics, /healthz, /readyz (agent/http_endpoint.py)
        try:
            endpoint = HttpEndpoint(telemetry, settings.metrics_bind_address, settings.metrics_port).start()
        except OSError as exc:
            raise agent_settings.SettingsError("cannot listen on %s port %s (METRICS_BIND_ADDRESS, METRICS_PORT): %s"
                                               % (settings.metrics_bind_address, settings.metrics_port,
                                                  exc.strerror)) from None
        log("serving /metrics, /healthz and /readyz on %s port %d" % (endpoint.address, endpoint.port))
    relay_signals(agent.shutdown)
    return agent.run()


def kubelet_plugins(settings, api, smi_answers=None):
    """(device plugin, DRA plugin), each started, or None where the settings leave it off. The DRA plugin gets the
    node's holders (every holder source, no node engine) for claim-time Prepare and Unprepare."""
    sysfs = Sysfs(settings.sysfs_root)
    gpus = vgpu_layout.nvidia_gpus(sysfs) if settings.device_plugin or settings.dra_driver else []
    agent_settings.check_split(settings, gpus)   # DEVICE_PLUGIN_GPUS and DRA_DRIVER_GPUS: no GPU in both
    device_plugin = dra_plugin = None
    if settings.device_plugin:
        # gRPC lives in the agent image only: imported when the agent serves the kubelet
        try:
            from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet import vgpu_device_plugin
        except ImportError as exc:
            raise agent_settings.SettingsError("DEVICE_PLUGIN=true needs the Python packages grpcio and protobuf "
                                               "(the agent image has them): %s" % exc) from None
        device_plugin = vgpu_device_plugin.VgpuDevicePlugin(
            settings.kubelet_dir, log, serves=agent_settings.served(settings.device_plugin_gpus, gpus),
            grace=settings.kubelet_restart_grace).start()
    if settings.dra_driver:
        try:
            from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import agent_plugin
        except ImportError as exc:
            raise agent_settings.SettingsError("DRA_DRIVER=true needs the Python packages grpcio and protobuf "
                                               "(the agent image has them): %s" % exc) from None
        boot_id = claim_holders.read_boot_id(settings.proc_root)

        def type_names():     # a full read's names: the reconciles' fixed nvidia-smi answers, not asked again
            runner = CommandRunner()
            return vgpu_apply.TypeNames(sysfs, runner, smi=mig.cached_smi(runner, smi_answers, sysfs, boot_id))
        dra_plugin = agent_plugin.VgpuDraPlugin(
            settings, api, lambda timeout: node_lock(settings.sysfs_root, timeout), log, sysfs,
            kubelet_holders.node_holders(sysfs, settings.dev_root, settings.proc_root, settings.kubelet_dir),
            type_names, serves=agent_settings.served(settings.dra_driver_gpus, gpus), runner=CommandRunner()).start()
    return device_plugin, dra_plugin


def relay_signals(stop, signals=(signal.SIGTERM, signal.SIGINT)):
    """Handlers for `signals` that have `stop()` called from a thread of its own; returns the previous handlers.

    A Python handler runs in the main thread between two bytecodes, and the agent's main thread waits in
    Event.wait, which holds the event's condition lock (not reentrant) for a moment at every wake-up: a handler
    that sets an event right then waits for itself, and the pod hangs until the kubelet's SIGKILL (the P5
    benchmark caught one, an agent stopped with SIGTERM that never exited). The handler only writes a byte to a
    pipe, which takes no lock; a relay thread reads it and calls `stop`."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)

    def relay():
        while os.read(read_fd, 1):
            stop()

    threading.Thread(target=relay, name="signals", daemon=True).start()

    def handler(*dummy):
        try:
            os.write(write_fd, b"s")
        except BlockingIOError:
            pass    # the pipe is full of earlier signals: the relay has enough to stop on
    return dict((sig, signal.signal(sig, handler)) for sig in signals)
