"""The DRA plugin over real gRPC on unix sockets, dialled by the test kubelet the way the kubelet does."""

from __future__ import annotations

import os
import time

import pytest
from claim_data import ClaimStore, claim, ref
from dra_node import build, inventory, view

from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.driver import DraDriver
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import grpc_service
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.grpc_service import DraService
from ansible_collections.accelops.vgpu.tests.fakes.kubelet_double_dra import DraKubelet, KubeletError

NODE, DRIVER = "gpu-node-1", "vgpu.accelops.io"
POOL = NODE + "/" + DRIVER     # slices.pool_name
VF4, VF5 = "l40s-24q-0000-41-00-4", "l40s-24q-0000-41-00-5"
UID1, UID2 = "11111111-aaaa-4bbb-8ccc-000000000001", "22222222-aaaa-4bbb-8ccc-000000000002"


@pytest.fixture
def plugin(tmp_path, paths, kubelet_dir):
    """(service, kubelet, node, claims): the DRA service on a FakeNode, registered with a DRA test kubelet."""
    node = build(tmp_path / "node")
    store = ClaimStore(claim("vm-a-gpu", UID1, [VF4], NODE), claim("vm-b-gpu", UID2, [VF5], NODE))
    driver = DraDriver(NODE, store.get, view(node), paths.plugin_dir(DRIVER), str(tmp_path / "cdi"))
    kubelet = DraKubelet(kubelet_dir, grace=0.5).start()
    heard = []      # every registration the service was told of, from its first one on
    service = DraService(driver, paths, on_registered=lambda: heard.append(time.monotonic())).start()
    service.heard = heard
    kubelet.wait("the DRA plugin's registration", lambda k: any(r["registered"] for r in k.registrations.values()))
    yield service, kubelet, node, store
    service.stop()
    kubelet.stop()


def test_the_kubelet_registers_the_plugin_from_getinfo(plugin, paths):
    service, kubelet, dummy, dummy2 = plugin
    [(socket, info)] = kubelet.registrations.items()
    assert socket == os.path.join(paths.plugins_registry, "vgpu.accelops.io-reg.sock")
    assert info == {"type": "DRAPlugin", "name": DRIVER, "registered": True,
                    "endpoint": os.path.join(paths.plugin_dir(DRIVER), "dra.sock"),
                    "supported_versions": ["v1.DRAPlugin", "v1beta1.DRAPlugin", "v1alpha1.DRAResourceHealth"]}
    # the double records the registration, then sends NotifyRegistrationStatus: under load the status comes later
    kubelet.wait("NotifyRegistrationStatus", lambda k: service.registrar.status is not None)
    assert service.registrar.status == (True, "")


@pytest.mark.parametrize("version", ["v1.DRAPlugin", "v1beta1.DRAPlugin"])
def test_prepare_and_unprepare_through_either_api_version(plugin, version):
    service, kubelet, dummy, store = plugin
    one = ref(store.objects["vms", "vm-a-gpu"])
    answer = kubelet.prepare(DRIVER, [one], version=version)
    assert answer == {UID1: {"error": "", "devices": [{"requests": ["gpu"], "pool": POOL, "device": VF4, "cdi": [
        "vgpu.accelops.io/claim=%s-%s" % (UID1, VF4), "vgpu.accelops.io/metadata=%s_gpu" % UID1]}]}}
    assert service.driver.holders() == {"0000:41:00.4": ["DRA claim vms/vm-a-gpu"]}
    assert kubelet.unprepare(DRIVER, [one], version=version) == {UID1: ""}
    assert service.driver.holders() == {}


def test_errors_are_per_claim_over_grpc(plugin):
    dummy, kubelet, dummy2, store = plugin
    good = ref(store.objects["vms", "vm-b-gpu"])
    gone = ("vms", "deleted", "33333333-aaaa-4bbb-8ccc-000000000003")
    answer = kubelet.prepare(DRIVER, [gone, good])
    assert answer[gone[2]] == {"error": "claim vms/deleted: not found in the API server", "devices": []}
    assert answer[UID2]["error"] == "" and answer[UID2]["devices"][0]["device"] == VF5


def test_health_streams_unhealthy_when_a_prepared_vgpu_loses_its_type(plugin):
    service, kubelet, node, store = plugin
    kubelet.prepare(DRIVER, [ref(store.objects["vms", "vm-a-gpu"])])
    service.update_health(inventory(node))
    kubelet.watch_health(DRIVER)
    kubelet.wait("a health list", lambda k: k.health.get(DRIVER))
    assert (POOL, VF4, "HEALTHY", "") in kubelet.health[DRIVER]
    node.set_type("0000:41:00.4", 0)                      # a vGPU-manager restart resets the type
    service.update_health(inventory(node))
    unhealthy = kubelet.wait("the vGPU unhealthy", lambda k: [h for h in k.health[DRIVER] if h[2] == "UNHEALTHY"])
    assert unhealthy == [(POOL, VF4, "UNHEALTHY", "vGPU %s (0000:41:00.4) of claim vms/vm-a-gpu is gone from the "
                          "node: its VF lost its type or the device disappeared (a vGPU-manager restart resets "
                          "types until the layout is applied again)" % VF4)]
    assert VF5 in [h[1] for h in kubelet.health[DRIVER]]   # the complete list every time


def test_health_stays_known_past_the_kubelets_timeout_unhealthy_included(plugin, monkeypatch):
    """The kubelet turns a device Unknown when its last update is older than its timeout (30 s by default):
    the stream sends the list again while nothing changes. Time scaled down: resend 0.3 s, timeouts 1 s."""
    service, kubelet, node, store = plugin
    monkeypatch.setattr(grpc_service, "HEALTH_RESEND", 0.3)
    monkeypatch.setattr(grpc_service, "HEALTH_TIMEOUT", 1)
    kubelet.default_health_timeout = 1.0
    kubelet.prepare(DRIVER, [ref(store.objects["vms", "vm-a-gpu"])])
    node.set_type("0000:41:00.4", 0)
    service.update_health(inventory(node))
    kubelet.watch_health(DRIVER)
    kubelet.wait("the vGPU unhealthy", lambda k: k.device_health(DRIVER).get((POOL, VF4), ("",))[0] == "UNHEALTHY")
    time.sleep(2.5)                                        # nothing changes for more than twice the timeout
    health = kubelet.device_health(DRIVER)
    assert health[POOL, VF4][0] == "UNHEALTHY" and health[POOL, VF5] == ("HEALTHY", "")
    assert kubelet.health_updates[DRIVER] >= 5
    # the real intervals: a resend every 10 s, a timeout that covers a late one, under the kubelet's 30 s
    monkeypatch.undo()
    assert 2 * grpc_service.HEALTH_RESEND <= grpc_service.HEALTH_TIMEOUT < 30


def test_a_kubelet_restart_registers_the_plugin_again_and_the_service_hears_it(plugin):
    service, kubelet, dummy, store = plugin
    # the kubelet marks the plugin registered before its NotifyRegistrationStatus reaches the service: under load
    # the first notification can land late, so count from the first one heard
    deadline = time.monotonic() + 5
    while not service.heard and time.monotonic() < deadline:
        time.sleep(0.05)
    before = len(service.heard)
    assert before == 1
    kubelet.restart()
    kubelet.wait("registered again", lambda k: any(r["registered"] for r in k.registrations.values()))
    deadline = time.monotonic() + 5
    while len(service.heard) == before and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)                 # a second notification for one restart would show by now
    assert len(service.heard) == before + 1
    assert kubelet.prepare(DRIVER, [ref(store.objects["vms", "vm-a-gpu"])])[UID1]["error"] == ""


def test_stopping_removes_both_sockets_and_the_kubelet_forgets_the_plugin(plugin, paths):
    service, kubelet, dummy, store = plugin
    service.stop()
    assert not os.path.exists(os.path.join(paths.plugin_dir(DRIVER), "dra.sock"))
    assert not os.path.exists(os.path.join(paths.plugins_registry, "vgpu.accelops.io-reg.sock"))
    kubelet.wait("the registration gone", lambda k: not k.registrations)
    with pytest.raises(KubeletError, match="not registered"):
        kubelet.prepare(DRIVER, [ref(store.objects["vms", "vm-a-gpu"])])


def test_a_wiped_socket_is_noticed_and_served_again(plugin, paths):
    service, kubelet, dummy, store = plugin
    os.unlink(os.path.join(paths.plugin_dir(DRIVER), "dra.sock"))
    assert not service.alive()
    service.restart()
    assert service.alive()
    kubelet.wait("registered again", lambda k: any(r["registered"] for r in k.registrations.values()))
    assert kubelet.prepare(DRIVER, [ref(store.objects["vms", "vm-a-gpu"])])[UID1]["error"] == ""
