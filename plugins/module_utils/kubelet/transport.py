# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""gRPC plumbing between a kubelet plugin and the kubelet: unix-socket servers, registration, socket watching.

Knows nothing about vGPUs (Kubernetes' dynamic-resource-allocation/kubeletplugin keeps registration apart
from the driver the same way). Needs `grpcio` and `protobuf` (the agent image: Debian's python3-grpcio and
python3-protobuf); the node CLI's apply path and the boot unit never import this module.

- UnixGrpcServer: a gRPC server on one unix socket; `alive()` tells whether the socket file is still the one
  it bound (the kubelet deletes every socket in device-plugins/ when it starts, its CleanupPluginDirectory);
  `stop()` removes its own socket file, never one that replaced it.
- register_device_plugin(): v1beta1.Registration/Register on kubelet.sock.
- socket_identity(): what tells a re-created kubelet.sock from the old one (a kubelet restart).
- serve_plugin_registration(): pluginregistration.Registration (GetInfo, NotifyRegistrationStatus) on
  plugins_registry/<name>-reg.sock, what the kubelet's plugin watcher dials (DRA, CSI).
"""

from __future__ import annotations

import os
import stat
import threading
from concurrent import futures

try:
    import grpc
except ImportError:  # the agent image ships grpcio; the controller and ansible-test's import check do not
    grpc = None

from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.api import deviceplugin_v1beta1_pb2 as dp_pb2
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.api import deviceplugin_v1beta1_pb2_grpc as dp_grpc
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.api import pluginregistration_v1_pb2 as reg_pb2
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.api import pluginregistration_v1_pb2_grpc as reg_grpc
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.paths import check_socket_path

DEVICE_PLUGIN_API_VERSION = "v1beta1"   # constants.go Version
REGISTER_TIMEOUT = 10.0


class TransportError(EngineError):
    """A socket that cannot be served, or a registration the kubelet refused or never answered."""


def require_grpc(what):
    """TransportError naming `what` when grpcio/protobuf are missing (only the agent image has them)."""
    if grpc is None or not hasattr(dp_pb2, "RegisterRequest"):
        raise TransportError("%s needs the Python packages grpcio and protobuf (the agent image ships them)" % what)


def socket_identity(path):
    """(device, inode, change time) of the socket file at `path` (inodes are reused), or None when there is none."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return (info.st_dev, info.st_ino, info.st_ctime_ns) if stat.S_ISSOCK(info.st_mode) else None


def unix_target(path):
    return "unix:" + os.path.abspath(path)


class UnixGrpcServer:
    """One gRPC server on one unix socket. `add_servicers(server)` registers the services on it."""

    def __init__(self, path, add_servicers, max_workers=4):
        require_grpc("gRPC server on %s" % path)
        self.path = check_socket_path(path)
        self.add_servicers, self.max_workers = add_servicers, max_workers
        self.server, self.identity = None, None

    def start(self):
        """Bind and serve; a stale socket file at the path (a previous run) is replaced."""
        if socket_identity(self.path) is not None:
            os.unlink(self.path)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=self.max_workers,
                                                        thread_name_prefix="grpc-" + os.path.basename(self.path)))
        self.add_servicers(server)
        try:
            bound = server.add_insecure_port(unix_target(self.path))
        except RuntimeError as exc:
            bound, why = 0, str(exc)
        else:
            why = "cannot bind"
        if not bound:
            raise TransportError("socket %s: %s (does %s exist?)" % (self.path, why, os.path.dirname(self.path)))
        server.start()
        self.server, self.identity = server, socket_identity(self.path)
        return self

    def alive(self):
        """Whether the socket file is still the one this server bound."""
        return self.server is not None and socket_identity(self.path) == self.identity

    def stop(self, grace=0.5):
        """Stop serving (open streams get `grace` seconds) and remove the socket file if it is still ours.
        gRPC itself unlinks the path of a unix listener it shuts down: stop a server whose socket was deleted
        before binding a new one at the same path."""
        if self.server is None:
            return
        server, self.server = self.server, None
        server.stop(grace).wait()
        if socket_identity(self.path) == self.identity:
            try:
                os.unlink(self.path)
            except OSError:
                pass


def register_device_plugin(kubelet_socket, endpoint, resource_name, pre_start_required=False,
                           preferred_allocation=False, timeout=REGISTER_TIMEOUT):
    """v1beta1.Registration/Register: the plugin serving `endpoint` (a file name in device-plugins/) offers
    `resource_name`. TransportError names the resource and the socket when the kubelet refuses or is away."""
    require_grpc("device plugin %s" % resource_name)
    request = dp_pb2.RegisterRequest(
        version=DEVICE_PLUGIN_API_VERSION, endpoint=endpoint, resource_name=resource_name,
        options=dp_pb2.DevicePluginOptions(pre_start_required=pre_start_required,
                                           get_preferred_allocation_available=preferred_allocation))
    try:
        with grpc.insecure_channel(unix_target(kubelet_socket)) as channel:
            dp_grpc.RegistrationStub(channel).Register(request, timeout=timeout)
    except grpc.RpcError as exc:
        raise TransportError("resource %s: registration at %s failed: %s: %s" % (
            resource_name, kubelet_socket, exc.code().name, exc.details()))


class PluginRegistration(reg_grpc.RegistrationServicer):
    """pluginregistration.Registration for one plugin. `on_status(registered, error)` hears the kubelet's
    verdict; `status` keeps the last one (None until the kubelet called)."""

    def __init__(self, plugin_type, name, endpoint, supported_versions, on_status=None):
        self.info = reg_pb2.PluginInfo(type=plugin_type, name=name, endpoint=endpoint,
                                       supported_versions=list(supported_versions))
        self.on_status, self.status = on_status, None
        self.notified = threading.Event()

    def GetInfo(self, request, context):  # noqa: N802 (gRPC method name)
        return self.info

    def NotifyRegistrationStatus(self, request, context):  # noqa: N802
        self.status = (request.plugin_registered, request.error)
        self.notified.set()
        if self.on_status is not None:
            self.on_status(request.plugin_registered, request.error)
        return reg_pb2.RegistrationStatusResponse()


def serve_plugin_registration(paths, plugin_type, name, endpoint, supported_versions, on_status=None):
    """(UnixGrpcServer, PluginRegistration) serving at `paths.registration_socket(name)`, started."""
    servicer = PluginRegistration(plugin_type, name, endpoint, supported_versions, on_status)
    server = UnixGrpcServer(paths.registration_socket(name),
                            lambda s: reg_grpc.add_RegistrationServicer_to_server(servicer, s), max_workers=2)
    return server.start(), servicer
