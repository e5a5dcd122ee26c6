"""The DRA conformance checks as pure functions: ResourceSlices, ResourceClaims and VMIs in, rows out."""

from __future__ import annotations

from ansible_collections.accelops.vgpu.plugins.module_utils.cluster.conformance import dra, workloads
from ansible_collections.accelops.vgpu.plugins.module_utils.cluster.conformance.checks import FAIL, PASS, UNKNOWN
from ansible_collections.accelops.vgpu.tests.unit.plugins.module_utils.kubelet.dra.schemas import assert_valid

DRIVER = "vgpu.accelops.io"
GPU_A, GPU_B = "0000:41:00.0", "0000:42:00.0"
CLASS = {"metadata": {"name": "vgpu.accelops.io"}}


def device(name, profile, parent):
    return {"name": name, "attributes": {"profile": {"string": profile}, "parentGPU": {"string": parent}}}


def dra_slice(node, devices, generation=1, count=1, driver=DRIVER):
    return {"spec": {"driver": driver, "nodeName": node, "devices": devices,
                     "pool": {"name": node, "generation": generation, "resourceSliceCount": count}}}


# gpu-a: 4 x L40S-24Q on two GPUs; gpu-b: 2 x L40S-24Q, 1 x L40S-12Q
SLICES = [dra_slice("gpu-a", [device("l40s-24q-%d" % i, "L40S-24Q", (GPU_A, GPU_B)[i // 2]) for i in range(4)]),
          dra_slice("gpu-b", [device("b-%d" % i, "L40S-24Q", GPU_A) for i in range(2)]
                    + [device("b-12q", "L40S-12Q", GPU_B)])]
NODES = [{"metadata": {"name": n, "labels": {"kubernetes.io/hostname": n + ".lan"}}} for n in ("gpu-a", "gpu-b")]


def plan(profile="L40S-24Q"):
    plans, missing = dra.plan_workloads([profile], SLICES, NODES, "vgpu.accelops.io")
    assert missing == []
    return plans[0]


def claim(name, device_name=None, pool="gpu-a", reserved=True, driver=DRIVER):
    status = {}
    if device_name:
        status["allocation"] = {"devices": {"results": [{"request": "vgpu", "driver": driver, "pool": pool,
                                                         "device": device_name}]}}
        if reserved:
            status["reservedFor"] = [{"resource": "pods", "name": "virt-launcher-" + name, "uid": "u-" + name}]
    return {"metadata": {"name": name}, "status": status}


def vmi(name, phase="Running", node="gpu-a", conditions=None):
    status = {"phase": phase}
    if node:
        status["nodeName"] = node
    if conditions:
        status["conditions"] = conditions
    return {"metadata": {"name": name}, "status": status}


NAMES = ["d-1", "d-2", "d-3", "d-4"]
RUNNING = dict((n, vmi(n)) for n in NAMES)


def test_dra_is_reported_never_failed():
    gpu_class = {"metadata": {"name": "vfio.gpu.nvidia.com"}}
    assert dra.dra_check(False, [], []).status == UNKNOWN
    assert dra.dra_check("DeviceClasses: forbidden (HTTP 403)", [], []).reason.startswith("DeviceClasses: forbidden")
    assert dra.dra_check(True, [{"metadata": {"name": "nic.example.com"}}], []).status == UNKNOWN
    row = dra.dra_check(True, [gpu_class], [{"spec": {"driver": "gpu.nvidia.com"}}])
    assert (row.status, row.reason) == (
        PASS, "DeviceClass(es) for GPUs: vfio.gpu.nvidia.com; ResourceSlice drivers: gpu.nvidia.com")


def test_dra_reports_the_vgpus_our_driver_publishes_per_node_and_profile():
    def profiled(node, generation, profiles):
        return dra_slice(node, [{"name": "d%d" % i, "attributes": {"profile": {"string": p}}}
                                for i, p in enumerate(profiles)], generation)
    slices = [profiled("gpu-a", 2, ["L40S-24Q", "L40S-24Q"]), profiled("gpu-a", 1, ["L40S-12Q"] * 4),
              profiled("gpu-b", 1, ["L40S-12Q", "A16-2Q"])]
    row = dra.dra_check(True, [{"metadata": {"name": "vgpu.accelops.io"}}], slices)
    assert row.status == PASS
    assert row.details["vgpus"] == {"gpu-a": {"L40S-24Q": 2}, "gpu-b": {"A16-2Q": 1, "L40S-12Q": 1}}
    assert row.reason.endswith("vgpu.accelops.io publishes gpu-a: 2 x L40S-24Q, gpu-b: 1 x A16-2Q, 1 x L40S-12Q")


def test_claims_are_not_tried_without_dra_our_slices_or_the_device_class():
    assert dra.unavailable(False, [], [], "vgpu.accelops.io") == (
        "resource.k8s.io/v1 is not served by this cluster: vGPUs cannot be claimed through DRA")
    assert dra.unavailable(True, [CLASS], [dra_slice("gpu-a", [], driver="gpu.nvidia.com")], "vgpu.accelops.io") == (
        "vgpu.accelops.io publishes no ResourceSlice: its DRA driver does not serve (the node agent's "
        "vgpu_node_agent_dra)")
    assert dra.unavailable(True, [CLASS], SLICES, "mine.example.com").startswith(
        "DeviceClass mine.example.com does not exist")
    assert dra.unavailable(True, [CLASS], SLICES, "vgpu.accelops.io") is None
    rows = dra.unavailable_rows("why")
    assert [(r.check, r.subject, r.status, r.reason) for r in rows] == [
        ("sharing.dra", DRIVER, UNKNOWN, "why"), ("over-allocation.dra", DRIVER, UNKNOWN, "why")]


def test_the_plan_takes_the_node_with_the_most_devices_of_the_profile_from_complete_newest_pools():
    found = plan()
    assert (found["node"], found["hostname"], found["count"], found["gpus"]) == ("gpu-a", "gpu-a.lan", 4, [GPU_A, GPU_B])
    assert found["devices"][("gpu-a", "l40s-24q-3")] == GPU_B
    assert (plan("L40S-12Q")["node"], plan("L40S-12Q")["count"]) == ("gpu-b", 1)
    # a newer generation replaces the pool; an incomplete pool (1 of 2 slices) is not allocatable
    newer = SLICES + [dra_slice("gpu-a", [device("x", "L40S-24Q", GPU_A)], generation=2)]
    assert dra.plan_workloads(["L40S-24Q"], newer, NODES, "c")[0][0]["node"] == "gpu-b"
    partial = [dra_slice("gpu-a", [device("x", "A16-4Q", GPU_A)], count=2)]
    assert dra.plan_workloads(["A16-4Q"], partial, NODES, "c") == ([], ["A16-4Q"])


def test_the_claim_selects_the_profile_by_cel_and_the_vmi_names_claim_and_request():
    found = plan()
    body = workloads.claim_manifest("d-1", "ns", "run1", found)
    assert body["apiVersion"] == "resource.k8s.io/v1" and body["kind"] == "ResourceClaim"
    assert body["spec"]["devices"]["requests"] == [{"name": "vgpu", "exactly": {
        "deviceClassName": "vgpu.accelops.io", "allocationMode": "ExactCount", "count": 1,
        "selectors": [{"cel": {"expression": 'device.attributes["vgpu.accelops.io"].profile == "L40S-24Q"'}}]}}]
    assert workloads.run_of(body) == "run1"
    assert_valid(body)   # the real resource.k8s.io/v1 ResourceClaim schema of Kubernetes 1.35-1.37, strict
    machine = workloads.vmi_manifest("d-1", "ns", "run1", found, {"vmi_memory": "1Gi", "container_disk_image": "i"},
                                     claim="d-1")
    assert machine["spec"]["resourceClaims"] == [{"name": "vgpu", "resourceClaimName": "d-1"}]
    assert machine["spec"]["domain"]["devices"]["gpus"] == [{"name": "vgpu1", "claimName": "vgpu", "requestName": "vgpu"}]
    assert machine["spec"]["nodeSelector"] == {"kubernetes.io/hostname": "gpu-a.lan"}
    assert dra.workload_names(found) == (["vgpu-conformance-dra-l40s-24q-%d" % i for i in range(1, 5)],
                                         "vgpu-conformance-dra-l40s-24q-extra")


def test_sharing_passes_when_two_claims_got_devices_on_one_gpu():
    claims = dict((n, claim(n, "l40s-24q-%d" % i)) for i, n in enumerate(NAMES))
    row = dra.sharing_check(plan(), NAMES, RUNNING, claims, 10)
    assert row.status == PASS, row.reason
    assert row.reason == ("4 VMI(s) with a ResourceClaim of DeviceClass vgpu.accelops.io (profile L40S-24Q) Running on "
                          "gpu-a, each on its own device; d-1 and d-2 share physical GPU 0000:41:00.0 "
                          "(status.allocation, parentGPU)")
    assert row.details["allocation"]["d-4"] == ["gpu-a/l40s-24q-3"]
    assert row.details["parent_gpus"] == {"d-1": GPU_A, "d-2": GPU_A, "d-3": GPU_B, "d-4": GPU_B}


def test_sharing_fails_on_a_device_given_twice_a_wrong_device_or_a_vmi_that_does_not_run():
    twice = dict((n, claim(n, "l40s-24q-%d" % min(i, 2))) for i, n in enumerate(NAMES))
    row = dra.sharing_check(plan(), NAMES, RUNNING, twice, 10)
    assert (row.status, row.reason) == (FAIL, "device gpu-a/l40s-24q-2 allocated to 2 claims: d-3, d-4")
    wrong = dict((n, claim(n, "l40s-24q-%d" % i)) for i, n in enumerate(NAMES))
    wrong["d-4"] = claim("d-4", "b-12q", pool="gpu-b")
    row = dra.sharing_check(plan(), NAMES, RUNNING, wrong, 10)
    assert (row.status, row.reason) == (FAIL, "ResourceClaim d-4 got gpu-b/b-12q of driver vgpu.accelops.io, not a "
                                              "published L40S-24Q device of gpu-a")
    pending = dict(RUNNING, **{"d-4": vmi("d-4", "Pending", None, [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": "0/3 nodes are available: 1 cannot allocate all claims"}])})
    claims = dict((n, claim(n, "l40s-24q-%d" % i)) for i, n in enumerate(NAMES[:3]))
    claims["d-4"] = claim("d-4")
    row = dra.sharing_check(plan(), NAMES, pending, claims, 10)
    assert row.status == FAIL
    assert row.reason == ("not Running after 10s: d-4 (Pending: 0/3 nodes are available: 1 cannot allocate all claims); "
                          "ResourceClaim d-4 has 0 allocated device(s) for its request, not 1")
    unreserved = dict((n, claim(n, "l40s-24q-%d" % i, reserved=(i != 0))) for i, n in enumerate(NAMES))
    assert dra.sharing_check(plan(), NAMES, RUNNING, unreserved, 10).reason == (
        "ResourceClaim d-1 is allocated but reserved for no consumer")


def test_sharing_is_unknown_when_every_device_sits_on_its_own_gpu():
    slices = [dra_slice("gpu-a", [device("x", "L40S-48Q", GPU_A), device("y", "L40S-48Q", GPU_B)])]
    own = dra.plan_workloads(["L40S-48Q"], slices, NODES, "vgpu.accelops.io")[0][0]
    claims = {"d-1": claim("d-1", "x"), "d-2": claim("d-2", "y")}
    row = dra.sharing_check(own, ["d-1", "d-2"], RUNNING, claims, 10)
    assert row.status == UNKNOWN and row.reason.endswith("every device on another physical GPU (parentGPU): nothing "
                                                         "shared to prove")


UNSCHEDULABLE = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                 "message": "0/3 nodes are available: 1 cannot allocate all claims, 2 node(s) didn't match Pod's "
                            "node affinity/selector"}


FULL = dict((n, claim(n, "l40s-24q-%d" % i)) for i, n in enumerate(NAMES))


def test_over_allocation_passes_when_the_extra_claim_stays_unallocated_and_its_vmi_unschedulable():
    pending = vmi("x", "Pending", None, [UNSCHEDULABLE])
    row = dra.overallocation_check(plan(), "x", [(pending, claim("x"))] * 3, FULL, 2)
    assert row.status == PASS
    assert row.reason == ("ResourceClaim x (number 5 for 4 L40S-24Q device(s) on gpu-a) stayed unallocated and VMI x "
                          "Pending for 2s: " + UNSCHEDULABLE["message"])


def test_over_allocation_is_unknown_while_the_capacity_claims_do_not_hold_every_device():
    pending = vmi("x", "Pending", None, [UNSCHEDULABLE])
    capacity = dict(FULL, **{"d-4": claim("d-4")})
    row = dra.overallocation_check(plan(), "x", [(pending, claim("x"))], capacity, 2)
    assert (row.status, row.reason) == (UNKNOWN, "only 3 of the 4 capacity claims were allocated: the node's L40S-24Q "
                                                 "devices were not all taken, so claim x proves nothing")


def test_over_allocation_fails_naming_the_device_given_twice_or_a_vmi_placed_or_no_condition():
    capacity = dict(FULL, **{"d-3": claim("d-3", "l40s-24q-2")})
    seen = [(vmi("x", "Pending", None), claim("x")), (vmi("x", "Scheduling"), claim("x", "l40s-24q-2"))]
    row = dra.overallocation_check(plan(), "x", seen, capacity, 2)
    assert (row.status, row.reason) == (FAIL, "ResourceClaim x (number 5 for 4 L40S-24Q device(s) on gpu-a) was "
                                              "allocated gpu-a/l40s-24q-2 (also allocated to d-3): over-allocation "
                                              "not blocked")
    row = dra.overallocation_check(plan(), "x", [(vmi("x", "Scheduling"), claim("x"))], capacity, 2)
    assert row.status == FAIL and row.reason.startswith("VMI x (number 5 for 4 L40S-24Q device(s)) was placed on gpu-a")
    row = dra.overallocation_check(plan(), "x", [(vmi("x", "Pending", None), claim("x"))], capacity, 2)
    assert (row.status, row.reason) == (FAIL, "ResourceClaim x stayed unallocated but VMI x has no Unschedulable "
                                              "condition after 2s")
    row = dra.overallocation_check(plan(), "x", [(vmi("x", "Pending", None), None)], capacity, 2)
    assert (row.status, row.reason) == (FAIL, "VMI or ResourceClaim x disappeared while observed")


def test_the_gpus_dra_publishes_per_node_newest_generation():
    # an agent split between its device plugin and DRA (issue 31.5): these GPUs carry no extended resource
    newer = SLICES + [dra_slice("gpu-b", [device("b-0", "L40S-24Q", GPU_B)], generation=2)]
    assert dra.dra_gpus(newer) == {"gpu-a": {GPU_A, GPU_B}, "gpu-b": {GPU_B}}
    assert dra.dra_gpus([dra_slice("gpu-a", [device("x", "L40S-24Q", GPU_A)], driver="other.example.com")]) == {}


def test_mig_backed_placements_count_as_many_claims_as_their_counters_allow(monkeypatch):
    from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import claim_time, devices, slices  # pylint: disable=import-outside-toplevel
    monkeypatch.setattr(devices, "pcie_root", lambda sysfs, address: None)
    monkeypatch.setattr(devices, "numa_node", lambda sysfs, address: None)
    shapes = [("H100-1-10C", 19, 1, 1, range(7)), ("H100-1-10CME", 20, 1, 1, range(7)), ("H100-3-40C", 9, 3, 4, (0, 4))]
    gpu = {"address": GPU_A, "model": "H100", "vfs": 16,
           "mig": {"memory_slices": 8, "compute_slices": 7, "limits": {"20": 1}},
           "profiles": [{"profile": p, "type_name": "NVIDIA " + p, "type_id": 1118 + i, "size_mib": 10240,
                         "gi_profile": g, "compute": c, "size": n, "starts": list(starts)}
                        for i, (p, g, c, n, starts) in enumerate(shapes)]}
    published = slices.desired_slices("gpu-a", claim_time.offers(None, [gpu]), 1)
    plans, missing = dra.plan_workloads(["H100-1-10C", "H100-1-10CME", "H100-3-40C"], published, NODES, "c")
    assert missing == [] and [(p["profile"], p["count"], len(p["devices"])) for p in plans] == [
        ("H100-1-10C", 7, 7), ("H100-1-10CME", 1, 7), ("H100-3-40C", 2, 2)]


def test_the_whole_gpu_and_its_vgpus_exclude_each_other_through_the_scheduler_double(monkeypatch):
    """exclusion.dra (issue 42.1) over the slices a whole-gpu claim-time GPU publishes: the claims the run creates,
    allocated by the scheduler double (counters charged), give the row PASS both ways; an allocator that ignores the
    counters (as NVIDIA's whole-GPU devices, which have none) gives it FAIL."""
    from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import claim_time, devices, slices  # pylint: disable=import-outside-toplevel
    from ansible_collections.accelops.vgpu.tests.fakes.vmi_controller import DraAllocator, Unallocatable  # pylint: disable=import-outside-toplevel
    monkeypatch.setattr(devices, "pcie_root", lambda sysfs, address: None)
    monkeypatch.setattr(devices, "numa_node", lambda sysfs, address: None)
    profiles = [{"profile": p, "type_name": "NVIDIA " + p, "type_id": t, "size_mib": s, "max_instances": m}
                for p, t, s, m in (("L40S-24Q", 1155, 24576, 2), ("L40S-12Q", 1154, 12288, 4))]
    gpus = [{"address": address, "model": "L40S", "vfs": 32, "whole_gpu": whole, "profiles": profiles}
            for address, whole in ((GPU_A, False), (GPU_B, True))]
    published = slices.desired_slices("gpu-a", claim_time.offers(None, gpus), 1)
    assert dra.plan_exclusion(["L40S-48Q"], published, NODES, "vgpu.accelops.io") is None
    plan_ = dra.plan_exclusion(["L40S-12Q", "L40S-24Q"], published, NODES, "vgpu.accelops.io")
    assert (plan_["gpu"], plan_["node"], plan_["hostname"], plan_["vgpu_profile"], plan_["whole"]) == (
        GPU_B, "gpu-a", "gpu-a.lan", "L40S-12Q", "whole-gpu-0000-42-00-0")
    whole, vgpu = dra.exclusion_sides(plan_)
    pending = vmi("b", "Pending", None, [UNSCHEDULABLE])

    def rounds(overallocate):
        found = []
        for (a, b), (first, second) in zip(dra.exclusion_names(), ((whole, vgpu), (vgpu, whole))):
            claims = [workloads.claim_manifest(n, "ns", "run", side) for n, side in ((a, first), (b, second))]
            claims[0]["status"] = {"allocation": DraAllocator([CLASS], published, {}).allocate(claims[0], "gpu-a")}
            try:
                claims[1]["status"] = {"allocation": DraAllocator([CLASS], published, {("ns", a): claims[0]},
                                                                  overallocate).allocate(claims[1], "gpu-a")}
            except Unallocatable:
                pass
            found.append((first, a, claims[0], second, b, [(pending, claims[1])]))
        return found
    found = rounds(False)
    assert [dra.allocated(r[2])[0][3] for r in found] == ["whole-gpu-0000-42-00-0", "l40s-12q-gpu-0000-42-00-0"]
    row = dra.exclusion_check(plan_, found, 2)
    assert (row.check, row.subject, row.status) == ("exclusion.dra", "%s@gpu-a" % GPU_B, PASS), row.reason
    assert "vgpu-conformance-dra-excl-2 (L40S-12Q) stayed unallocated for 2s while vgpu-conformance-dra-excl-1 held " \
        "%s/whole-gpu-0000-42-00-0" % dra.allocated(found[0][2])[0][2] in row.reason
    row = dra.exclusion_check(plan_, rounds(True), 2)
    assert row.status == FAIL and "one GPU given whole and as vGPUs" in row.reason
    row = dra.exclusion_check(plan_, [(whole, "a", claim("a"), vgpu, "b", [(pending, claim("b"))])], 2)
    assert row.status == UNKNOWN and "was not allocated: nothing to exclude" in row.reason
