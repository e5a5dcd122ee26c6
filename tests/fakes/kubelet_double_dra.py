"""The test kubelet (tests/fakes/kubelet_double.py) learns DRA: what the kubelet's DRA manager does with a
registered DRA plugin (kubernetes/kubernetes pkg/kubelet/cm/dra; the APIs: kubernetes/kubelet
pkg/apis/dra/v1, v1beta1, dra-health/v1alpha1, pluginregistration/v1).

- It dials a DRA plugin only after its plugin watcher called GetInfo on the registration socket and
  accepted the type "DRAPlugin" with a version it knows; the endpoint is the one GetInfo named.
- prepare(driver, claims) / unprepare(driver, claims): NodePrepareResources / NodeUnprepareResources
  with the claim references only (namespace, name, UID: the plugin reads the claim itself), through v1
  when the plugin offers "v1.DRAPlugin", else v1beta1 (`version=` forces one); an answer that lacks a
  claim asked for is an error, as in the kubelet.
- restart(wipe="before"): a kubelet restart as the DRA manager makes it (dra_plugin_manager.go
  NewDRAPluginManager): with `api`/`node`, every ResourceSlice of the node, all drivers, is deleted from the API
  double (wipeResourceSlices: a DeleteCollection with fieldSelector spec.nodeName; here a list and a DELETE
  each), the streams and the registrations are dropped, and the plugin watcher dials GetInfo and
  NotifyRegistrationStatus again. The wipe runs in the background in the kubelet, so it may come after the
  registration: `wipe="after"` waits for the DRA plugins to register again first;
- watch_health(driver): a NodeWatchResources stream (v1alpha1.DRAResourceHealth, when offered), its
  latest list kept in `health[driver]`; device_health(driver) is what the kubelet reports for each device
  it heard of: its last status, or Unknown once that is older than the device's timeout
  (health_check_timeout_seconds, `default_health_timeout` = 30 s when 0; pkg/kubelet/cm/dra/healthinfo.go:
  updateHealthInfo stamps every reported device with the time it arrived, getHealthInfo applies the timeout).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
import urllib.request

import grpc

from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.api import (
    dra_health_v1alpha1_pb2 as health_pb, dra_health_v1alpha1_pb2_grpc as health_grpc,
    dra_v1_pb2, dra_v1_pb2_grpc, dra_v1beta1_pb2, dra_v1beta1_pb2_grpc)
from ansible_collections.accelops.vgpu.tests.fakes.kubelet_double import TestKubelet

VERSIONS = {"v1.DRAPlugin": (dra_v1_pb2, dra_v1_pb2_grpc), "v1beta1.DRAPlugin": (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc)}
HEALTH_SERVICE = "v1alpha1.DRAResourceHealth"


class KubeletError(Exception):
    """What the kubelet would log and retry: no such plugin, a gRPC failure, a claim missing from an answer."""


class DraKubelet(TestKubelet):
    __test__ = False

    def __init__(self, *args, default_health_timeout=30.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.health = {}            # driver -> [(pool, device, health name, message)] as last streamed
        self.health_updates = {}    # driver -> number of lists received
        self.default_health_timeout = default_health_timeout     # DefaultHealthTimeout
        self._health_cache = {}     # driver -> {(pool, device): (health, message, received, timeout)}
        self._streams = []

    def registration(self, driver):
        for info in list(self.registrations.values()):
            if info["type"] == "DRAPlugin" and info["name"] == driver and info["registered"]:
                return info
        raise KubeletError("DRA driver %s is not registered" % driver)

    def _stub(self, driver, version):
        info = self.registration(driver)
        if version is None:
            version = next(v for v in VERSIONS if v in info["supported_versions"])
        pb2, pb2_grpc = VERSIONS[version]
        channel = grpc.insecure_channel("unix:" + info["endpoint"])
        return pb2, pb2_grpc.DRAPluginStub(channel), channel

    def prepare(self, driver, claims, version=None, timeout=10.0):
        """{uid: {"devices": [{"requests", "pool", "device", "cdi"}], "error"}} for claims [(namespace, name, uid)]."""
        pb2, stub, channel = self._stub(driver, version)
        with channel:
            try:
                answer = stub.NodePrepareResources(pb2.NodePrepareResourcesRequest(claims=[
                    pb2.Claim(namespace=ns, name=name, uid=uid) for ns, name, uid in claims]), timeout=timeout)
            except grpc.RpcError as exc:
                raise KubeletError("NodePrepareResources: %s: %s" % (exc.code().name, exc.details())) from None
        missing = [uid for dummy, dummy2, uid in claims if uid not in answer.claims]
        if missing:
            raise KubeletError("NodePrepareResources left out claims %s" % missing)
        return {uid: {"error": result.error, "devices": [
            {"requests": list(d.request_names), "pool": d.pool_name, "device": d.device_name,
             "cdi": list(d.cdi_device_ids)} for d in result.devices]} for uid, result in answer.claims.items()}

    def unprepare(self, driver, claims, version=None, timeout=10.0):
        """{uid: error} for claims [(namespace, name, uid)]."""
        pb2, stub, channel = self._stub(driver, version)
        with channel:
            try:
                answer = stub.NodeUnprepareResources(pb2.NodeUnprepareResourcesRequest(claims=[
                    pb2.Claim(namespace=ns, name=name, uid=uid) for ns, name, uid in claims]), timeout=timeout)
            except grpc.RpcError as exc:
                raise KubeletError("NodeUnprepareResources: %s: %s" % (exc.code().name, exc.details())) from None
        missing = [uid for dummy, dummy2, uid in claims if uid not in answer.claims]
        if missing:
            raise KubeletError("NodeUnprepareResources left out claims %s" % missing)
        return {uid: result.error for uid, result in answer.claims.items()}

    def watch_health(self, driver):
        info = self.registration(driver)
        if HEALTH_SERVICE not in info["supported_versions"]:
            raise KubeletError("DRA driver %s offers no %s" % (driver, HEALTH_SERVICE))
        channel = grpc.insecure_channel("unix:" + info["endpoint"])
        stream = health_grpc.DRAResourceHealthStub(channel).NodeWatchResources(health_pb.NodeWatchResourcesRequest())
        self._streams.append((channel, stream))

        def follow():
            try:
                for answer in stream:
                    with self._lock:
                        self.health[driver] = [(d.device.pool_name, d.device.device_name,
                                                health_pb.HealthStatus.Name(d.health), d.message) for d in answer.devices]
                        cache, now = self._health_cache.setdefault(driver, {}), time.monotonic()
                        for d in answer.devices:
                            cache[d.device.pool_name, d.device.device_name] = (
                                health_pb.HealthStatus.Name(d.health), d.message, now,
                                d.health_check_timeout_seconds or self.default_health_timeout)
                        self.health_updates[driver] = self.health_updates.get(driver, 0) + 1
                        self.changed.notify_all()
            except grpc.RpcError:
                pass

        threading.Thread(target=follow, name="health-" + driver, daemon=True).start()

    def restart(self, wipe="before"):
        """A kubelet restart (module docstring); returns the names of the slices it deleted."""
        drivers = {info["name"] for info in list(self.registrations.values()) if info["type"] == "DRAPlugin"}
        wiped = self.wipe_resource_slices() if wipe == "before" else []
        super().restart()
        if wipe == "after":
            self.wait("the DRA plugins registered again", lambda k: all(
                any(i["name"] == name and i["registered"] for i in list(k.registrations.values())) for name in drivers))
            wiped = self.wipe_resource_slices()
        with self._lock:
            self.health.clear()
            self._health_cache.clear()
        return wiped

    def wipe_resource_slices(self):
        """Delete every ResourceSlice of this node in the API double (what the kubelet's start does)."""
        if not (self.api_url and self.node):
            return []
        url = "%s/apis/resource.k8s.io/v1/resourceslices?%s" % (
            self.api_url, urllib.parse.urlencode({"fieldSelector": "spec.nodeName=" + self.node}))
        with urllib.request.urlopen(url, timeout=10) as response:
            names = [item["metadata"]["name"] for item in json.load(response)["items"]]
        for name in names:
            request = urllib.request.Request("%s/apis/resource.k8s.io/v1/resourceslices/%s" % (self.api_url, name),
                                             method="DELETE")
            urllib.request.urlopen(request, timeout=10).close()
        return names

    def _mirror(self):
        if self.devices() or self._mirrored:      # a DRA-only kubelet has no extended resources to write
            super()._mirror()

    def device_health(self, driver):
        """{(pool, device): (health name, message)} as the kubelet reports them now (getHealthInfo)."""
        now = time.monotonic()
        with self._lock:
            return {key: (health, message) if now - received <= timeout else ("UNKNOWN", "")
                    for key, (health, message, received, timeout) in self._health_cache.get(driver, {}).items()}

    def stop(self):
        for channel, stream in self._streams:
            stream.cancel()
            channel.close()
        self._streams = []
        super().stop()
