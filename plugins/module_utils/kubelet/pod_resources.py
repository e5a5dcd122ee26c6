# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The device plugin's allocations, held from Allocate until the pod is gone.

The kubelet publishes the devices of its live pods through the PodResources API v1 [kubernetes/kubelet
pkg/apis/podresources/v1/api.proto: PodResourcesLister.List on `<kubelet dir>/pod-resources/kubelet.sock`; List
answers the active pods only, ContainerDevices{resource_name, device_ids}]. The kubelet calls the plugin's Allocate
and records the devices for the pod only after Allocate returned (pkg/kubelet/cm/devicemanager/manager.go
allocateContainerResources: podDevices.insert after the plugin's answer).

AllocationRecord keeps node/holders/pod_allocations.py's record (the files the node engine, CLI, modules and boot unit read):
- `add(resource, ids)` from Allocate: journal lines appended and flushed before Allocate answers (a write that
  fails fails the Allocate: a device is never handed out unrecorded);
- `sync()` at every reconcile: List; a recorded device no live pod holds is free again at once, with two
  exceptions. A device the kubelet never listed that was allocated less than `grace` seconds ago is kept (the
  kubelet lists it only once Allocate returned). And while the kubelet restarts every recorded device is kept: a
  kubelet that just started lists no pod until its pod sources synced (server_v1.go List answers the pod manager's
  pods), so its List says nothing about what is free. A restart is told by the kubelet's sockets, which it makes
  anew at start (its PodResources socket and its device-plugin registration socket, `device-plugins/kubelet.sock`):
  one younger than `grace` seconds, or one whose identity changed since this record's last sync less than `grace`
  seconds ago (its ctime when that lies between the two syncs, else the sync that saw it), is a restart under
  way. A device a live pod holds is recorded with the pod's name (also one allocated before this record
  existed). PodResources unreadable: nothing is dropped.
  Why not a grace for every pod that goes away: a VF whose VM was deleted must be free at the next sync, so that
  a layout refused for it converges within seconds (agent/agent.py's holder watch), not a grace later.
  The read and the rewrite happen under the record's flock (pod_allocations.rewrite), and so does `add`'s append:
  another process's Allocate (a second agent during a rolled DaemonSet) waits for the rewrite instead of being
  lost by it. The waits are bounded: an Allocate fails after pod_allocations.APPEND_WAIT, a sync is skipped
  (nothing dropped) after REWRITE_WAIT.
Needs grpcio/protobuf (the agent image); the node side reads the record with the standard library only.
"""

from __future__ import annotations

import os
import threading
import time

try:
    import grpc
except ImportError:  # the agent image ships grpcio; transport.require_grpc() says so before any use
    grpc = None

from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet import transport
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.api import podresources_v1_pb2 as pb
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.api import podresources_v1_pb2_grpc as pb_grpc
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.errors import AllocationError
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.paths import KubeletPaths
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import pod_allocations

LIST_TIMEOUT = 10.0
RESOURCE_DOMAIN = "nvidia.com/"   # vgpu_types.resource_name: the resources whose live devices are recorded
GRACE = 60.0    # seconds a fresh allocation stays without the kubelet listing it; also a kubelet restart's window


class PodResourcesError(EngineError):
    """The kubelet's PodResources API cannot be read; the message names the socket."""


def socket_path(kubelet_dir):
    return os.path.join(kubelet_dir, "pod-resources", "kubelet.sock")


def live_devices(path, timeout=LIST_TIMEOUT):
    """{device ID: (resource name, "namespace/name")} of every device of an nvidia.com/ resource the kubelet lists
    for a live pod (whichever plugin allocated it: a VF a live pod holds is held)."""
    transport.require_grpc("PodResources client")
    try:
        with grpc.insecure_channel(transport.unix_target(path)) as channel:
            response = pb_grpc.PodResourcesListerStub(channel).List(pb.ListPodResourcesRequest(), timeout=timeout)
    except grpc.RpcError as exc:
        raise PodResourcesError("PodResources List at %s failed: %s: %s" % (path, exc.code().name, exc.details()))
    found = {}
    for pod in response.pod_resources:
        for container in pod.containers:
            for devices in container.devices:
                if not devices.resource_name.startswith(RESOURCE_DOMAIN):
                    continue
                for device_id in devices.device_ids:
                    found[device_id] = (devices.resource_name, "%s/%s" % (pod.namespace, pod.name))
    return found


class AllocationRecord:
    """The record of one kubelet directory, owned by this process (the agent's device plugin)."""

    def __init__(self, kubelet_dir, log=lambda message: None, grace=GRACE, clock=time.time):
        self.path = pod_allocations.record_path(kubelet_dir)
        self.socket = socket_path(kubelet_dir)
        self.sockets = (self.socket, KubeletPaths(kubelet_dir).kubelet_socket)   # made anew by a starting kubelet
        self.log, self.grace, self.clock = log, grace, clock
        self._lock = threading.Lock()
        self._failing = None    # the last PodResources error logged (logged once until it changes)
        self._seen = None       # the kubelet sockets' identities at the last sync
        self._changed_at = None  # when they changed, as far as a sync can tell (clock)
        self._checked_at = None  # when the last sync read them (clock)
        self._restarting = False

    def add(self, resource, ids, check=None):
        """Record `ids` of `resource` as allocated, durably (a journal line each, flushed); AllocationError (the
        Allocate fails) when it cannot. `check()` runs under the record's lock first and may refuse (raise
        AllocationError): a reconcile retypes a VF only under that lock (pod_allocations.vf_write_lock)."""
        with self._lock:
            try:
                pod_allocations.append(self.path, resource, ids, self.clock(), check=check)
            except OSError as exc:
                raise AllocationError("resource %s: cannot record the allocation of %s in %s: %s" % (
                    resource, ", ".join(ids), pod_allocations.journal_path(self.path), exc)) from None

    def kubelet_restarting(self):
        """Whether the kubelet (re)started less than `grace` seconds ago, as its sockets say: one made less than
        `grace` seconds ago (its change time), or one whose identity changed since the last call less than `grace`
        seconds ago: as its change time says when that lies between the two calls (syncs run per reconcile: a
        restart minutes before this one is over), else from this call (unsure). A change time in the future (the
        clock stepped back since) is unsure too: one grace from the first call that sees it, not until the clock
        catches up (hours of every recorded vGPU held)."""
        now = self.clock()
        identities = tuple(transport.socket_identity(path) for path in self.sockets)
        if self._seen is not None and identities != self._seen:
            made = [i[2] / 1e9 for i, old in zip(identities, self._seen) if i is not None and i != old]
            self._changed_at = max(made) if made and all(self._checked_at <= m <= now for m in made) else now
        elif self._seen is None and any(i is not None and i[2] / 1e9 > now for i in identities):
            self._changed_at = now
        self._seen, self._checked_at = identities, now
        young = any(i is not None and 0 <= now - i[2] / 1e9 < self.grace for i in identities)
        return young or (self._changed_at is not None and now - self._changed_at < self.grace)

    def sync(self):
        """Drop what no live pod holds, name the pods of what they hold; False when PodResources could not be read
        (then nothing changed: what was allocated stays held). A damaged record raises (names the file)."""
        try:
            live = live_devices(self.socket)
        except (PodResourcesError, transport.TransportError) as exc:
            if str(exc) != self._failing:
                self.log("device plugin: %s; the vGPUs it allocated stay held" % exc)
            self._failing = str(exc)
            return False
        self._failing = None
        restarting = self.kubelet_restarting()
        if restarting != self._restarting:
            self.log("device plugin: the kubelet restarted (its sockets are new); every recorded vGPU stays held "
                     "for %g s while it lists its pods again" % self.grace if restarting else
                     "device plugin: the kubelet's restart window is over; its List says again what is free")
            self._restarting = restarting
        with self._lock:
            try:   # under the record's flock from the read to the rewrite: another process's Allocate waits
                pod_allocations.rewrite(self.path, lambda devices: self._prune(devices, live, restarting))
            except OSError as exc:
                self.log("device plugin: allocation record %s not pruned: %s; the vGPUs it lists stay held"
                         % (self.path, exc))
                return False
        return True

    def _prune(self, devices, live, restarting):
        """The devices to keep of `devices` (the record) given `live` (PodResources); None: nothing to write."""
        now, kept = self.clock(), {}
        for device_id, entry in devices.items():
            # never listed and allocated moments ago: the kubelet lists a device only once Allocate returned
            fresh = not entry.get("pod") and now - float(entry.get("allocatedAt") or 0) < self.grace
            if device_id in live or restarting or fresh:
                kept[device_id] = entry
            else:
                self.log("device plugin: %s %s is free again (no live pod holds it)"
                         % (entry["resource"], device_id))
        for device_id, (resource, pod) in live.items():
            entry = dict(kept.get(device_id) or {"allocatedAt": now})
            entry.update(resource=resource, pod=pod)
            kept[device_id] = entry
        if kept != devices or pod_allocations.journal_pending(self.path):
            return kept     # the snapshot written; the journal emptied
        return None
