import copy
import dataclasses

import pytest
from dra_node import build, inventory
from schemas import assert_valid

from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import slices
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.devices import DraDevice

NODE, UID = "gpu-node-1", "7f0c1f7e-1111-4e2a-9d4b-000000000001"
POOL = NODE + "/vgpu.accelops.io"


def vgpus(gpus, per_gpu, profile="L40S-24Q", type_id=1155):
    """`gpus` x `per_gpu` vendor-VFIO vGPUs (an 8-GPU node has 8 x 32)."""
    found = []
    for gpu in range(gpus):
        for vf in range(per_gpu):
            address = "0000:%02x:%02x.%d" % (0x41 + gpu, (vf + 4) // 8, (vf + 4) % 8)
            found.append(DraDevice(name="%s-%s" % (profile.lower(), address.replace(":", "-").replace(".", "-")),
                                   framework="vendor-vfio", address=address, parent_gpu="0000:%02x:00.0" % (0x41 + gpu),
                                   profile=profile, type_name="NVIDIA " + profile, type_id=type_id,
                                   pcie_root="pci0000:%02x" % (0x41 + gpu), numa_node=gpu % 2, product="L40S",
                                   framebuffer_mib=24576))
    return found


def stored(plan, existing=()):
    """The API's slices after `plan` ran against `existing`: each write gets a new resourceVersion."""
    store = {item["metadata"]["name"]: item for item in existing}
    for name, dummy in plan.deletes:
        del store[name]
    for number, body in enumerate(plan.updates + plan.creates):
        body = copy.deepcopy(body)
        body["metadata"]["resourceVersion"] = str(5000 + number)
        store[body["metadata"]["name"]] = body
    return sorted(store.values(), key=lambda item: item["metadata"]["name"])


def test_a_node_publishes_one_pool_that_is_schema_valid(tmp_path):
    found = inventory(build(tmp_path))
    result = slices.desired_slices(NODE, found, 1, UID)
    assert len(result) == 1
    assert_valid(result[0])
    spec = result[0]["spec"]
    assert (spec["driver"], spec["nodeName"], spec["pool"]) == (
        "vgpu.accelops.io", NODE, {"name": POOL, "generation": 1, "resourceSliceCount": 1})
    assert [d["name"] for d in spec["devices"]] == [d.name for d in found]
    assert result[0]["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": UID, "controller": True}]


@pytest.mark.parametrize("gpus,per_gpu,sizes", [
    (5, 32, [128, 32]), (8, 32, [128, 128]), (8, 16, [128]), (9, 32, [128, 128, 32])])
def test_pools_split_at_the_api_limit_with_one_generation_and_count(gpus, per_gpu, sizes):
    result = slices.desired_slices(NODE, vgpus(gpus, per_gpu), 3)
    assert [len(item["spec"]["devices"]) for item in result] == sizes
    assert {(item["spec"]["pool"]["generation"], item["spec"]["pool"]["resourceSliceCount"]) for item in result} == \
        {(3, len(sizes))}
    assert len({item["metadata"]["name"] for item in result}) == len(sizes)
    for item in result:
        assert_valid(item)
        for device in item["spec"]["devices"]:
            assert len(device["attributes"]) + len(device.get("capacity", {})) <= 32   # the API's per-device limit


def test_an_empty_node_keeps_an_empty_pool():
    result = slices.desired_slices(NODE, [], 1)
    assert [item["spec"]["devices"] for item in result] == [[]]
    assert_valid(result[0])


def test_first_publish_creates_at_generation_one():
    plan = slices.plan(NODE, vgpus(5, 32), [])
    assert (plan.deletes, plan.updates) == ([], [])
    assert [body["spec"]["pool"] for body in plan.creates] == [
        {"name": POOL, "generation": 1, "resourceSliceCount": 2}] * 2


def test_nothing_to_do_when_the_api_matches():
    devices = vgpus(5, 32)
    api = stored(slices.plan(NODE, devices, []))
    assert slices.plan(NODE, devices, api).empty


def test_a_change_inside_one_slice_updates_it_and_keeps_the_generation():
    devices = vgpus(5, 32)
    api = stored(slices.plan(NODE, devices, []))
    devices[-1] = dataclasses.replace(devices[-1], name="l40s-48q-x", profile="L40S-48Q", type_id=1156)
    plan = slices.plan(NODE, devices, api)
    assert (plan.deletes, plan.creates) == ([], [])
    assert [body["metadata"]["name"] for body in plan.updates] == [slices.slice_name(NODE, 1)]
    assert plan.updates[0]["metadata"]["resourceVersion"] == api[1]["metadata"]["resourceVersion"]
    assert plan.updates[0]["spec"]["pool"]["generation"] == 1


def test_a_change_across_slices_bumps_the_generation_of_every_slice():
    api = stored(slices.plan(NODE, vgpus(5, 32), []))
    plan = slices.plan(NODE, vgpus(5, 32, "L40S-12Q", 1154), api)
    assert len(plan.updates) == 2 and not plan.creates
    assert {body["spec"]["pool"]["generation"] for body in plan.updates} == {2}


def test_a_shrinking_pool_deletes_the_slices_it_no_longer_needs():
    api = stored(slices.plan(NODE, vgpus(8, 32), []))
    plan = slices.plan(NODE, vgpus(2, 32), api)
    assert plan.deletes == [(slices.slice_name(NODE, 1), api[1]["metadata"]["resourceVersion"])]
    after = stored(plan, api)
    assert [(item["spec"]["pool"]["resourceSliceCount"], len(item["spec"]["devices"])) for item in after] == [(1, 64)]


def test_stale_slices_of_this_node_are_deleted_foreign_ones_are_not_seen():
    devices = vgpus(1, 4)
    api = stored(slices.plan(NODE, devices, []))
    stale_pool = copy.deepcopy(api[0])
    stale_pool["metadata"].update(name="old-name", resourceVersion="77")
    stale_pool["spec"]["pool"]["name"] = "old-pool"
    old_generation = copy.deepcopy(api[0])
    old_generation["metadata"].update(name=slices.slice_name(NODE, 5), resourceVersion="78")
    old_generation["spec"]["pool"]["generation"] = 0
    foreign = copy.deepcopy(api[0])
    foreign["metadata"]["name"] = "other-node-slice"
    foreign["spec"]["nodeName"] = "other-node"
    plan = slices.plan(NODE, devices, api + [stale_pool, old_generation, foreign])
    assert sorted(plan.deletes) == sorted([("old-name", "77"), (slices.slice_name(NODE, 5), "78")])
    assert not plan.updates and not plan.creates


def test_long_node_names_still_give_valid_slice_names():
    name = slices.slice_name("n" * 250, 12)
    assert len(name) <= 253 and name.endswith("-vgpu.accelops.io-12")
