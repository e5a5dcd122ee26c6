# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The kubelet device plugin API v1beta1 over gRPC: one server and one registration per resource.

What the kubelet expects [kubernetes/kubelet pkg/apis/deviceplugin/v1beta1/api.proto (v0.36.3)]:
- each resource is served on its own socket in `<kubelet dir>/device-plugins/` and registered with
  v1beta1.Registration/Register{version, endpoint (the socket's file name), resource_name, options} on kubelet.sock
  (api.proto:13-34); ListAndWatch streams the full device list on every change (api.proto:45-48, 71-104);
  Allocate answers per container what the runtime gives it (api.proto:57-60, 148-212);
- a kubelet that starts deletes every socket in that directory: the plugin notices and serves and registers
  again (the watch below polls the socket files: a `stat` each, no sysfs).

The host is data-driven and knows nothing about vGPUs: `publish({resource: ResourceView})` where a ResourceView
has `devices` (objects with `id`, `healthy`, `numa_nodes`) and `allocate(ids) -> allocation` (`envs`,
`device_specs` [(container path, host path, permissions)], `mounts` [(container path, host path, read only)],
`annotations`), raising `AllocationError` for IDs it does not serve (-> gRPC INVALID_ARGUMENT, the server keeps
serving). A resource no longer published stops: its streams end, its socket goes, the kubelet marks it unhealthy.
"""

from __future__ import annotations

import queue
import re
import threading

try:
    import grpc
except ImportError:  # the agent image ships grpcio; transport.require_grpc() says so before any use
    grpc = None

from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet import transport
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.errors import AllocationError
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.api import deviceplugin_v1beta1_pb2 as pb
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.api import deviceplugin_v1beta1_pb2_grpc as pb_grpc

HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"   # constants.go:21-23
_END = object()


def endpoint_name(prefix, resource_name):
    """The socket file name of a resource: `<prefix>-nvidia.com_NVIDIA_L40S-24Q.sock` (no `/`)."""
    return "%s-%s.sock" % (prefix, re.sub(r"[^A-Za-z0-9_.-]", "_", resource_name))


def device_list(devices):
    return pb.ListAndWatchResponse(devices=[
        pb.Device(ID=d.id, health=HEALTHY if d.healthy else UNHEALTHY,
                  topology=pb.TopologyInfo(nodes=[pb.NUMANode(ID=n) for n in d.numa_nodes]) if d.numa_nodes else None)
        for d in devices])


def container_response(allocation):
    return pb.ContainerAllocateResponse(
        envs=dict(allocation.envs),
        devices=[pb.DeviceSpec(container_path=c, host_path=h, permissions=p) for c, h, p in allocation.device_specs],
        mounts=[pb.Mount(container_path=c, host_path=h, read_only=r) for c, h, r in allocation.mounts],
        annotations=dict(allocation.annotations))


class ResourceServicer(pb_grpc.DevicePluginServicer):
    """v1beta1.DevicePlugin for one resource; `update(view)` sends the new list to every open stream."""

    def __init__(self, resource_name, view):
        self.resource_name, self.view = resource_name, view
        self._lock = threading.Lock()
        self._streams = []
        self.allocations = 0

    def update(self, view):
        with self._lock:
            self.view = view
            for stream in self._streams:
                stream.put(device_list(view.devices))

    def close(self):
        with self._lock:
            for stream in self._streams:
                stream.put(_END)

    def GetDevicePluginOptions(self, request, context):  # noqa: N802 (gRPC method names)
        return pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=False)

    def ListAndWatch(self, request, context):  # noqa: N802
        stream = queue.Queue()
        with self._lock:
            stream.put(device_list(self.view.devices))
            self._streams.append(stream)
        try:
            while context.is_active():
                try:
                    item = stream.get(timeout=1.0)
                except queue.Empty:
                    continue
                if item is _END:
                    return
                yield item
        finally:
            with self._lock:
                self._streams.remove(stream)

    def GetPreferredAllocation(self, request, context):  # noqa: N802
        return pb.PreferredAllocationResponse()

    def Allocate(self, request, context):  # noqa: N802
        view = self.view
        responses = []
        try:
            for container in request.container_requests:
                responses.append(container_response(view.allocate(list(container.devices_ids))))
        except AllocationError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        self.allocations += 1
        return pb.AllocateResponse(container_responses=responses)

    def PreStartContainer(self, request, context):  # noqa: N802
        return pb.PreStartContainerResponse()


class _Served:
    def __init__(self, servicer, server, endpoint):
        self.servicer, self.server, self.endpoint = servicer, server, endpoint
        self.registered = False


class DevicePluginHost:
    """Every resource this process offers the kubelet. `publish()` from any thread; `watch()` in a thread of
    its own (until `stop` is set) re-serves and re-registers after a kubelet restart; `close()` removes all."""

    def __init__(self, paths, prefix, log=lambda message: None, watch_interval=1.0):
        self.paths, self.prefix, self.log, self.watch_interval = paths, prefix, log, watch_interval
        self._lock = threading.RLock()
        self._served = {}
        self._kubelet = None    # identity of the kubelet.sock we last registered with

    # --- what is served ------------------------------------------------------------------------
    def publish(self, views):
        """Serve exactly the resources in `views` ({resource name: view}); new ones are registered."""
        with self._lock:
            for name in sorted(set(self._served) - set(views)):
                self._stop(name)
                self.log("device plugin: stopped serving %s (no such vGPU on the node any more)" % name)
            for name, view in sorted(views.items()):
                served = self._served.get(name)
                if served is None:
                    self._start(name, view)
                else:
                    served.servicer.update(view)
            self._register_pending()

    def resources(self):
        with self._lock:
            return {name: s.servicer.view for name, s in self._served.items()}

    def registered(self):
        with self._lock:
            return sorted(name for name, s in self._served.items() if s.registered)

    def _start(self, name, view):
        endpoint = endpoint_name(self.prefix, name)
        servicer = ResourceServicer(name, view)
        server = transport.UnixGrpcServer(self.paths.device_plugin_socket(endpoint),
                                          lambda s: pb_grpc.add_DevicePluginServicer_to_server(servicer, s))
        server.start()
        self._served[name] = _Served(servicer, server, endpoint)

    def _stop(self, name):
        served = self._served.pop(name)
        served.servicer.close()
        served.server.stop()

    def _register_pending(self):
        kubelet = transport.socket_identity(self.paths.kubelet_socket)
        if kubelet is None:
            return
        if kubelet != self._kubelet:   # a new kubelet: register everything again
            for served in self._served.values():
                served.registered = False
            self._kubelet = kubelet
        for name, served in sorted(self._served.items()):
            if served.registered:
                continue
            try:
                transport.register_device_plugin(self.paths.kubelet_socket, served.endpoint, name)
            except transport.TransportError as exc:
                self.log("device plugin: %s; trying again" % exc)
                continue
            served.registered = True
            self.log("device plugin: registered %s (%d device(s)) as %s" % (name, len(served.servicer.view.devices),
                                                                            served.endpoint))

    # --- the kubelet restarting ----------------------------------------------------------------
    def check_sockets(self):
        """One look: a socket the kubelet deleted is served again; anything unregistered is registered."""
        with self._lock:
            for name, served in sorted(self._served.items()):
                if not served.server.alive():
                    self.log("device plugin: socket %s is gone (kubelet restart?); serving it again" % served.endpoint)
                    served.servicer.close()
                    served.server.stop(grace=0)
                    view = served.servicer.view
                    del self._served[name]
                    self._start(name, view)
            self._register_pending()

    def watch(self, stop):
        while not stop.wait(self.watch_interval):
            try:
                self.check_sockets()
            except EngineError as exc:
                self.log("device plugin: %s" % exc)

    def close(self):
        with self._lock:
            for name in sorted(self._served):
                self._stop(name)
