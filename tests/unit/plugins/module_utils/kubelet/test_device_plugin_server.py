"""The device plugin host against the test kubelet, over real gRPC on unix sockets."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field

import grpc
import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.device_plugin_server import (
    DevicePluginHost, endpoint_name)
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.errors import AllocationError

L40S_24Q, L40S_12Q = "nvidia.com/NVIDIA_L40S-24Q", "nvidia.com/NVIDIA_L40S-12Q"


@dataclass
class Dev:
    id: str
    healthy: bool = True
    numa_nodes: list = field(default_factory=list)


@dataclass
class Alloc:
    envs: dict
    device_specs: list
    mounts: list = field(default_factory=list)
    annotations: dict = field(default_factory=dict)


class View:
    """A resource as the host sees it: its devices, and an Allocate that knows only them."""

    def __init__(self, resource, *devices):
        self.resource, self.devices = resource, list(devices)

    def allocate(self, ids):
        known = set(d.id for d in self.devices)
        for device_id in ids:
            if device_id not in known:
                raise AllocationError("resource %s: no device %s" % (self.resource, device_id))
        return Alloc({"IDS": ",".join(ids)}, [("/dev/vfio/vfio", "/dev/vfio/vfio", "mrw")])


@pytest.fixture
def host(paths):
    plugin_host = DevicePluginHost(paths, "test", watch_interval=0.05)
    stop = threading.Event()
    threading.Thread(target=plugin_host.watch, args=(stop,), daemon=True).start()
    yield plugin_host
    stop.set()
    plugin_host.close()


def listed(resource, expected):
    return lambda k: k.devices(resource) == expected


def test_each_resource_registers_on_its_own_socket_and_lists_its_devices(kubelet, host, paths):
    host.publish({L40S_24Q: View(L40S_24Q, Dev("0000:41:00.4", numa_nodes=[1])),
                  L40S_12Q: View(L40S_12Q, Dev("0000:42:00.4"), Dev("0000:42:00.5", healthy=False))})
    kubelet.wait("both resources", lambda k: len(k.devices()) == 2)
    assert kubelet.devices(L40S_24Q) == [("0000:41:00.4", "Healthy", [1])]
    assert kubelet.devices(L40S_12Q) == [("0000:42:00.4", "Healthy", []), ("0000:42:00.5", "Unhealthy", [])]
    assert sorted((r, e, v) for r, e, v in kubelet.register_calls) == [
        (L40S_12Q, endpoint_name("test", L40S_12Q), "v1beta1"), (L40S_24Q, endpoint_name("test", L40S_24Q), "v1beta1")]
    assert os.path.exists(paths.device_plugin_socket(endpoint_name("test", L40S_24Q)))
    assert kubelet.capacity() == ({L40S_24Q: 1, L40S_12Q: 2}, {L40S_24Q: 1, L40S_12Q: 1})


def test_a_change_is_streamed_and_a_resource_gone_stops_being_served(kubelet, host, paths):
    host.publish({L40S_24Q: View(L40S_24Q, Dev("a"), Dev("b"))})
    kubelet.wait("two devices", listed(L40S_24Q, [("a", "Healthy", []), ("b", "Healthy", [])]))
    host.publish({L40S_24Q: View(L40S_24Q, Dev("a", healthy=False), Dev("b"))})
    kubelet.wait("a unhealthy", listed(L40S_24Q, [("a", "Unhealthy", []), ("b", "Healthy", [])]))
    host.publish({L40S_12Q: View(L40S_12Q, Dev("c"))})
    kubelet.wait("12Q served, 24Q gone after the grace period", lambda k: list(k.devices()) == [L40S_12Q])
    assert not os.path.exists(paths.device_plugin_socket(endpoint_name("test", L40S_24Q)))
    assert [u for u in kubelet.updates if u[0] == L40S_24Q] == [
        (L40S_24Q, [("a", "Healthy"), ("b", "Healthy")]), (L40S_24Q, [("a", "Unhealthy"), ("b", "Healthy")])]


def test_allocate_answers_known_ids_and_refuses_unknown_ones_and_keeps_serving(kubelet, host):
    host.publish({L40S_24Q: View(L40S_24Q, Dev("a"), Dev("b"))})
    kubelet.wait("registered", lambda k: L40S_24Q in k.endpoints and k.devices(L40S_24Q))
    response = kubelet.allocate(L40S_24Q, ["b"])
    assert dict(response.envs) == {"IDS": "b"}
    assert [(d.container_path, d.host_path, d.permissions) for d in response.devices] == [
        ("/dev/vfio/vfio", "/dev/vfio/vfio", "mrw")]
    with pytest.raises(grpc.RpcError) as refused:
        kubelet.allocate(L40S_24Q, ["nope"])
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details() == "resource %s: no device nope" % L40S_24Q
    assert dict(kubelet.allocate(L40S_24Q, ["a"]).envs) == {"IDS": "a"}


def test_a_kubelet_restart_wiping_the_sockets_gets_every_resource_registered_again(kubelet, host, paths):
    host.publish({L40S_24Q: View(L40S_24Q, Dev("a")), L40S_12Q: View(L40S_12Q, Dev("b"))})
    kubelet.wait("registered", lambda k: len(k.register_calls) == 2 and len(k.endpoints) == 2)
    kubelet.restart()
    assert not os.path.exists(paths.device_plugin_socket(endpoint_name("test", L40S_24Q)))
    kubelet.wait("registered again", lambda k: len(k.register_calls) == 4 and len(k.endpoints) == 2
                 and k.devices(L40S_24Q) == [("a", "Healthy", [])])
    assert dict(kubelet.allocate(L40S_12Q, ["b"]).envs) == {"IDS": "b"}


def test_registration_waits_for_the_kubelet(paths, kubelet_dir):
    from ansible_collections.accelops.vgpu.tests.fakes.kubelet_double import TestKubelet
    os.makedirs(paths.device_plugins)
    plugin_host = DevicePluginHost(paths, "test", watch_interval=0.05)
    stop = threading.Event()
    threading.Thread(target=plugin_host.watch, args=(stop,), daemon=True).start()
    try:
        plugin_host.publish({L40S_24Q: View(L40S_24Q, Dev("a"))})
        assert plugin_host.registered() == []
        kubelet = TestKubelet(kubelet_dir, grace=0.5).start()   # wipes the plugin's socket, as a kubelet does
        try:
            kubelet.wait("registered", lambda k: k.devices(L40S_24Q) == [("a", "Healthy", [])])
            assert plugin_host.registered() == [L40S_24Q]
        finally:
            kubelet.stop()
    finally:
        stop.set()
        plugin_host.close()


def test_close_removes_the_sockets_and_the_kubelet_sees_the_devices_unhealthy(kubelet, paths):
    plugin_host = DevicePluginHost(paths, "test")
    plugin_host.publish({L40S_24Q: View(L40S_24Q, Dev("a"))})
    kubelet.wait("listed", listed(L40S_24Q, [("a", "Healthy", [])]))
    plugin_host.close()
    assert os.listdir(paths.device_plugins) == ["kubelet.sock"]
    kubelet.wait("unhealthy, then gone", lambda k: not k.devices())
