"""Claim-time slices (kubelet/dra/claim_time.py) through the agent's API client and the API server double: stored
as sent where the server serves partitionable devices and consumable capacity; refused, naming the slice and the
field, where it drops them (an API server < 1.36 or with the gates off: kube_api_rules.drop_disabled_fields)."""

from __future__ import annotations

import kubernetes_validate
import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import claim_time, slices
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.publisher import SlicePublisher
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import Sysfs
from ansible_collections.accelops.vgpu.tests.integration.dra.dra_helpers import (
    NODE, NODE_UID, client, dra_state, program, stored_slices, sysfs_devices)

L40S_24Q = 1155


def offers(gpu_node, addresses):
    profiles = [{"profile": "L40S-24Q", "type_name": "NVIDIA L40S-24Q", "type_id": 1155, "size_mib": 24576,
                 "max_instances": 2},
                {"profile": "L40S-12Q", "type_name": "NVIDIA L40S-12Q", "type_id": 1153, "size_mib": 12288,
                 "max_instances": 4}]
    return claim_time.offers(Sysfs(gpu_node.root), [{"address": a, "model": "L40S", "vfs": 32, "allow": None,
                                                     "profiles": profiles} for a in addresses])


def test_claim_time_slices_are_stored_as_sent_and_valid_for_136_and_137(gpusim_node, dra_api, tmp_path):
    gpu_node = gpusim_node("l40s:2")
    program(gpu_node, [L40S_24Q], per_pf=2)
    first, second = gpu_node.pfs()
    fixed = [d for d in sysfs_devices(gpu_node, tmp_path) if d.parent_gpu == first]
    publisher = SlicePublisher(client(dra_api, tmp_path), NODE, NODE_UID)
    publisher.publish(fixed + offers(gpu_node, [second]))
    found = stored_slices(dra_api)
    for item in found:
        for version in ("1.36.0", "1.37.0"):
            kubernetes_validate.validate(item, version, strict=True)
    counters = [s for item in found for s in item["spec"].get("sharedCounters") or ()]
    assert counters == [{"name": claim_time.counter_set_name(second), "counters": {"gpu": {"value": "1"}}}]
    devices = {d["name"]: d for item in found for d in item["spec"].get("devices") or ()}
    shared = devices[claim_time.device_name("L40S-24Q", second)]
    assert shared["allowMultipleAllocations"] and shared["consumesCounters"]
    assert shared["capacity"]["instances"]["requestPolicy"] == {"default": "1", "validValues": ["1"]}
    assert len(devices) == 4 and all(d["attributes"]["parentGPU"]["string"] == first for d in devices.values()
                                     if "pciBusID" in str(d["attributes"]))


@pytest.mark.parametrize("gates", [["DRAPartitionableDevices"], ["DRAConsumableCapacity"]])
def test_a_server_that_drops_the_fields_refuses_claim_time_and_fixed_devices_still_publish(
        gpusim_node, dra_api, tmp_path, gates):
    gpu_node = gpusim_node("l40s:2")
    program(gpu_node, [L40S_24Q], per_pf=2)
    first, second = gpu_node.pfs()
    state = dra_state()
    state["disabledFeatures"] = gates
    dra_api.reset(state)
    fixed = [d for d in sysfs_devices(gpu_node, tmp_path) if d.parent_gpu == first]
    publisher = SlicePublisher(client(dra_api, tmp_path), NODE, NODE_UID)
    with pytest.raises(claim_time.FeatureMissing) as err:
        publisher.publish(fixed + offers(gpu_node, [second]))
    message = str(err.value)
    assert message.startswith("ResourceSlice %s: the API server dropped " % slices.slice_name(NODE, 0)
                              if gates == ["DRAPartitionableDevices"] else "ResourceSlice ") and "\n" not in message
    assert "DRAPartitionableDevices" in message and "DRAConsumableCapacity" in message
    publisher.publish(fixed)
    found = stored_slices(dra_api)
    assert sorted(d["name"] for item in found for d in item["spec"].get("devices") or ()) == sorted(d.name for d in fixed)
    assert not [item for item in found if item["spec"].get("sharedCounters")]


def withdrawn_12q(gpu_node, gpu):
    """The GPU's offers with its L40S-12Q device withdrawn (tainted), as agent_plugin publishes it under a claim."""
    return [item.withdraw() if getattr(item, "profile", None) == "L40S-12Q" else item
            for item in offers(gpu_node, [gpu])]


def test_a_withdrawn_profile_device_is_tainted_valid_for_136_and_137_and_republished_without_a_write(
        gpusim_node, dra_api, tmp_path):
    """The taint (claim_time.WITHDRAWN_TAINT) passes the strict 1.36/1.37 schemas; the API server adds timeAdded,
    which a listing publish does not count as a change."""
    gpu_node = gpusim_node("l40s:1")
    [gpu] = gpu_node.pfs()
    items = withdrawn_12q(gpu_node, gpu)
    publisher = SlicePublisher(client(dra_api, tmp_path), NODE, NODE_UID)
    publisher.publish(items)
    found = stored_slices(dra_api)
    for item in found:
        for version in ("1.36.0", "1.37.0"):
            kubernetes_validate.validate(item, version, strict=True)
    tainted = [d for item in found for d in item["spec"].get("devices") or () if d.get("taints")]
    assert [d["name"] for d in tainted] == [claim_time.device_name("L40S-12Q", gpu)]
    assert tainted[0]["taints"][0]["timeAdded"] and not publisher.taints_dropped
    writes = publisher.writes
    assert publisher.publish(items).empty and publisher.writes == writes


def test_a_server_without_device_taints_keeps_the_withdrawn_device_published_and_says_so(
        gpusim_node, dra_api, tmp_path):
    """DRADeviceTaints off (beta, on by default from 1.36; GA in 1.37): the taint is dropped, the device stays
    published (its GPU's counter charged), the publisher says the taints were dropped; nothing else is refused."""
    gpu_node = gpusim_node("l40s:1")
    [gpu] = gpu_node.pfs()
    state = dra_state()
    state["disabledFeatures"] = ["DRADeviceTaints"]
    dra_api.reset(state)
    items = withdrawn_12q(gpu_node, gpu)
    publisher = SlicePublisher(client(dra_api, tmp_path), NODE, NODE_UID)
    publisher.publish(items)
    devices = {d["name"]: d for item in stored_slices(dra_api) for d in item["spec"].get("devices") or ()}
    assert publisher.taints_dropped and "taints" not in devices[claim_time.device_name("L40S-12Q", gpu)]
