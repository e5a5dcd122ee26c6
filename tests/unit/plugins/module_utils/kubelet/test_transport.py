"""Socket lifecycle and the plugin-registration service (what a DRA kubelet plugin builds on)."""

from __future__ import annotations

import os

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet import transport
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.paths import KubeletPaths, SocketPathError


def test_a_socket_path_longer_than_the_kernel_allows_is_refused_by_name():
    paths = KubeletPaths("/tmp/" + "k" * 80)
    with pytest.raises(SocketPathError) as refused:
        paths.device_plugin_socket("accelops-vgpu-nvidia.com_NVIDIA_L40S-24Q.sock")
    assert str(refused.value).startswith("socket /tmp/kkk")
    assert "at most 107" in str(refused.value)


def test_a_server_tells_when_its_socket_was_replaced_and_removes_its_own(paths):
    os.makedirs(paths.device_plugins)
    path = paths.device_plugin_socket("x.sock")
    server = transport.UnixGrpcServer(path, lambda s: None).start()
    assert server.alive()
    os.unlink(path)                                      # the kubelet wiping the directory
    assert not server.alive()
    server.stop()
    server = transport.UnixGrpcServer(path, lambda s: None).start()
    stale = transport.UnixGrpcServer(path, lambda s: None)
    stale.start()                                        # a stale socket file at the path is replaced
    assert stale.alive() and not server.alive()
    stale.stop()
    assert not os.path.exists(path)
    server.stop()


def test_a_missing_directory_is_one_line_naming_the_socket(paths):
    with pytest.raises(transport.TransportError) as refused:
        transport.UnixGrpcServer(paths.device_plugin_socket("x.sock"), lambda s: None).start()
    assert str(refused.value).startswith("socket %s/x.sock: " % paths.device_plugins)


def test_registration_without_a_kubelet_names_the_resource(paths):
    with pytest.raises(transport.TransportError) as refused:
        transport.register_device_plugin(paths.kubelet_socket, "x.sock", "nvidia.com/NVIDIA_L40S-24Q", timeout=0.5)
    assert str(refused.value).startswith("resource nvidia.com/NVIDIA_L40S-24Q: registration at %s failed: "
                                         % paths.kubelet_socket)


def test_the_kubelet_refuses_a_resource_name_without_a_domain(kubelet, paths):
    server = transport.UnixGrpcServer(paths.device_plugin_socket("x.sock"), lambda s: None).start()
    try:
        with pytest.raises(transport.TransportError) as refused:
            transport.register_device_plugin(paths.kubelet_socket, "x.sock", "NVIDIA_L40S-24Q")
        assert "INVALID_ARGUMENT: invalid resource name NVIDIA_L40S-24Q" in str(refused.value)
    finally:
        server.stop()


def test_the_plugin_watcher_gets_info_and_notifies_the_registration(kubelet, paths):
    heard = []
    server, servicer = transport.serve_plugin_registration(
        paths, "DRAPlugin", "gpu.accelops.io", os.path.join(paths.plugin_dir("gpu.accelops.io"), "dra.sock"),
        ["v1.DRAPlugin", "v1beta1.DRAPlugin"], on_status=lambda ok, error: heard.append((ok, error)))
    try:
        assert servicer.notified.wait(10)
        assert heard == [(True, "")]
        assert kubelet.registrations[paths.registration_socket("gpu.accelops.io")] == {
            "type": "DRAPlugin", "name": "gpu.accelops.io", "registered": True,
            "endpoint": os.path.join(paths.plugin_dir("gpu.accelops.io"), "dra.sock"),
            "supported_versions": ["v1.DRAPlugin", "v1beta1.DRAPlugin"]}
    finally:
        server.stop()
    assert not os.path.exists(paths.registration_socket("gpu.accelops.io"))
