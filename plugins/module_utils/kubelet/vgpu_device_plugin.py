# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node agent's device plugin: the node's vGPUs (device_plugin, plain data) served to the kubelet
(device_plugin_server, gRPC). The agent imports this module only when it serves the kubelet (DEVICE_PLUGIN).

The agent calls, from its reconcile thread:
- `check(sysfs)` before each reconcile: the allocation record synced with the kubelet's PodResources (a device
  allocated to a pod stays held until no live pod has it, kubelet/pod_resources.py); the served devices' health as the node says now (a vGPU-manager restart
  that reset the types, a VF gone or off the nvidia driver -> Unhealthy); a few reads per device, no bus scan;
- `applied(sysfs, result)` after a layout was applied or re-asserted: the devices are the engine's result (one
  inventory for the reconcile and the plugin), each Healthy; resources the node no longer has stop being served;
- `not_applied(sysfs, gpus, type_names)` after a reconcile that failed: what is served stays, its health read
  again (the failure may have changed part of the node); when nothing was served yet (the agent just started and
  its first layout is refused, e.g. a VM holds a VF), the vGPUs sysfs shows programmed on the GPUs the layout
  selects (`gpus`, None: every GPU), each Healthy when its VF is on the nvidia driver with its type: the kubelet
  keeps the capacity a rolled DaemonSet would otherwise drop. The node is read then as the DRA driver reads it
  (node facts -> kubelet/dra/devices.inventory; `type_names`: the engine's type-name cache).
- `withdraw(names)` from the engine right before a reconcile's first write (vgpu_apply.NodeEngine.before_writes): the
  vGPUs it will change are served Unhealthy from then on, so the kubelet allocates none of them while they change;
  the next `applied` or `check` serves them as the node says again. Allocate also reads each vGPU's type again under
  the allocation record's lock, which the engine holds around each VF's re-check and write
  (device_plugin.still_served).
`serves(gpu address)`: the GPUs this plugin serves (DEVICE_PLUGIN_GPUS; None: all), so that the DRA driver can
serve the others without a vGPU offered twice.
A thread watches the sockets (a kubelet restart wipes them: served and registered again).
"""

from __future__ import annotations

import os
import threading

from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet import device_plugin, pod_resources
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.device_plugin_server import DevicePluginHost
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import devices as dra_devices
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.paths import KubeletPaths
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import pod_allocations
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import facts

ENDPOINT_PREFIX = "accelops-vgpu"


class KubeletDirError(EngineError):
    """The kubelet directory setting points at no kubelet (exit 2)."""


class VgpuDevicePlugin:
    def __init__(self, kubelet_dir, log, watch_interval=1.0, serves=None, grace=pod_resources.GRACE):
        self.serves = serves
        self.paths = KubeletPaths(kubelet_dir)
        self.log = log
        self.host = DevicePluginHost(self.paths, ENDPOINT_PREFIX, log, watch_interval)
        self.devices = None      # None: nothing published yet (no reconcile finished)
        self.types = None        # device_plugin.CurrentTypes: where Allocate reads a vGPU's current type
        # every Allocate recorded before it answers, until the kubelet lists no live pod with the device
        self.allocations = pod_resources.AllocationRecord(kubelet_dir, log, grace=grace)
        self._stop = threading.Event()

    def start(self):
        if not os.path.isdir(self.paths.device_plugins):
            raise KubeletDirError("kubelet directory %s: no device-plugins/ directory (KUBELET_DIR or --kubelet-dir "
                                  "names the kubelet's root directory, e.g. /var/lib/k0s/kubelet on k0s)"
                                  % self.paths.root)
        try:    # before anything is served: the engine's VF writes take this lock when they find it
            pod_allocations.create_lock(self.allocations.path)
        except OSError as exc:
            raise KubeletDirError("kubelet directory %s: cannot create the allocation record's lock beside %s: %s"
                                  % (self.paths.root, self.allocations.path, exc)) from None
        threading.Thread(target=self.host.watch, args=(self._stop,), name="device-plugin-watch", daemon=True).start()
        self.log("device plugin: serving the kubelet at %s" % self.paths.device_plugins)
        return self

    def applied(self, sysfs, result):
        self._node(sysfs)
        self._publish(device_plugin.devices_from_apply(sysfs, result, self.serves))

    def not_applied(self, sysfs, gpus=None, type_names=None):
        self._node(sysfs)
        if self.devices is None:
            found = dra_devices.inventory(sysfs, facts.gather(sysfs, {}, type_names))
            devices = device_plugin.devices_programmed(sysfs, found, gpus, self.serves)
            self.log("device plugin: no layout applied yet; serving the %d vGPU(s) programmed on the node" % len(devices))
            self._publish(devices)
        else:   # health only: the reconcile synced the record at its start, and a damaged one must not stop this
            self._health(sysfs)

    def check(self, sysfs):
        self._node(sysfs)
        try:
            self.allocations.sync()
        finally:   # a damaged record fails the reconcile; the served health (withdrawn vGPUs) is read again anyway
            self._health(sysfs)

    def _health(self, sysfs):
        if self.devices:
            self._publish(device_plugin.check_health(sysfs, self.devices))

    def withdraw(self, names):
        """The served vGPUs among `names` (VF addresses, mdev UUIDs a reconcile is about to write) Unhealthy now."""
        names = set(names)
        devices = [d._replace(healthy=False) if d.id in names and d.healthy else d for d in self.devices or ()]
        withdrawn = sorted(d.id for d, old in zip(devices, self.devices or ()) if d.healthy != old.healthy)
        if withdrawn:
            self.log("device plugin: %d vGPU(s) Unhealthy while the reconcile changes them: %s"
                     % (len(withdrawn), ", ".join(withdrawn)))
            self.devices = devices
            self.host.publish(self._views(devices))

    def _node(self, sysfs):
        if self.types is None or self.types.sysfs.root != sysfs.root:
            self.types = device_plugin.CurrentTypes(sysfs)

    def _views(self, devices):
        if self.types is not None:
            self.types.keep(set(d.id for d in devices))
        return device_plugin.resource_views(devices, self.allocations.add, self.types)

    def _publish(self, devices):
        before = dict((d.id, d) for d in self.devices or ())
        for device in devices:
            old = before.get(device.id)
            if old is not None and old.resource == device.resource and old.healthy != device.healthy:
                self.log("device plugin: %s %s is %s" % (device.resource, device.id,
                                                         "Healthy" if device.healthy else "Unhealthy"))
        if devices != self.devices:
            self.devices = devices
            self.host.publish(self._views(devices))

    def close(self):
        self._stop.set()
        self.host.close()
