"""The scheduler double (tests/fakes/vmi_controller.py DraAllocator) on claim-time devices: counters, multi-
allocatable devices and consumed capacity as kube-scheduler 1.36.2 allocates them (kubernetes
staging/src/k8s.io/dynamic-resource-allocation/structured/allocator.go checkAvailableCounters,
internal/incubating/allocator_incubating.go, consumable_capacity.go; pkg/scheduler/framework/plugins/
dynamicresources), against the slices our driver publishes (kubelet/dra/claim_time.py, slices.py)."""

from __future__ import annotations

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import claim_time, slices
from ansible_collections.accelops.vgpu.tests.fakes.vmi_controller import DraAllocator, Unallocatable

NODE, NS = "gpu-a", "default"
CLASS = {"metadata": {"name": "vgpu.accelops.io"},
         "spec": {"selectors": [{"cel": {"expression": 'device.driver == "vgpu.accelops.io"'}}]}}
PROFILE = 'device.attributes["vgpu.accelops.io"].profile == "%s"'
L40S = [("L40S-48Q", 1156, 1), ("L40S-24Q", 1155, 2), ("L40S-12Q", 1153, 4)]


@pytest.fixture(autouse=True)
def no_sysfs(monkeypatch):
    monkeypatch.setattr(claim_time.dra_devices, "pcie_root", lambda sysfs, address: None)
    monkeypatch.setattr(claim_time.dra_devices, "numa_node", lambda sysfs, address: None)


def published(gpus=1):
    result = [{"address": "0000:%02x:00.0" % (0x41 + gpu), "model": "L40S", "vfs": 32, "allow": None,
               "profiles": [{"profile": p, "type_name": "NVIDIA " + p, "type_id": t, "max_instances": n,
                             "size_mib": 1024} for p, t, n in L40S]} for gpu in range(gpus)]
    return slices.desired_slices(NODE, claim_time.offers(None, result), 1)


def request(profile):
    return {"deviceClassName": "vgpu.accelops.io", "selectors": [{"cel": {"expression": PROFILE % profile}}]}


def claim(name, profile=None, fallback=None):
    if fallback:
        choices = [dict(request(p), name=p.split("-")[1].lower()) for p in fallback]
        requests = [{"name": "vgpu", "firstAvailable": choices}]
    else:
        requests = [{"name": "vgpu", "exactly": request(profile)}]
    return {"metadata": {"name": name, "namespace": NS}, "spec": {"devices": {"requests": requests}}}


class Cluster:
    """Claims allocated one after another, each pass with a fresh allocator (a new scheduling cycle)."""

    def __init__(self, gpus=1):
        self.slices, self.claims = published(gpus), {}

    def allocate(self, body):
        allocator = DraAllocator([CLASS], self.slices, self.claims)
        allocation = allocator.allocate(body, NODE)
        body = dict(body, status={"allocation": allocation})
        self.claims[(NS, body["metadata"]["name"])] = body
        return [(r["request"], r["device"]) for r in allocation["devices"]["results"]]

    def fails(self, body):
        with pytest.raises(Unallocatable):
            self.allocate(body)
        return True

    def release(self, name):
        del self.claims[(NS, name)]


def test_a_profile_device_serves_up_to_its_instances_with_share_ids_and_consumed_capacity():
    cluster = Cluster()
    assert cluster.allocate(claim("a", "L40S-24Q")) == [("vgpu", "l40s-24q-gpu-0000-41-00-0")]
    assert cluster.allocate(claim("b", "L40S-24Q")) == [("vgpu", "l40s-24q-gpu-0000-41-00-0")]
    [result] = cluster.claims[(NS, "b")]["status"]["allocation"]["devices"]["results"]
    assert result["consumedCapacity"] == {"instances": "1"} and result["shareID"]
    assert cluster.fails(claim("c", "L40S-24Q"))      # max instances: 2


def test_two_profiles_never_share_an_equal_size_gpu_and_a_second_gpu_takes_the_other():
    one = Cluster(gpus=1)
    one.allocate(claim("a", "L40S-24Q"))
    assert one.fails(claim("b", "L40S-12Q")) and one.fails(claim("c", "L40S-48Q"))
    two = Cluster(gpus=2)
    two.allocate(claim("a", "L40S-24Q"))
    assert two.allocate(claim("b", "L40S-12Q")) == [("vgpu", "l40s-12q-gpu-0000-42-00-0")]
    assert two.fails(claim("c", "L40S-48Q"))


def test_a_whole_gpu_profile_excludes_the_rest_and_a_release_frees_the_gpu_for_another_profile():
    cluster = Cluster()
    cluster.allocate(claim("whole", "L40S-48Q"))
    assert cluster.fails(claim("x", "L40S-48Q")) and cluster.fails(claim("y", "L40S-12Q"))
    cluster.release("whole")
    for name in "abcd":
        cluster.allocate(claim(name, "L40S-12Q"))
    assert cluster.fails(claim("e", "L40S-12Q"))
    for name in "abc":
        cluster.release(name)
    assert cluster.fails(claim("f", "L40S-24Q"))      # one 12Q still holds the GPU's counter
    cluster.release("d")
    assert cluster.allocate(claim("g", "L40S-24Q")) == [("vgpu", "l40s-24q-gpu-0000-41-00-0")]


def test_a_prioritized_list_falls_back_from_24q_to_12q():
    cluster = Cluster()
    assert cluster.allocate(claim("p", fallback=["L40S-24Q", "L40S-12Q"])) == [
        ("vgpu/24q", "l40s-24q-gpu-0000-41-00-0")]
    cluster.release("p")
    cluster.allocate(claim("small", "L40S-12Q"))
    assert cluster.allocate(claim("q", fallback=["L40S-24Q", "L40S-12Q"])) == [
        ("vgpu/12q", "l40s-12q-gpu-0000-41-00-0")]


def test_a_failed_claim_leaves_nothing_taken_in_the_pass():
    allocator = DraAllocator([CLASS], published(), {})
    body = {"metadata": {"name": "two", "namespace": NS}, "spec": {"devices": {"requests": [
        {"name": "a", "exactly": request("L40S-24Q")}, {"name": "b", "exactly": request("L40S-12Q")}]}}}
    with pytest.raises(Unallocatable):
        allocator.allocate(body, NODE)
    assert allocator.shares == {} and allocator.taken == set()
