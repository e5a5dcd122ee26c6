"""The agent's DRA plugin after each reconcile: which inventory it publishes and when it asks the API (no gRPC here:
the sockets are never started)."""

import copy
import threading
import time
from types import SimpleNamespace

import pytest
from dra_node import L40S, build, node_facts
from schemas import assert_valid

from ansible_collections.accelops.vgpu.plugins.module_utils.kube_errors import KubeUnavailable
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import agent_plugin, devices, slices
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.checkpoint import COMPLETED
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import claim_time_layout
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import Sysfs
from ansible_collections.accelops.vgpu.tests.fakes import kube_api_rules as rules

NODE = "gpu-node-1"


class SliceApi:
    """Stores slices like the API server (resourceVersion per write) and counts calls."""

    def __init__(self):
        self.slices, self.calls, self.version, self.down = {}, [], 0, False
        self.claims = []            # ResourceClaims (list_resource_claims; not counted in `calls`)
        self.claims_down = False    # only the ResourceClaims listing fails (e.g. 403: RBAC without list)

    def _call(self, name):
        self.calls.append(name)
        if self.down:
            raise KubeUnavailable("connection refused")

    def _stored(self, body):
        self.version += 1
        body = dict(body, metadata=dict(body["metadata"], resourceVersion=str(self.version)))
        self.slices[body["metadata"]["name"]] = body
        return body

    def list_resource_slices(self, node_name, driver):
        self._call("list")
        return [s for s in self.slices.values() if s["spec"]["nodeName"] == node_name and s["spec"]["driver"] == driver]

    def create_resource_slice(self, body):
        self._call("create")
        return self._stored(body)

    def replace_resource_slice(self, body):
        self._call("replace")
        return self._stored(body)

    def delete_resource_slice(self, name, resource_version=None):
        self._call("delete")
        self.slices.pop(name, None)

    def list_resource_claims(self):
        if self.down or self.claims_down:
            raise KubeUnavailable("connection refused")
        return copy.deepcopy(self.claims)

    def get_resource_claim(self, namespace, name, timeout=None):
        raise AssertionError("no claim is prepared in these tests")

    def published(self):
        return sorted(d["name"] for s in self.slices.values() for d in s["spec"].get("devices") or ())


@pytest.fixture
def plugin(tmp_path):
    node = build(tmp_path / "node")
    sysfs = Sysfs(str(node.sys))
    reads = []
    settings = SimpleNamespace(node_name=NODE, kubelet_dir=str(tmp_path / "kubelet"), cdi_dir=str(tmp_path / "cdi"),
                               proc_root=str(node.proc))
    api, clock = SliceApi(), [1000.0]
    dra = agent_plugin.VgpuDraPlugin(settings, api, None, lambda line: None, sysfs, None, lambda: None,
                                     clock=lambda: clock[0])
    real_read = dra.view.read_facts

    def counted_read():
        reads.append(1)
        return real_read()

    dra.view.read_facts = counted_read
    return SimpleNamespace(node=node, sysfs=sysfs, api=api, dra=dra, reads=reads, clock=clock)


def apply_result(node):
    """What the engine returns for this node's two L40S-24Q VFs (only the fields from_apply reads)."""
    vfs = [vf["address"] for vf in node_facts(node)["vfs"] if vf["pf"] == L40S and vf.get("vgpu_type_id")]
    return {"resources": [{"profile": "L40S-24Q", "type_name": "NVIDIA L40S-24Q", "framework": "vendor-vfio"}],
            "gpus": [{"address": L40S, "model": "L40S", "framework": "vendor-vfio", "pci_id": "10de:26b9",
                      "vgpus": [{"address": vf, "before": "L40S-24Q", "after": "L40S-24Q", "type_id": 1155}
                                for vf in vfs]}]}


def test_an_applied_reconcile_publishes_the_apply_result_without_reading_the_node(plugin):
    result = apply_result(plugin.node)
    plugin.dra.reconciled("uid-1", plugin.sysfs, result)
    assert plugin.reads == []
    assert plugin.api.published() == ["l40s-24q-0000-41-00-4", "l40s-24q-0000-41-00-5"]
    # prepare's check answers from that same inventory, no full read either
    assert sorted(plugin.dra.view.current(["l40s-24q-0000-41-00-4"])) == ["l40s-24q-0000-41-00-4"]
    assert plugin.reads == []


def test_a_failed_first_reconcile_reads_the_whole_node(plugin):
    plugin.dra.reconciled("uid-1")
    assert plugin.reads == [1]
    assert plugin.api.published() == sorted(d.name for d in devices.inventory(plugin.sysfs, node_facts(plugin.node)))


def test_a_failed_reconcile_keeps_what_was_published_and_is_still_there(plugin):
    """A failed apply may have changed part of the node: devices it cleared go, nothing new is offered before an
    apply verified it, and the node is not read again."""
    plugin.dra.reconciled("uid-1", plugin.sysfs, apply_result(plugin.node))
    plugin.node.set_type("0000:41:00.5", 0)          # cleared by the apply that then failed
    plugin.dra.reconciled("uid-1")
    assert plugin.reads == []
    assert plugin.api.published() == ["l40s-24q-0000-41-00-4"]
    assert [h.device for h in plugin.dra.service.hub.health] == ["l40s-24q-0000-41-00-4"]


def test_the_api_is_asked_only_when_something_changed_after_an_error_or_at_the_full_interval(plugin):
    result = apply_result(plugin.node)
    plugin.dra.reconciled("uid-1", plugin.sysfs, result)
    # the agent asks once what an earlier agent published (claim-time devices in use stay), then the first publish
    # lists (stale slices go)
    assert plugin.api.calls == ["list", "list", "create"]
    del plugin.api.calls[:]
    plugin.dra.reconciled("uid-1", plugin.sysfs, result)    # a resync that re-asserted the same layout
    assert plugin.api.calls == []

    # someone deletes our slice: a full publish within FULL_PUBLISH_INTERVAL puts it back
    plugin.api.slices.clear()
    plugin.clock[0] += agent_plugin.FULL_PUBLISH_INTERVAL
    plugin.dra.reconciled("uid-1", plugin.sysfs, result)
    assert plugin.api.calls == ["list", "create"] and len(plugin.api.published()) == 2
    del plugin.api.calls[:]

    # a layout change is written at once, without waiting for the interval
    plugin.node.set_type("0000:41:00.5", 0)
    result["gpus"][0]["vgpus"].pop()
    plugin.dra.reconciled("uid-1", plugin.sysfs, result)
    assert plugin.api.calls == ["list", "replace"] and plugin.api.published() == ["l40s-24q-0000-41-00-4"]
    del plugin.api.calls[:]

    # an API error: the next reconcile lists again even though the devices did not change since
    plugin.api.down = True
    result["gpus"][0]["vgpus"] = []
    plugin.dra.reconciled("uid-1", plugin.sysfs, result)
    plugin.api.down = False
    plugin.dra.reconciled("uid-1", plugin.sysfs, result)
    assert plugin.api.calls == ["list", "list", "replace"] and plugin.api.published() == []   # an empty pool: one slice


def test_a_claim_time_gpu_is_published_as_profile_devices_and_a_counter_set_never_as_its_vfs(plugin):
    """The apply result's claim_time (node/engine/claim_time_layout.py): the GPU's typed VFs are Prepare's, not fixed devices;
    the failed reconcile after it keeps both apart too."""
    result = apply_result(plugin.node)
    result["gpus"] = []    # the reconcile left the claim-time GPU out
    result["claim_time"] = [{"address": L40S, "model": "L40S", "vfs": 2, "allow": None, "profiles": [
        {"profile": "L40S-24Q", "type_name": "NVIDIA L40S-24Q", "type_id": 1155, "size_mib": 24576,
         "max_instances": 2}]}]
    for failed in (False, True):
        plugin.dra.reconciled("uid-1", *(() if failed else (plugin.sysfs, result)))
        stored = list(plugin.api.slices.values())
        names = [d["name"] for s in stored for d in s["spec"].get("devices") or ()]
        assert "l40s-24q-gpu-0000-41-00-0" in names and not [n for n in names if n.startswith("l40s-24q-0000-41")]
        assert [c["name"] for s in stored for c in s["spec"].get("sharedCounters") or ()] == ["gpu-0000-41-00-0"]
    assert plugin.dra.driver.typer.owns("l40s-24q-gpu-0000-41-00-0")


def test_a_whole_gpu_claim_time_gpu_publishes_its_whole_device_and_the_driver_prepares_it(plugin):
    """whole-gpu (issue 42.1): the agent publishes the whole device beside the profiles and hands it to Prepare."""
    result = apply_result(plugin.node)
    result["gpus"] = []
    result["claim_time"] = [{"address": L40S, "model": "L40S", "vfs": 2, "allow": None, "whole_gpu": True, "profiles": [
        {"profile": "L40S-24Q", "type_name": "NVIDIA L40S-24Q", "type_id": 1155, "size_mib": 24576,
         "max_instances": 2}]}]
    plugin.dra.reconciled("uid-1", plugin.sysfs, result)
    devices_ = {d["name"]: d for s in plugin.api.slices.values() for d in s["spec"].get("devices") or ()}
    assert devices_["whole-gpu-0000-41-00-0"]["consumesCounters"] == [
        {"counterSet": "gpu-0000-41-00-0", "counters": {"gpu": {"value": "1"}}}]
    assert plugin.dra.driver.whole.owns("whole-gpu-0000-41-00-0")


def test_a_server_without_partitionable_devices_refuses_claim_time_once_and_fixed_vgpus_stay_published(plugin):
    """An API server < 1.36 or with the gates off drops the fields (kube_api_rules.drop_disabled_fields, as its
    resourceslice strategy does): claim-time mode is refused with one line naming the node, the GPU and the field."""
    lines = []
    plugin.dra.log = lines.append
    stored = plugin.api._stored

    def dropping(body):
        return stored(rules.drop_disabled_fields("resourceslices", copy.deepcopy(body), {"DRAPartitionableDevices"}))
    plugin.api._stored = dropping
    result = apply_result(plugin.node)
    result["claim_time"] = [{"address": "0000:99:00.0", "model": "L40S", "vfs": 2, "allow": None, "profiles": [
        {"profile": "L40S-24Q", "type_name": "NVIDIA L40S-24Q", "type_id": 1155, "size_mib": 24576,
         "max_instances": 2}]}]
    for dummy in range(2):
        plugin.dra.reconciled("uid-1", plugin.sysfs, result)
    assert plugin.api.published() == ["l40s-24q-0000-41-00-4", "l40s-24q-0000-41-00-5"]
    refused = [line for line in lines if "claim-time mode refused" in line]
    assert len(refused) == 1 and "0000:99:00.0" in refused[0] and "spec.sharedCounters" in refused[0]
    assert not plugin.dra.driver.typer.owns("l40s-24q-gpu-0000-99-00-0")


def test_a_failed_first_reconcile_never_offers_the_vfs_of_a_gpu_the_last_apply_made_claim_time(plugin, tmp_path):
    record = claim_time_layout.modes_path(str(tmp_path / "kubelet"))
    claim_time_layout.write_modes(record, [L40S])     # its typed VFs are prepared claims' (claim-time)
    plugin.dra.reconciled("uid-1")
    every = sorted(d.name for d in devices.inventory(plugin.sysfs, node_facts(plugin.node)))
    assert plugin.api.published() == [name for name in every if "0000-41-00" not in name]
    assert any("0000-41-00" in name for name in every)


# --- issue 40: a claim-time device no longer offered, the pool name ------------------------------------------------
POOL = NODE + "/" + devices.DRIVER          # slices.pool_name
D12, D24 = "l40s-12q-gpu-0000-41-00-0", "l40s-24q-gpu-0000-41-00-0"
OFFERS = {"L40S-24Q": {"profile": "L40S-24Q", "type_name": "NVIDIA L40S-24Q", "type_id": 1155, "size_mib": 24576,
                       "max_instances": 2},
          "L40S-12Q": {"profile": "L40S-12Q", "type_name": "NVIDIA L40S-12Q", "type_id": 1153, "size_mib": 12288,
                       "max_instances": 4}}


def claim_time_result(node, profiles):
    result = apply_result(node)
    result["gpus"] = []
    result["claim_time"] = [{"address": L40S, "model": "L40S", "vfs": 2, "allow": list(profiles),
                             "profiles": [OFFERS[p] for p in profiles]}]
    return result


def record(dra, device, pool=POOL, uid="uid-a"):
    """A claim prepared on `device` in the driver's checkpoint (what NodePrepareResources records)."""
    dra.driver.checkpoint.set(uid, "vms", "vm-a", COMPLETED, [
        {"requests": ["gpu"], "pool": pool, "device": device, "key": "0000:41:00.4", "typeID": 1153, "cdiIDs": [],
         "claimTime": True}])


def allocated(device, pool=POOL):
    return {"metadata": {"namespace": "vms", "name": "vm-b"}, "status": {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": devices.DRIVER, "pool": pool, "device": device}]}}}}


def stored_devices(api):
    return {d["name"]: d for s in api.slices.values() for d in s["spec"].get("devices") or ()}


def test_a_profile_no_longer_offered_stays_published_tainted_while_a_claim_uses_it(plugin):
    """Narrowing the allow-list (or the driver no longer listing a profile: the same apply result) must not withdraw a
    device a claim uses: kube-scheduler charges the GPU's counter only for devices it still finds in the slices."""
    plugin.dra.reconciled("uid-1", plugin.sysfs, claim_time_result(plugin.node, ["L40S-24Q", "L40S-12Q"]))
    record(plugin.dra, D12)
    narrowed = claim_time_result(plugin.node, ["L40S-24Q"])
    for step in range(3):       # prepared: kept however long it takes
        plugin.dra.reconciled("uid-1", plugin.sysfs, narrowed)
        found = stored_devices(plugin.api)
        assert found[D12]["taints"] == [{"key": "vgpu.accelops.io/withdrawn", "effect": "NoSchedule"}]
        assert "taints" not in found[D24] and plugin.dra.driver.typer.owns(D12)
        assert [c["name"] for s in plugin.api.slices.values() for c in s["spec"].get("sharedCounters") or ()] == [
            "gpu-0000-41-00-0"]
        plugin.clock[0] += agent_plugin.WITHDRAW_GRACE
    plugin.dra.driver.checkpoint.drop("uid-a")
    plugin.api.claims = [allocated(D12)]            # allocated, not prepared (yet): the API says so
    plugin.dra.reconciled("uid-1", plugin.sysfs, narrowed)
    assert D12 in stored_devices(plugin.api)
    plugin.api.claims, plugin.api.down = [], True     # the API cannot say: unsure = held
    plugin.dra.reconciled("uid-1", plugin.sysfs, narrowed)
    plugin.api.down = False
    assert D12 in stored_devices(plugin.api)
    plugin.dra.reconciled("uid-1", plugin.sysfs, narrowed)
    assert sorted(stored_devices(plugin.api)) == [D24] and not plugin.dra.driver.typer.owns(D12)


def test_a_whole_device_no_longer_declared_stays_published_tainted_while_a_claim_has_it_allocated(plugin):
    """whole-gpu dropped from the declaration while a whole-GPU claim is allocated: withdrawing the device would free
    the GPU's counter for vGPU claims (kubernetes#140806); it stays, tainted, like a profile no longer offered."""
    whole = claim_time_result(plugin.node, ["L40S-24Q"])
    whole["claim_time"][0]["whole_gpu"] = True
    plugin.dra.reconciled("uid-1", plugin.sysfs, whole)
    plugin.api.claims = [allocated("whole-gpu-0000-41-00-0")]
    plugin.clock[0] += agent_plugin.WITHDRAW_GRACE
    plugin.dra.reconciled("uid-1", plugin.sysfs, claim_time_result(plugin.node, ["L40S-24Q"]))
    found = stored_devices(plugin.api)
    assert found["whole-gpu-0000-41-00-0"]["taints"] == [{"key": "vgpu.accelops.io/withdrawn", "effect": "NoSchedule"}]
    assert found["whole-gpu-0000-41-00-0"]["consumesCounters"] and plugin.dra.driver.whole.owns("whole-gpu-0000-41-00-0")
    plugin.api.claims, plugin.clock[0] = [], plugin.clock[0] + agent_plugin.WITHDRAW_GRACE
    plugin.dra.reconciled("uid-1", plugin.sysfs, claim_time_result(plugin.node, ["L40S-24Q"]))
    assert sorted(stored_devices(plugin.api)) == [D24]


def test_a_profile_no_longer_offered_goes_after_the_grace_when_no_claim_uses_it(plugin):
    plugin.dra.reconciled("uid-1", plugin.sysfs, claim_time_result(plugin.node, ["L40S-24Q", "L40S-12Q"]))
    narrowed = claim_time_result(plugin.node, ["L40S-24Q"])
    plugin.dra.reconciled("uid-1", plugin.sysfs, narrowed)      # tainted first: the scheduler may be allocating it
    assert stored_devices(plugin.api)[D12]["taints"]
    plugin.clock[0] += agent_plugin.WITHDRAW_GRACE
    plugin.dra.reconciled("uid-1", plugin.sysfs, narrowed)
    assert sorted(stored_devices(plugin.api)) == [D24]


def legacy_slices(api):
    """What the agent before issue 40 left: its pool named after the node, under the same slice names."""
    for body in slices.desired_slices(NODE, [], 3, pool=NODE):
        api._stored(body)


def test_the_pool_moves_to_node_slash_driver_once_no_claim_uses_the_pool_named_after_the_node(plugin):
    legacy_slices(plugin.api)
    record(plugin.dra, "l40s-24q-0000-41-00-4", pool=NODE)     # prepared before the upgrade
    plugin.dra.reconciled("uid-1", plugin.sysfs, apply_result(plugin.node))
    assert {s["spec"]["pool"]["name"] for s in plugin.api.slices.values()} == {NODE}
    assert plugin.dra.driver.pool == NODE
    plugin.dra.driver.checkpoint.drop("uid-a")
    plugin.api.claims = [allocated("l40s-24q-0000-41-00-5", pool=NODE)]    # allocated before the upgrade
    plugin.dra.reconciled("uid-1", plugin.sysfs, apply_result(plugin.node))
    assert {s["spec"]["pool"]["name"] for s in plugin.api.slices.values()} == {NODE}
    plugin.api.claims = [allocated("l40s-24q-0000-41-00-5")]     # the new pool's claims do not hold the old name
    plugin.dra.reconciled("uid-1", plugin.sysfs, apply_result(plugin.node))
    pools = [s["spec"]["pool"] for s in plugin.api.slices.values()]
    assert pools == [{"name": POOL, "generation": 1, "resourceSliceCount": 1}]    # replaced, not a second pool
    assert plugin.dra.driver.pool == POOL and sorted(stored_devices(plugin.api)) == [
        "l40s-24q-0000-41-00-4", "l40s-24q-0000-41-00-5"]
    plugin.api.claims = [allocated("l40s-24q-0000-41-00-5", pool=NODE)]   # never asked again once moved
    plugin.dra.reconciled("uid-1", plugin.sysfs, apply_result(plugin.node))
    assert {s["spec"]["pool"]["name"] for s in plugin.api.slices.values()} == {POOL}


def test_the_pool_keeps_the_nodes_name_while_the_api_cannot_say_which_claims_are_allocated(plugin):
    plugin.api.claims_down = True
    plugin.dra.reconciled("uid-1", plugin.sysfs, apply_result(plugin.node))
    assert {s["spec"]["pool"]["name"] for s in plugin.api.slices.values()} == {NODE}
    plugin.api.claims_down = False
    plugin.dra.reconciled("uid-1", plugin.sysfs, apply_result(plugin.node))
    assert {s["spec"]["pool"]["name"] for s in plugin.api.slices.values()} == {POOL}


def restarted(plugin):
    """A new agent process on the same node, kubelet directory and API (it knows nothing it published before)."""
    dra = agent_plugin.VgpuDraPlugin(plugin.dra.settings, plugin.api, None, lambda line: None, plugin.sysfs, None,
                                     lambda: None, clock=lambda: plugin.clock[0])
    return dra


def test_a_restarted_agent_keeps_a_used_profile_the_new_config_no_longer_offers(plugin):
    """The config change that narrows the allow-list rolls the DaemonSet: the new agent must keep the device too."""
    plugin.dra.reconciled("uid-1", plugin.sysfs, claim_time_result(plugin.node, ["L40S-24Q", "L40S-12Q"]))
    record(plugin.dra, D12)
    plugin.dra.driver.checkpoint.save()
    again = restarted(plugin)
    again.reconciled("uid-1", plugin.sysfs, claim_time_result(plugin.node, ["L40S-24Q"]))
    found = stored_devices(plugin.api)
    assert found[D12]["taints"] and found[D12]["capacity"] == {"instances": {
        "value": "4", "requestPolicy": {"default": "1", "validValues": ["1"]}}}
    assert again.driver.typer.owns(D12)


def test_a_restarted_agents_failed_first_reconcile_keeps_the_claim_time_devices_the_api_has(plugin, tmp_path):
    plugin.dra.reconciled("uid-1", plugin.sysfs, claim_time_result(plugin.node, ["L40S-24Q", "L40S-12Q"]))
    claim_time_layout.write_modes(claim_time_layout.modes_path(str(tmp_path / "kubelet")), [L40S])
    again = restarted(plugin)
    again.reconciled("uid-1")
    stored = set(stored_devices(plugin.api))
    assert {D12, D24} <= stored and not [n for n in stored if n.startswith("l40s-24q-0000-41")]
    assert [c["name"] for s in plugin.api.slices.values() for c in s["spec"].get("sharedCounters") or ()] == [
        "gpu-0000-41-00-0"]
    assert again.driver.typer.owns(D12) and again.driver.typer.owns(D24)   # its claims prepare too


def test_a_failed_apply_that_planned_the_claim_time_offers_serves_them_on_recorded_gpus_only(plugin, tmp_path):
    """A layout refused on another GPU (a VM holds a VF) fails the apply after the claim-time GPUs' offers were
    planned: a restarted agent serves those (a narrowed allow-list tainting as after a success); a GPU the failed
    apply did not finish moving to claim-time (not recorded) offers nothing."""
    plugin.dra.reconciled("uid-1", plugin.sysfs, claim_time_result(plugin.node, ["L40S-24Q", "L40S-12Q"]))
    record(plugin.dra, D12)
    plugin.dra.driver.checkpoint.save()
    modes = claim_time_layout.modes_path(str(tmp_path / "kubelet"))
    claim_time_layout.write_modes(modes, [L40S])
    again = restarted(plugin)
    again.reconciled("uid-1", planned=(plugin.sysfs, claim_time_result(plugin.node, ["L40S-24Q"])["claim_time"]))
    found = stored_devices(plugin.api)
    assert "taints" not in found[D24] and found[D12]["taints"]
    assert again.driver.typer.owns(D24) and again.driver.typer.owns(D12)
    claim_time_layout.write_modes(modes, [])
    plugin.dra.driver.checkpoint.drop("uid-a")
    plugin.dra.driver.checkpoint.save()
    plugin.clock[0] += agent_plugin.WITHDRAW_GRACE
    third = restarted(plugin)
    third.reconciled("uid-1", planned=(plugin.sysfs, claim_time_result(plugin.node, ["L40S-24Q"])["claim_time"]))
    assert stored_devices(plugin.api)[D24]["taints"]       # not offered: withdrawn (after its grace, gone)


def test_a_used_profile_no_longer_offered_survives_a_reboot_that_wiped_the_slices(plugin):
    """An allow-list narrowed, then a reboot: the kubelet that starts deletes every slice of its node before the agent
    starts, so the API no longer says what was published. The claim prepared before the reboot is prepared again by
    the kubelet: its device must still be published (tainted, charging its GPU's counter) and preparable."""
    plugin.dra.reconciled("uid-1", plugin.sysfs, claim_time_result(plugin.node, ["L40S-24Q", "L40S-12Q"]))
    narrowed = claim_time_result(plugin.node, ["L40S-24Q"])
    plugin.dra.reconciled("uid-1", plugin.sysfs, narrowed)
    record(plugin.dra, D12)
    plugin.dra.driver.checkpoint.save()
    plugin.api.slices.clear()           # the kubelet's start after the reboot
    again = restarted(plugin)
    again.reconciled("uid-1", plugin.sysfs, narrowed)
    found = stored_devices(plugin.api)
    assert found[D12]["taints"] and found[D12]["capacity"]["instances"]["value"] == "4"
    assert again.driver.typer.owns(D12)


def test_with_no_reconcile_finished_the_sockets_are_served_after_a_while_and_new_claims_still_wait(plugin):
    """The API server down at an agent restart: no reconcile finishes, but a pod that goes must be unprepared and a
    prepared claim answered (from the checkpoint); the sockets are served SERVE_WITHOUT_INVENTORY s after the start,
    new claims still wait for the first inventory; that reconcile serves nothing twice."""
    dra, started = plugin.dra, []
    dra.service = SimpleNamespace(start=lambda: started.append(1), alive=lambda: True, socket="dra.sock",
                                  update_health=lambda devices: None)
    dra.started, dra.started_at, dra.watch_interval = True, plugin.clock[0], 0.01
    watch = threading.Thread(target=dra._watch, daemon=True)
    watch.start()
    time.sleep(0.2)
    assert started == []
    plugin.clock[0] += agent_plugin.SERVE_WITHOUT_INVENTORY
    deadline = time.monotonic() + 10
    while not started and time.monotonic() < deadline:
        time.sleep(0.01)
    dra._stop.set()
    watch.join()
    assert started == [1] and not dra.driver._ready.is_set()
    dra.reconciled("uid-1", plugin.sysfs, apply_result(plugin.node))
    assert started == [1] and dra.driver._ready.is_set()


# --- issue 42.2: a withdrawn MIG-backed placement keeps its counters ------------------------------------------------
ME0 = "h100-1-10cme-gpu-0000-41-00-0-at-0"
MIG_OFFERS = {"H100-1-10C": {"profile": "H100-1-10C", "type_name": "NVIDIA H100-1-10C", "type_id": 1130,
                             "size_mib": 10240, "gi_profile": 19, "compute": 1, "size": 1, "starts": list(range(7)),
                             "max_instances": 7},
              "H100-1-10CME": {"profile": "H100-1-10CME", "type_name": "NVIDIA H100-1-10CME", "type_id": 1131,
                               "size_mib": 10240, "gi_profile": 20, "compute": 1, "size": 1,
                               "starts": list(range(7)), "max_instances": 1}}


def mig_result(node, profiles, limits):
    result = claim_time_result(node, [])
    result["claim_time"] = [{"address": L40S, "model": "H100", "vfs": 2, "allow": list(profiles),
                             "profiles": [MIG_OFFERS[p] for p in profiles],
                             "mig": {"memory_slices": 8, "compute_slices": 7, "limits": limits}}]
    return result


def counter_shapes_hold(api):
    """Every counter a published device consumes exists in its pool's counter set of that name (else the scheduler
    cannot charge it: the device reads as free, or the pool as invalid)."""
    sets = {c["name"]: c["counters"] for s in api.slices.values() for c in s["spec"].get("sharedCounters") or ()}
    for device in stored_devices(api).values():
        for entry in device.get("consumesCounters") or ():
            missing = set(entry["counters"]) - set(sets.get(entry["counterSet"]) or ())
            assert not missing, "%s consumes %s, not in counter set %s %s" % (
                device["name"], sorted(missing), entry["counterSet"], sorted(sets.get(entry["counterSet"]) or ()))
    return True


@pytest.mark.parametrize("after", ["narrowed", "not-claim-time", "mig-off", "time-sliced"])
def test_a_withdrawn_placement_keeps_the_counters_it_consumes(plugin, after):
    """A claim prepared on a `+me` placement, then the allow-list narrowed (the `gi-profile-20` limit no longer in the
    offered set), the GPU left claim-time mode, MIG mode off (no offer), or the allow-list made time-sliced: the
    withdrawn placement must keep its consumption and a counter set that has those counters."""
    plugin.dra.reconciled("uid-1", plugin.sysfs, mig_result(plugin.node, ["H100-1-10C", "H100-1-10CME"], {"20": 1}))
    assert counter_shapes_hold(plugin.api)
    record(plugin.dra, ME0)
    before = stored_devices(plugin.api)[ME0]["consumesCounters"]
    result = {"narrowed": mig_result(plugin.node, ["H100-1-10C"], {}),
              "not-claim-time": claim_time_result(plugin.node, []),
              "mig-off": dict(claim_time_result(plugin.node, []), claim_time=[
                  {"address": L40S, "model": "H100", "vfs": 2, "allow": ["H100-1-10C"], "profiles": []}]),
              "time-sliced": claim_time_result(plugin.node, ["L40S-24Q"])}[after]
    plugin.dra.reconciled("uid-1", plugin.sysfs, result)
    found = stored_devices(plugin.api)
    assert found[ME0]["taints"] and found[ME0]["consumesCounters"] == before
    assert counter_shapes_hold(plugin.api)
    assert plugin.dra.driver.typer.owns(ME0)
    for item in plugin.api.slices.values():
        assert_valid(dict(item, apiVersion="resource.k8s.io/v1", kind="ResourceSlice"))


def test_a_restarted_agent_keeps_a_used_placement_the_new_config_no_longer_offers(plugin):
    """The config change rolls the DaemonSet: the new agent reads the placement device back from the slices (and
    from the node's record after a reboot) with its consumption, tainted, preparable."""
    plugin.dra.reconciled("uid-1", plugin.sysfs, mig_result(plugin.node, ["H100-1-10C", "H100-1-10CME"], {"20": 1}))
    record(plugin.dra, ME0)
    plugin.dra.driver.checkpoint.save()
    before = stored_devices(plugin.api)[ME0]
    for wiped in (False, True):
        if wiped:
            plugin.api.slices.clear()       # the kubelet's start after a reboot
        again = restarted(plugin)
        again.reconciled("uid-1", plugin.sysfs, claim_time_result(plugin.node, []))
        found = stored_devices(plugin.api)
        assert found[ME0]["taints"] and found[ME0]["consumesCounters"] == before["consumesCounters"]
        assert found[ME0]["attributes"] == before["attributes"]
        assert counter_shapes_hold(plugin.api) and again.driver.typer.owns(ME0)
