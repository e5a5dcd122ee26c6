# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The DRA kubelet plugin's gRPC side: the driver's logic (driver.DraDriver) served to the kubelet.

Sockets (k8s.io/dynamic-resource-allocation kubeletplugin defaults, one kubelet-dir setting):
- service `<kubelet dir>/plugins/<driver>/dra.sock`: `k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin` and
  `...dra.v1beta1.DRAPlugin` (the same calls; v1beta1 for kubelets before 1.34), and the health
  stream `v1alpha1.DRAResourceHealth` / `v1.DRAResourceHealth` (KEP-4680);
- registration `<kubelet dir>/plugins_registry/<driver>-reg.sock`: pluginregistration.Registration
  (kubelet/transport.py), GetInfo = {type "DRAPlugin", name <driver>, endpoint <service socket>,
  supported_versions ["v1.DRAPlugin", "v1beta1.DRAPlugin", "v1alpha1.DRAResourceHealth"]}: the
  kubelet's plugin watcher dials the service only after GetInfo.
The service socket is bound before the registration socket appears, as the helper does. Needs
grpcio (the agent image); the node CLI imports this module only when the DRA driver is enabled.
"""

from __future__ import annotations

import os
import threading
import time

from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet import transport
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.api import dra_health_v1_pb2 as health_v1
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.api import dra_health_v1_pb2_grpc as health_v1_grpc
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.api import dra_health_v1alpha1_pb2 as health_v1a1
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.api import (
    dra_health_v1alpha1_pb2_grpc as health_v1a1_grpc)
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.api import dra_v1_pb2 as dra_v1
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.api import dra_v1_pb2_grpc as dra_v1_grpc
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.api import dra_v1beta1_pb2 as dra_v1beta1
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.api import dra_v1beta1_pb2_grpc as dra_v1beta1_grpc
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.claims import ClaimRef
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.health import device_health

PLUGIN_TYPE = "DRAPlugin"
SERVICE_SOCKET = "dra.sock"
SUPPORTED_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin", "v1alpha1.DRAResourceHealth")
HEALTH_POLL = 1.0       # a health stream looks at its client this often while nothing changes
# The kubelet marks a device Unknown when its last update is older than the device's
# health_check_timeout_seconds, 30 s when that is 0 (pkg/kubelet/cm/dra/healthinfo.go DefaultHealthTimeout,
# getHealthInfo): every stream sends the full list again every HEALTH_RESEND seconds, changed or not, and says
# HEALTH_TIMEOUT, so a resend that comes late (a busy node) still arrives in time; both stay under 30 s, for a
# kubelet that ignores the field.
HEALTH_RESEND = 10.0
HEALTH_TIMEOUT = 25


def _refs(request):
    return [ClaimRef(claim.namespace, claim.name, claim.uid) for claim in request.claims]


class DraServicer:
    """NodePrepareResources / NodeUnprepareResources of one API version (`pb2`: its messages)."""

    def __init__(self, pb2, driver):
        self.pb2, self.driver = pb2, driver

    def NodePrepareResources(self, request, context):  # noqa: N802 (gRPC method name)
        response = self.pb2.NodePrepareResourcesResponse()
        for uid, result in self.driver.prepare(_refs(request)).items():
            entry = response.claims[uid]
            entry.error = result.error
            for device in result.devices:
                entry.devices.add(request_names=device["requests"], pool_name=device["pool"],
                                  device_name=device["device"], cdi_device_ids=device["cdiIDs"])
        return response

    def NodeUnprepareResources(self, request, context):  # noqa: N802
        response = self.pb2.NodeUnprepareResourcesResponse()
        for uid, error in self.driver.unprepare(_refs(request)).items():
            response.claims[uid].error = error
        return response


class HealthHub:
    """The latest device health list and a version counter the streams wait on."""

    def __init__(self):
        self.condition = threading.Condition()
        self.version, self.health, self.stopped = 0, [], False

    def update(self, health):
        with self.condition:
            if health != self.health or not self.version:
                self.health, self.version = list(health), self.version + 1
                self.condition.notify_all()

    def wait(self, seen, timeout):
        """(health, version) once the version is newer than `seen`, else (None, seen) after `timeout`."""
        with self.condition:
            if self.version <= seen and not self.stopped:
                self.condition.wait(timeout)
            if self.version > seen:
                return list(self.health), self.version
            return None, seen

    def stop(self):
        with self.condition:
            self.stopped = True
            self.condition.notify_all()


class HealthServicer:
    """NodeWatchResources of one API version: the complete list now, on every change, and every HEALTH_RESEND
    seconds without one (each device, UNHEALTHY ones included, says HEALTH_TIMEOUT)."""

    def __init__(self, pb2, hub, clock=time.monotonic):
        self.pb2, self.hub, self.clock = pb2, hub, clock

    def NodeWatchResources(self, request, context):  # noqa: N802
        seen, health, sent = 0, None, None
        while context.is_active() and not self.hub.stopped:
            wait = HEALTH_POLL if sent is None else max(0.0, min(HEALTH_POLL, sent + HEALTH_RESEND - self.clock()))
            changed, seen = self.hub.wait(seen, wait)
            if changed is not None:
                health = changed
            elif health is None or self.clock() < sent + HEALTH_RESEND:
                continue
            sent = self.clock()
            yield self._response(health)

    def _response(self, health):
        response = self.pb2.NodeWatchResourcesResponse()
        now = int(time.time())
        for item in health:
            response.devices.add(
                device=self.pb2.DeviceIdentifier(pool_name=item.pool, device_name=item.device),
                health=self.pb2.HEALTHY if item.healthy else self.pb2.UNHEALTHY, last_updated_time=now,
                message=item.message, health_check_timeout_seconds=HEALTH_TIMEOUT)
        return response


class DraService:
    """Serve `driver` (a DraDriver) to the kubelet under `paths` (kubelet/paths.KubeletPaths); `on_registered()`
    runs each time the kubelet says it registered the plugin (NotifyRegistrationStatus registered=true: a
    kubelet that (re)started, which also deleted every ResourceSlice of its node)."""

    def __init__(self, driver, paths, on_registered=None):
        self.driver, self.paths, self.on_registered = driver, paths, on_registered
        self.plugin_dir = paths.plugin_dir(driver.driver)
        self.socket = os.path.join(self.plugin_dir, SERVICE_SOCKET)
        self.hub = HealthHub()
        self.server = self.registration = self.registrar = None

    def _add_servicers(self, server):
        dra_v1_grpc.add_DRAPluginServicer_to_server(DraServicer(dra_v1, self.driver), server)
        dra_v1beta1_grpc.add_DRAPluginServicer_to_server(DraServicer(dra_v1beta1, self.driver), server)
        health_v1a1_grpc.add_DRAResourceHealthServicer_to_server(HealthServicer(health_v1a1, self.hub), server)
        health_v1_grpc.add_DRAResourceHealthServicer_to_server(HealthServicer(health_v1, self.hub), server)

    def start(self):
        os.makedirs(self.plugin_dir, mode=0o750, exist_ok=True)
        self.server = transport.UnixGrpcServer(self.socket, self._add_servicers, max_workers=8).start()
        self.registration, self.registrar = transport.serve_plugin_registration(
            self.paths, PLUGIN_TYPE, self.driver.driver, self.socket, SUPPORTED_VERSIONS, self._status)
        return self

    def _status(self, registered, error):
        if registered and self.on_registered is not None:
            self.on_registered()

    def alive(self):
        """Both sockets are still the ones bound (someone may have wiped a directory)."""
        return bool(self.server and self.registration and self.server.alive() and self.registration.alive())

    def restart(self):
        self.stop(keep_hub=True)
        return self.start()

    def update_health(self, current):
        """Recompute device health from the devices read now (the agent calls this after each read)."""
        self.hub.update(device_health(current, self.driver.prepared_claims(), self.driver.pool, self.driver.pools))

    def stop(self, keep_hub=False):
        if not keep_hub:
            self.hub.stop()
        for server in (self.registration, self.server):   # registration first: the kubelet stops dialing
            if server is not None:
                server.stop()
        self.server = self.registration = None
