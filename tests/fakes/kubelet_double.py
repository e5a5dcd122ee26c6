"""A kubelet double for plugin tests and the demo: it speaks the kubelet's published gRPC APIs and nothing else.

    python tests/fakes/kubelet_double.py --root DIR [--api URL --node NAME] [--grace S]
        prints "ready <control port>" once kubelet.sock is served; SIGTERM/SIGINT stop it

What it does, as the kubelet does (kubernetes/kubernetes pkg/kubelet/cm/devicemanager, pluginmanager; the APIs:
kubernetes/kubelet pkg/apis/deviceplugin/v1beta1, pluginregistration/v1, v0.36.3):
- start: deletes every file in `<root>/device-plugins/` but its checkpoint (CleanupPluginDirectory), then serves
  v1beta1.Registration on `device-plugins/kubelet.sock`;
- Register: refuses a version other than v1beta1 or a resource name without a domain; dials the plugin's
  endpoint (a file in device-plugins/), asks GetDevicePluginOptions and keeps a ListAndWatch stream open; a new
  registration of a resource replaces the old endpoint;
- every ListAndWatch list replaces the resource's devices; `capacity` counts them all, `allocatable` the
  Healthy ones; when the stream ends the devices count as Unhealthy (allocatable 0) and after `grace` seconds
  the resource is gone (endpointStopGracePeriod, 5 minutes in the kubelet);
- with `api`/`node`: mirrors capacity/allocatable into the API double's Node `status` on every change (a merge
  patch through the double's control, as the kubelet's node status update would; resources gone -> removed);
- plugins_registry/: every `*.sock` found there gets GetInfo, then NotifyRegistrationStatus (registered when the
  type is known to this double and a supported version is offered); what it learnt is in `registrations`;
- restart(): stops serving, closes every stream, and starts again (which wipes the sockets);
- PodResources v1 on `pod-resources/kubelet.sock` (kubelet_podresources.py): `run_pod()` calls Allocate and, once it
  returned, records the devices for the pod, as the device manager does; `delete_pod()` ends the pod; the pods
  survive restart() (the device manager's checkpoint).

Tests use the TestKubelet class in-process (its gRPC is real, across unix sockets) or the process with its HTTP
controls: GET /devices, GET /registrations, POST /allocate {"resource", "ids"}, POST /restart,
POST /pods {"namespace", "name", "resource", "ids"} (run_pod), POST /pods/delete {"namespace", "name"}.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import re
import signal
import sys
import threading
import time
import urllib.request
from concurrent import futures

import grpc

if __name__ == "__main__":  # run as a file: make the collection importable like the test suite does
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".build", "collections"))

from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.api import (  # noqa: E402
    deviceplugin_v1beta1_pb2 as pb, deviceplugin_v1beta1_pb2_grpc as pb_grpc,
    pluginregistration_v1_pb2 as reg_pb, pluginregistration_v1_pb2_grpc as reg_grpc)
from ansible_collections.accelops.vgpu.tests.fakes.kubelet_podresources import PodResourcesServer  # noqa: E402

CHECKPOINT = "kubelet_internal_checkpoint"
SUPPORTED_VERSIONS = ("v1beta1",)
# what this double's plugin watcher accepts: {type: versions}; a DRA test may add "DRAPlugin"
KNOWN_PLUGIN_TYPES = {"DevicePlugin": ("v1beta1",), "DRAPlugin": ("v1.DRAPlugin", "v1beta1.DRAPlugin")}
EXTENDED_RESOURCE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
NODES = "v1/nodes"


class Endpoint:
    """One registered device plugin: its channel and ListAndWatch stream."""

    def __init__(self, resource, socket, options):
        self.resource, self.socket, self.options = resource, socket, options
        self.channel = grpc.insecure_channel("unix:" + socket)
        self.stub = pb_grpc.DevicePluginStub(self.channel)
        self.stream = None
        self.stopped_at = None

    def close(self):
        if self.stream is not None:
            self.stream.cancel()
        self.channel.close()


class TestKubelet(pb_grpc.RegistrationServicer):
    """The double. `devices(resource)` -> [(id, health, numa ids)]; `allocate(resource, ids)`; `restart()`."""

    __test__ = False  # not a pytest class

    def __init__(self, root, api_url=None, node=None, grace=300.0, registry_interval=0.2):
        self.root, self.api_url, self.node, self.grace = root, api_url, node, grace
        self.dir = os.path.join(root, "device-plugins")
        self.registry = os.path.join(root, "plugins_registry")
        self.registry_interval = registry_interval
        self._lock = threading.RLock()
        self.changed = threading.Condition(self._lock)
        self.endpoints, self._devices = {}, {}      # resource -> Endpoint, resource -> [(id, health, numa)]
        self.registrations = {}                     # plugins_registry socket -> PluginInfo as a dict
        self.register_calls = []                    # (resource, endpoint, version) in order
        self.updates = []                           # (resource, [(id, health)]) every ListAndWatch list, in order
        self._stopped = {}                          # resource -> when its stream ended (grace period)
        self.server, self._stop = None, threading.Event()
        self._mirrored = None
        self.pod_resources = PodResourcesServer(root, lambda: dict(
            (r, [i for i, h, n in d]) for r, d in self.devices().items()))

    # --- lifecycle ---------------------------------------------------------------------------
    def start(self):
        os.makedirs(self.dir, exist_ok=True)
        os.makedirs(self.registry, exist_ok=True)
        for name in os.listdir(self.dir):           # CleanupPluginDirectory
            if name != CHECKPOINT:
                os.unlink(os.path.join(self.dir, name))
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_RegistrationServicer_to_server(self, self.server)
        if not self.server.add_insecure_port("unix:" + os.path.join(self.dir, "kubelet.sock")):
            raise RuntimeError("test kubelet: cannot bind %s/kubelet.sock" % self.dir)
        self.server.start()
        self.pod_resources.start()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=target, args=(self._stop,), daemon=True)
                         for target in (self._watch_registry, self._expire)]
        for thread in self._threads:
            thread.start()
        return self

    def stop(self):
        self._stop.set()
        # the old plugin watcher must be done before a restart clears the registrations: one still
        # mid-pass would register a plugin a second time (a real kubelet's reconciler registers a socket once)
        for thread in getattr(self, "_threads", ()):
            if thread is not threading.current_thread():
                thread.join(timeout=15)
        if self.server is not None:
            self.server.stop(0).wait()
            self.server = None
        self.pod_resources.stop()
        with self._lock:
            for endpoint in self.endpoints.values():
                endpoint.close()
            self.endpoints.clear()

    def restart(self):
        """A kubelet restart: streams closed, sockets wiped, served anew; devices known before stay (the
        kubelet keeps its checkpoint) until their plugin re-registers or the grace period ends."""
        self.stop()
        with self._lock:
            now = time.monotonic()
            self._devices = {r: [(i, "Unhealthy", n) for i, h, n in devs] for r, devs in self._devices.items()}
            self._stopped = {r: now for r in self._devices}
        self.registrations.clear()
        self.start()
        self._mirror()

    # --- v1beta1.Registration -------------------------------------------------------------------
    def Register(self, request, context):  # noqa: N802 (gRPC method name)
        self.register_calls.append((request.resource_name, request.endpoint, request.version))
        if request.version not in SUPPORTED_VERSIONS:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "unsupported API version %s" % request.version)
        if not EXTENDED_RESOURCE.match(request.resource_name):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "invalid resource name %s" % request.resource_name)
        socket = os.path.join(self.dir, request.endpoint)
        endpoint = Endpoint(request.resource_name, socket, request.options)
        try:
            endpoint.stub.GetDevicePluginOptions(pb.Empty(), timeout=5)
        except grpc.RpcError as exc:
            endpoint.close()
            context.abort(grpc.StatusCode.UNAVAILABLE, "cannot dial %s: %s" % (socket, exc.details()))
        with self._lock:
            old = self.endpoints.pop(request.resource_name, None)
            if old is not None:
                old.close()
            self.endpoints[request.resource_name] = endpoint
        threading.Thread(target=self._list_and_watch, args=(endpoint,), daemon=True).start()
        return pb.Empty()

    def _list_and_watch(self, endpoint):
        endpoint.stream = endpoint.stub.ListAndWatch(pb.Empty())
        try:
            for response in endpoint.stream:
                devices = [(d.ID, d.health, [n.ID for n in d.topology.nodes]) for d in response.devices]
                with self._lock:
                    if self.endpoints.get(endpoint.resource) is not endpoint:
                        return
                    self._devices[endpoint.resource] = devices
                    self._stopped.pop(endpoint.resource, None)
                    self.updates.append((endpoint.resource, [(i, h) for i, h, n in devices]))
                    self.changed.notify_all()
                self._mirror()
        except grpc.RpcError:
            pass
        with self._lock:   # the stream ended: the kubelet marks the devices unhealthy, drops them after the grace
            if self.endpoints.get(endpoint.resource) is endpoint:
                del self.endpoints[endpoint.resource]
                self._devices[endpoint.resource] = [(i, "Unhealthy", n)
                                                    for i, h, n in self._devices.get(endpoint.resource, [])]
                self._stopped[endpoint.resource] = time.monotonic()
                self.changed.notify_all()
        endpoint.close()
        self._mirror()

    def _expire(self, stop):
        while not stop.wait(min(1.0, self.grace / 4 or 0.05)):
            with self._lock:
                gone = [r for r, at in self._stopped.items() if time.monotonic() - at >= self.grace]
                for resource in gone:
                    self._stopped.pop(resource)
                    self._devices.pop(resource, None)
                if gone:
                    self.changed.notify_all()
            if gone:
                self._mirror()

    # --- what the node offers ---------------------------------------------------------------------
    def devices(self, resource=None):
        with self._lock:
            if resource is None:
                return {r: list(d) for r, d in self._devices.items()}
            return list(self._devices.get(resource, []))

    def capacity(self):
        """({resource: capacity}, {resource: allocatable}) as the kubelet computes them."""
        with self._lock:
            cap = dict((r, len(d)) for r, d in self._devices.items())
            alloc = dict((r, sum(1 for x in d if x[1] == "Healthy")) for r, d in self._devices.items())
        return cap, alloc

    def wait(self, what, predicate, timeout=30.0):
        """predicate(self) until true, woken by every ListAndWatch update; AssertionError after timeout."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                result = predicate(self)
                if result:
                    return result
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError("test kubelet: timed out after %.0f s waiting for %s (devices: %r)"
                                         % (timeout, what, self._devices))
                self.changed.wait(min(left, 0.2))

    def allocate(self, resource, ids, timeout=5.0):
        """Allocate for one container; the ContainerAllocateResponse (grpc.RpcError when the plugin refuses)."""
        with self._lock:
            endpoint = self.endpoints.get(resource)
        if endpoint is None:
            raise KeyError("no plugin registered for %s" % resource)
        request = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=list(ids))])
        return endpoint.stub.Allocate(request, timeout=timeout).container_responses[0]

    def run_pod(self, namespace, name, resource, ids, container="compute"):
        """A pod admitted with `ids` of `resource`: Allocate, then the devices recorded for the pod (PodResources
        lists them), as the device manager does (allocateContainerResources: podDevices.insert after Allocate)."""
        response = self.allocate(resource, ids)
        self.pod_resources.add(namespace, name, container, resource, ids)
        return response

    def delete_pod(self, namespace, name):
        """The pod is gone: PodResources no longer lists it."""
        return self.pod_resources.delete(namespace, name)

    def _mirror(self):
        if not (self.api_url and self.node):
            return
        cap, alloc = self.capacity()
        with self._lock:
            previous, self._mirrored = self._mirrored or set(), set(cap)
        status = {"capacity": dict((r, str(n)) for r, n in cap.items()),
                  "allocatable": dict((r, str(n)) for r, n in alloc.items())}
        for gone in previous - set(cap):
            status["capacity"][gone] = None
            status["allocatable"][gone] = None
        body = json.dumps({"resource": NODES, "name": self.node, "patch": {"status": status}}).encode()
        request = urllib.request.Request(self.api_url + "/_ctl/patch", data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(request, timeout=10).close()
        except OSError as exc:
            sys.stderr.write("test kubelet: cannot update node %s: %s\n" % (self.node, exc))

    # --- plugins_registry (the plugin watcher) ------------------------------------------------------
    def _watch_registry(self, stop):
        while not stop.wait(self.registry_interval):
            try:
                names = sorted(os.listdir(self.registry))
            except OSError:
                continue
            for name in names:
                path = os.path.join(self.registry, name)
                if name.endswith(".sock") and path not in self.registrations:
                    self._register_plugin(path)
            for path in [p for p in self.registrations if not os.path.exists(p)]:
                self.registrations.pop(path, None)

    def _register_plugin(self, path):
        try:
            with grpc.insecure_channel("unix:" + path) as channel:
                stub = reg_grpc.RegistrationStub(channel)
                info = stub.GetInfo(reg_pb.InfoRequest(), timeout=5)
                versions = KNOWN_PLUGIN_TYPES.get(info.type)
                ok = versions is not None and any(v in versions for v in info.supported_versions)
                error = "" if ok else "unsupported plugin type %s or versions %s" % (
                    info.type, list(info.supported_versions))
                self.registrations[path] = {"type": info.type, "name": info.name, "endpoint": info.endpoint,
                                            "supported_versions": list(info.supported_versions), "registered": ok}
                stub.NotifyRegistrationStatus(reg_pb.RegistrationStatus(plugin_registered=ok, error=error), timeout=5)
        except grpc.RpcError:
            self.registrations.pop(path, None)
            return
        with self._lock:
            self.changed.notify_all()


def _controls(kubelet):
    class Handler(http.server.BaseHTTPRequestHandler):
        def _send(self, code, body):
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # noqa: N802
            if self.path == "/devices":
                return self._send(200, dict((r, [{"id": i, "health": h, "numa": n} for i, h, n in d])
                                            for r, d in kubelet.devices().items()))
            if self.path == "/registrations":
                return self._send(200, kubelet.registrations)
            return self._send(404, {"error": self.path})

        def do_POST(self):  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            if self.path == "/restart":
                kubelet.restart()
                return self._send(200, {})
            if self.path == "/pods/delete":
                return self._send(200, {"deleted": kubelet.delete_pod(body["namespace"], body["name"])})
            if self.path in ("/allocate", "/pods"):
                try:
                    response = kubelet.allocate(body["resource"], body["ids"]) if self.path == "/allocate" else \
                        kubelet.run_pod(body["namespace"], body["name"], body["resource"], body["ids"])
                except (KeyError, grpc.RpcError) as exc:
                    details = exc.details() if isinstance(exc, grpc.RpcError) else str(exc)
                    return self._send(400, {"error": details})
                return self._send(200, {"envs": dict(response.envs), "devices": [
                    {"container_path": d.container_path, "host_path": d.host_path, "permissions": d.permissions}
                    for d in response.devices]})
            return self._send(404, {"error": self.path})

        def log_message(self, *args):
            pass

    return http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    parser.add_argument("--root", required=True, help="the kubelet directory (device-plugins/, plugins_registry/)")
    parser.add_argument("--api", help="API server double URL whose Node status this kubelet updates")
    parser.add_argument("--node", help="the Node's name")
    parser.add_argument("--grace", type=float, default=300.0, help="seconds a stopped plugin's devices stay")
    args = parser.parse_args(argv)
    kubelet = TestKubelet(args.root, args.api, args.node, args.grace).start()
    controls = _controls(kubelet)
    threading.Thread(target=controls.serve_forever, daemon=True).start()
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *a: done.set())
    signal.signal(signal.SIGINT, lambda *a: done.set())
    print("ready %d" % controls.server_address[1], flush=True)
    done.wait()
    controls.shutdown()
    kubelet.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
