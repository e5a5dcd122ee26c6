"""The agent's ResourceSlices against the API server double, for gpusim nodes (sysfs is the truth)."""

from __future__ import annotations

import copy
import json
import urllib.request

import kubernetes_validate

from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import slices
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.publisher import SlicePublisher
from ansible_collections.accelops.vgpu.tests.integration.dra.dra_helpers import (
    NODE, NODE_UID, SLICES, client, dra_state, program, published_devices, stored_slices, sysfs_devices)

L40S_1B, L40S_24Q = 1145, 1155


def assert_schema_valid(items):
    for item in items:
        for version in ("1.35.0", "1.36.0", "1.37.0"):
            kubernetes_validate.validate(item, version, strict=True)


def test_five_gpus_of_32_vgpus_publish_as_sysfs_shows_them_split_within_limits(gpusim_node, dra_api, tmp_path):
    gpu_node = gpusim_node("l40s:5")
    typed = program(gpu_node, [L40S_1B])
    truth = sysfs_devices(gpu_node, tmp_path)
    assert len(truth) == len(typed) == 160
    publisher = SlicePublisher(client(dra_api, tmp_path), NODE, NODE_UID)
    publisher.publish(truth)
    found = stored_slices(dra_api)
    assert_schema_valid(found)
    assert [len(item["spec"]["devices"]) for item in found] == [128, 32]
    assert {json.dumps(item["spec"]["pool"], sort_keys=True) for item in found} == {
        json.dumps({"name": slices.pool_name(NODE), "generation": 1, "resourceSliceCount": 2}, sort_keys=True)}
    devices = published_devices(dra_api)
    assert sorted(devices) == sorted(device.name for device in truth)
    assert sorted(d["attributes"]["resource.kubernetes.io/pciBusID"]["string"] for d in devices.values()) == sorted(typed)
    assert {d["attributes"]["profile"]["string"] for d in devices.values()} == {"L40S-1B"}
    assert all(item["metadata"]["ownerReferences"][0]["uid"] == NODE_UID for item in found)


def test_a_layout_change_republishes_and_removes_what_is_gone(gpusim_node, dra_api, tmp_path):
    gpu_node = gpusim_node("l40s:1")
    program(gpu_node, [L40S_24Q], per_pf=2)
    publisher = SlicePublisher(client(dra_api, tmp_path), NODE, NODE_UID)
    publisher.publish(sysfs_devices(gpu_node, tmp_path))
    first_vf, second_vf = gpu_node.vfs(gpu_node.pfs()[0])[:2]
    assert sorted(published_devices(dra_api)) == ["l40s-24q-" + vf.replace(":", "-").replace(".", "-")
                                                  for vf in (first_vf, second_vf)]
    gpu_node.write("bus/pci/devices/%s/nvidia/current_vgpu_type" % second_vf, 0)
    plan = publisher.publish(sysfs_devices(gpu_node, tmp_path))
    assert [body["metadata"]["name"] for body in plan.updates] == [slices.slice_name(NODE, 0)] and not plan.creates
    assert list(published_devices(dra_api)) == ["l40s-24q-" + first_vf.replace(":", "-").replace(".", "-")]
    assert stored_slices(dra_api)[0]["spec"]["pool"]["generation"] == 1     # one write: the generation stays
    assert publisher.publish(sysfs_devices(gpu_node, tmp_path)).empty                   # nothing left to do


def test_stale_slices_of_this_node_go_and_other_nodes_keep_theirs(gpusim_node, dra_api, tmp_path):
    gpu_node = gpusim_node("l40s:1")
    program(gpu_node, [L40S_24Q], per_pf=2)
    api = client(dra_api, tmp_path)
    template = slices.desired_slices(NODE, sysfs_devices(gpu_node, tmp_path), 4)[0]
    stale, foreign = copy.deepcopy(template), copy.deepcopy(template)
    stale["metadata"]["name"] = "gpu-a-old-random-name"
    foreign["metadata"]["name"] = "gpu-b-vgpu.accelops.io-0"
    foreign["spec"].update(nodeName="gpu-b", pool={"name": "gpu-b", "generation": 1, "resourceSliceCount": 1})
    api.create_resource_slice(stale)
    api.create_resource_slice(foreign)
    SlicePublisher(api, NODE, NODE_UID).publish(sysfs_devices(gpu_node, tmp_path))
    names = [item["metadata"]["name"] for item in stored_slices(dra_api)]
    assert names == sorted([slices.slice_name(NODE, 0), "gpu-b-vgpu.accelops.io-0"])
    mine = [item for item in stored_slices(dra_api) if item["spec"]["nodeName"] == NODE]
    assert mine[0]["spec"]["pool"]["generation"] == 5      # above the stale one: the scheduler sees only these


def test_a_write_that_loses_a_race_starts_over(gpusim_node, dra_api, tmp_path):
    gpu_node = gpusim_node("l40s:1")
    program(gpu_node, [L40S_24Q], per_pf=2)
    dra_api.reset(dra_state([(SLICES, None, slices.desired_slices(NODE, sysfs_devices(gpu_node, tmp_path), 1)[0])]))
    gpu_node.write("bus/pci/devices/%s/nvidia/current_vgpu_type" % gpu_node.vfs(gpu_node.pfs()[0])[1], 0)
    dra_api.conflict(count=1, patch={"metadata": {"labels": {"touched": "by-someone-else"}}})
    SlicePublisher(client(dra_api, tmp_path), NODE, NODE_UID).publish(sysfs_devices(gpu_node, tmp_path))
    assert sorted(published_devices(dra_api)) == sorted(device.name for device in sysfs_devices(gpu_node, tmp_path))
    puts = [r for r in dra_api.log() if r["method"] == "PUT"]
    assert len(puts) == 2          # the first lost (409), the second, after a fresh list, won


def test_withdraw_removes_every_slice_of_the_node(gpusim_node, dra_api, tmp_path):
    gpu_node = gpusim_node("l40s:1")
    program(gpu_node, [L40S_24Q], per_pf=2)
    publisher = SlicePublisher(client(dra_api, tmp_path), NODE, NODE_UID)
    publisher.publish(sysfs_devices(gpu_node, tmp_path))
    publisher.withdraw()
    with urllib.request.urlopen(dra_api.url + "/apis/resource.k8s.io/v1/resourceslices", timeout=10) as resp:
        assert json.load(resp)["items"] == []


def slice_requests(api):
    """(method, what) of the ResourceSlice requests the double saw: LIST, or the slice name."""
    return [(r["method"], "LIST" if r["path"].endswith("/resourceslices") else r["path"].rsplit("/", 1)[1])
            for r in api.log() if "/resourceslices" in r["path"]]


def test_a_delete_that_loses_a_race_lists_again_and_ends_with_exactly_its_slices(gpusim_node, dra_api, tmp_path):
    gpu_node = gpusim_node("l40s:1")
    program(gpu_node, [L40S_24Q], per_pf=2)
    stale = slices.desired_slices(NODE, sysfs_devices(gpu_node, tmp_path), 1)[0]
    stale["metadata"]["name"] = "gpu-a-old-random-name"
    dra_api.reset(dra_state([(SLICES, None, stale)]))
    # between the publisher's list and its delete, another writer moves the stale slice to generation 7
    dra_api.conflict(count=1, patch={"spec": {"pool": {"generation": 7}}})
    SlicePublisher(client(dra_api, tmp_path), NODE, NODE_UID).publish(sysfs_devices(gpu_node, tmp_path))
    assert slice_requests(dra_api) == [("GET", "LIST"), ("DELETE", "gpu-a-old-random-name"),   # 409: changed
                                       ("GET", "LIST"), ("DELETE", "gpu-a-old-random-name"),
                                       ("POST", "LIST")]
    found = stored_slices(dra_api)
    assert [item["metadata"]["name"] for item in found] == [slices.slice_name(NODE, 0)]
    assert found[0]["spec"]["pool"]["generation"] == 8      # planned from the fresh list: above the other writer's
    assert sorted(published_devices(dra_api)) == sorted(device.name for device in sysfs_devices(gpu_node, tmp_path))


def test_withdraw_that_loses_a_race_lists_again_and_removes_every_slice(gpusim_node, dra_api, tmp_path):
    gpu_node = gpusim_node("l40s:1")
    program(gpu_node, [L40S_24Q], per_pf=2)
    publisher = SlicePublisher(client(dra_api, tmp_path), NODE, NODE_UID)
    publisher.publish(sysfs_devices(gpu_node, tmp_path))
    dra_api.control("log/clear", {})
    dra_api.conflict(count=1, patch={"metadata": {"labels": {"touched": "by-someone-else"}}})
    publisher.withdraw()
    name = slices.slice_name(NODE, 0)
    assert slice_requests(dra_api) == [("GET", "LIST"), ("DELETE", name), ("GET", "LIST"), ("DELETE", name)]
    assert stored_slices(dra_api) == []


def test_a_publish_after_the_api_round_trip_writes_nothing(gpusim_node, dra_api, tmp_path):
    """The API server stores quantities canonical (24576Mi -> 24Gi): what the publisher writes must already be,
    or every listing publish (a restarted agent, the periodic one) sees a difference and rewrites every slice."""
    gpu_node = gpusim_node("l40s:1")
    program(gpu_node, [L40S_24Q], per_pf=2)
    api = client(dra_api, tmp_path)
    SlicePublisher(api, NODE, NODE_UID).publish(sysfs_devices(gpu_node, tmp_path))
    [stored] = stored_slices(dra_api)
    assert {d["capacity"]["framebuffer"]["value"] for d in stored["spec"]["devices"]} == {"24Gi"}
    dra_api.control("log/clear", {})
    restarted = SlicePublisher(api, NODE, NODE_UID)       # lists, plans against what the API answered
    assert restarted.publish(sysfs_devices(gpu_node, tmp_path)).empty and restarted.writes == 0
    assert [r["method"] for r in dra_api.log() if "/resourceslices" in r["path"]] == ["GET"]
    assert stored_slices(dra_api) == [stored]


def test_the_api_double_stores_slice_quantities_canonical(dra_api, tmp_path):
    """As kube-apiserver: capacity values and counters come back canonical, whatever form was written."""
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "s"},
            "spec": {"driver": "d.example.com", "nodeName": NODE, "pool": {"name": NODE, "generation": 1,
                                                                           "resourceSliceCount": 1},
                     "devices": [{"name": "a", "capacity": {"framebuffer": {"value": "24576Mi"}},
                                  "consumesCounters": [{"counterSet": "gpu", "counters": {"fb": {"value": "1024Mi"}}}]}]}}
    client(dra_api, tmp_path).create_resource_slice(body)
    [stored] = stored_slices(dra_api)
    assert stored["spec"]["devices"][0]["capacity"] == {"framebuffer": {"value": "24Gi"}}
    assert stored["spec"]["devices"][0]["consumesCounters"][0]["counters"] == {"fb": {"value": "1Gi"}}
