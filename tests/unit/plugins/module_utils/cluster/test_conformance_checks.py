"""The conformance checks as pure functions: cluster objects in, PASS / FAIL / UNKNOWN rows out."""

from __future__ import annotations

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.cluster.conformance import checks
from ansible_collections.accelops.vgpu.plugins.module_utils.cluster.conformance.checks import (
    FAIL, PASS, UNKNOWN, ConformanceError)

L40S = "nvidia.com/NVIDIA_L40S-24Q"
PREFIX = "accelops.io/vgpu.profile."


def cr(pci=(), mdev=()):
    return {"metadata": {"name": "kubevirt", "namespace": "kubevirt"},
            "spec": {"configuration": {"permittedHostDevices": {"pciHostDevices": list(pci),
                                                                "mediatedDevices": list(mdev)}}}}


def node(name, labels=None, allocatable=None):
    return {"metadata": {"name": name, "labels": dict({"kubernetes.io/hostname": name + ".lan"}, **(labels or {}))},
            "status": {"allocatable": dict((k, str(v)) for k, v in (allocatable or {}).items())}}


def vmi(name, phase=None, node_name=None, conditions=None):
    status = {}
    if phase:
        status["phase"] = phase
    if node_name:
        status["nodeName"] = node_name
    if conditions:
        status["conditions"] = conditions
    return {"metadata": {"name": name}, "status": status}


L40S_ENTRY = {"pciVendorSelector": "10DE:26B9", "resourceName": L40S}
TWO_L40S = {"gpus": [{"address": "0000:41:00.0", "vgpus": [{"after": "L40S-24Q"}, {"after": "L40S-24Q"}]},
                     {"address": "0000:42:00.0", "vgpus": [{"after": "L40S-24Q"}, {"after": None}]}]}


def test_only_nvidia_entries_are_vgpu_resources_and_nodes_map_by_allocatable_and_labels():
    kubevirt = cr(pci=[L40S_ENTRY, {"pciVendorSelector": "8086:1572", "resourceName": "intel.com/x710"}],
                  mdev=[{"mdevNameSelector": "NVIDIA A16-4Q", "resourceName": "nvidia.com/NVIDIA_A16-4Q"},
                        {"mdevNameSelector": "i915-GVTg_V5_4", "resourceName": "intel.com/gvt"}])
    nodes = [node("a", {PREFIX + "L40S-24Q": "3"}, {L40S: 3}), node("b", {}, {L40S: 0}), node("c")]
    found = checks.discover_resources(kubevirt, nodes)
    assert [(r.name, r.kind, r.model) for r in found] == [
        (L40S, "pciHostDevices", "L40S"), ("nvidia.com/NVIDIA_A16-4Q", "mediatedDevices", "A2/A16")]
    assert (found[0].allocatable, found[0].labelled, found[0].profiles) == (
        {"a": 3}, {"a": {"L40S-24Q": 3}}, {"L40S-24Q"})
    assert found[1].profiles == {"A16-4Q"}


def test_model_named_resources_take_their_profiles_from_the_node_labels():
    kubevirt = cr(pci=[{"pciVendorSelector": "10DE:26B9", "resourceName": "nvidia.com/NVIDIA_L40S"}])
    nodes = [node("a", {PREFIX + "L40S-24Q": "2"}, {"nvidia.com/NVIDIA_L40S": 2}),
             node("b", {PREFIX + "L40S-12Q": "4"}, {"nvidia.com/NVIDIA_L40S": 4})]
    res = checks.discover_resources(kubevirt, nodes)[0]
    assert res.profiles == {"L40S-24Q", "L40S-12Q"}
    plans, missing = checks.plan_workloads([res], ["L40S-24Q", "L40S-12Q"], {}, nodes)
    assert [(p["profile"], p["node"], p["count"], p["hostname"]) for p in plans] == [
        ("L40S-24Q", "a", 2, "a.lan"), ("L40S-12Q", "b", 4, "b.lan")]
    assert missing == []


def test_inventory_unknown_accelerator_is_unknown_and_an_unserved_resource_fails():
    kubevirt = cr(pci=[{"pciVendorSelector": "10DE:ABCD", "resourceName": "nvidia.com/NVIDIA_ZX9-8Q"}, L40S_ENTRY],
                  mdev=[{"mdevNameSelector": "NVIDIA QQ7-2Q", "resourceName": "nvidia.com/NVIDIA_QQ7-2Q"}])
    rows = checks.inventory_checks(checks.discover_resources(kubevirt, [node("a", {}, {"nvidia.com/NVIDIA_ZX9-8Q": 2})]))
    assert [(r.subject, r.status) for r in rows] == [("nvidia.com/NVIDIA_ZX9-8Q", UNKNOWN), (L40S, FAIL),
                                                     ("nvidia.com/NVIDIA_QQ7-2Q", UNKNOWN)]
    assert rows[1].reason == "pciVendorSelector 10DE:26B9 (L40S) is permitted but no node advertises it in status.allocatable"
    assert "mdevNameSelector NVIDIA QQ7-2Q is not in the collection's GPU catalog" in rows[2].reason


def test_profile_filter_names_the_unknown_profile_and_the_known_ones():
    res = checks.discover_resources(cr(pci=[L40S_ENTRY]), [node("a", {PREFIX + "L40S-24Q": "2"}, {L40S: 2})])
    assert checks.select_profiles(res, []) == ["L40S-24Q"]
    assert checks.select_profiles(res, ["L40S-24Q"]) == ["L40S-24Q"]
    with pytest.raises(ConformanceError, match=r"^profile L40S-8Q: not a vGPU profile of this cluster \(known: L40S-24Q\)$"):
        checks.select_profiles(res, ["L40S-8Q"])


@pytest.mark.parametrize("labels, allocatable, facts, status, reason", [
    ({PREFIX + "L40S-24Q": "3"}, 3, TWO_L40S, PASS, "allocatable 3, node facts 3 vGPU(s), profile labels 3"),
    ({PREFIX + "L40S-24Q": "4"}, 3, TWO_L40S, FAIL, "allocatable 3, node facts 3 vGPU(s), profile labels 4 (labels stale)"),
    ({PREFIX + "L40S-24Q": "3"}, 2, TWO_L40S, FAIL, "allocatable 2, node facts 3 vGPU(s), profile labels 3"),
    ({PREFIX + "L40S-24Q": "2"}, 2, None, PASS, "allocatable 2, profile labels L40S-24Q=2"),
    ({PREFIX + "L40S-24Q": "2"}, 1, None, FAIL, "allocatable 1, profile labels L40S-24Q=2"),
    ({}, 2, None, UNKNOWN, "allocatable 2, but neither a profile label nor node facts say how many vGPUs the node has "
                           "(label the node, or add it to the inventory)"),
])
def test_accounting_compares_allocatable_with_the_facts_then_the_labels(labels, allocatable, facts, status, reason):
    res = checks.discover_resources(cr(pci=[L40S_ENTRY]), [node("a", labels, {L40S: allocatable})])
    rows = checks.accounting_checks(res, {"a": facts} if facts else {})
    assert [(r.subject, r.status, r.reason) for r in rows] == [("a " + L40S, status, reason)]


def test_facts_profiles_reads_vgpu_profile_results_and_vgpu_facts():
    assert checks.facts_profiles(TWO_L40S) == {"L40S-24Q": {"count": 3, "gpus": ["0000:41:00.0", "0000:42:00.0"]}}
    facts = {"gpus": [], "vfs": [{"address": "0000:41:00.4", "pf": "0000:41:00.0", "vgpu_type": "NVIDIA L40S-24Q"},
                                 {"address": "0000:41:00.5", "pf": "0000:41:00.0", "vgpu_type": "NVIDIA L40S-24Q"},
                                 {"address": "0000:41:00.6", "pf": "0000:41:00.0", "vgpu_type": None},
                                 {"address": "0000:51:00.4", "pf": "0000:51:00.0", "vgpu_type": None}],
             "mdevs": [{"parent": "0000:51:00.4", "type_name": "NVIDIA A2-1B"},
                       {"parent": "0000:61:00.0", "type_name": "NVIDIA T4-8Q"}]}
    assert checks.facts_profiles(facts) == {"L40S-24Q": {"count": 2, "gpus": ["0000:41:00.0"]},
                                            "A2-1B": {"count": 1, "gpus": ["0000:51:00.0"]},
                                            "T4-8Q": {"count": 1, "gpus": ["0000:61:00.0"]}}


PLAN = {"profile": "L40S-24Q", "resource": L40S, "node": "a", "hostname": "a", "count": 3, "physical_gpus": 2,
        "gpus": ["0000:41:00.0", "0000:42:00.0"]}
NAMES = ["v-1", "v-2", "v-3"]


def test_sharing_passes_by_pigeonhole_and_says_what_it_did_not_see():
    row = checks.sharing_check(PLAN, NAMES, dict((n, vmi(n, "Running", "a")) for n in NAMES), 60)
    assert row.status == PASS
    assert row.reason == ("3 VMI(s) requesting %s Running on a on 2 physical GPU(s) carrying L40S-24Q: at least two "
                          "share one GPU (pigeonhole; per-VMI device mapping is not published by KubeVirt)" % L40S)


@pytest.mark.parametrize("plan, vmis, status, reason", [
    (PLAN, {"v-1": vmi("v-1", "Running", "a"), "v-2": vmi("v-2", "Scheduled", "a")}, FAIL,
     "not Running after 60s: v-2 (Scheduled), v-3 (gone)"),
    (PLAN, {"v-1": vmi("v-1", "Running", "a"), "v-2": vmi("v-2", "Running", "b"), "v-3": vmi("v-3", "Running", "a")},
     FAIL, "Running on another node than a: v-2 on b"),
    (dict(PLAN, physical_gpus=None), dict((n, vmi(n, "Running", "a")) for n in NAMES), UNKNOWN,
     "3 VMI(s) requesting %s Running on a; which physical GPU each uses is unknown: no node facts for a "
     "(add the node to the inventory)" % L40S),
    (dict(PLAN, physical_gpus=3), dict((n, vmi(n, "Running", "a")) for n in NAMES), UNKNOWN,
     "3 VMI(s) requesting %s Running on a on 3 physical GPU(s): this profile gives no more vGPUs than GPUs on the "
     "node, nothing shared to prove" % L40S),
])
def test_sharing_fails_or_is_unknown(plan, vmis, status, reason):
    row = checks.sharing_check(plan, NAMES, vmis, 60)
    assert (row.status, row.reason) == (status, reason)


UNSCHEDULABLE = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                 "message": "0/3 nodes are available: 1 Insufficient " + L40S}


@pytest.mark.parametrize("observed, status, reason", [
    ([vmi("x", "Pending"), vmi("x", "Pending", conditions=[UNSCHEDULABLE])], PASS,
     "VMI x (number 4) stayed Pending for 30s: 0/3 nodes are available: 1 Insufficient " + L40S),
    ([vmi("x", "Pending"), vmi("x", "Scheduling", "a")], FAIL,
     "VMI x (number 4 on 3 vGPU(s)) was placed on a (Scheduling): over-allocation not blocked"),
    ([vmi("x", "Pending"), vmi("x", "Running", "a")], FAIL,
     "VMI x (number 4 on 3 vGPU(s)) was placed on a (Running): over-allocation not blocked"),
    ([vmi("x", "Pending"), vmi("x", "Pending")], FAIL, "VMI x stayed Pending for 30s but has no Unschedulable condition"),
    ([vmi("x", "Pending"), None], FAIL, "VMI x disappeared while observed"),
])
def test_over_allocation_must_stay_pending_and_unschedulable(observed, status, reason):
    row = checks.overallocation_check(PLAN, "x", observed, 30, dict((n, vmi(n, "Running", "a")) for n in NAMES))
    assert (row.status, row.reason) == (status, reason)


@pytest.mark.parametrize("observed", [[vmi("x", "Pending", conditions=[UNSCHEDULABLE])], [vmi("x", "Running", "a")]])
def test_over_allocation_proves_nothing_unless_the_capacity_vmis_all_run_on_the_node(observed):
    """A capacity VMI that failed or runs elsewhere left a vGPU free: a pending extra VMI is no proof, a placed
    one is no over-allocation."""
    capacity = dict((n, vmi(n, "Running", "a")) for n in NAMES)
    for broken in (vmi(NAMES[1], "Failed", "a"), vmi(NAMES[1], "Running", "b"), None):
        row = checks.overallocation_check(PLAN, "x", observed, 30, dict(capacity, **{NAMES[1]: broken}))
        assert (row.status, row.reason) == (UNKNOWN, "only 2 of the 3 capacity VMI(s) Running on a: its L40S-24Q "
                                            "vGPUs were not all taken, so VMI x proves nothing")


def test_ready_names_the_vmis_that_are_not_ready():
    ready = {"type": "Ready", "status": "True"}
    vmis = {"v-1": vmi("v-1", "Running", "a", [ready]), "v-2": vmi("v-2", "Running", "a", [dict(ready, status="False")]),
            "v-3": vmi("v-3", "Running", "a", [ready])}
    row = checks.ready_check(PLAN, NAMES, vmis, 300)
    assert (row.status, row.reason) == (FAIL, "not Ready after 300s: v-2")
    vmis["v-2"] = vmi("v-2", "Running", "a", [ready])
    assert checks.ready_check(PLAN, NAMES, vmis, 300).status == PASS


def test_guest_check_is_unknown_without_a_command_never_pass():
    assert checks.guest_check(PLAN, None, {}).status == UNKNOWN
    assert checks.guest_check(PLAN, "nvidia-smi", {}).status == FAIL
    row = checks.guest_check(PLAN, "nvidia-smi", {"v-1": (0, "ok"), "v-2": (None, "timed out after 5s")})
    assert (row.status, row.reason) == (FAIL, "'nvidia-smi' failed in: v-2 (rc None: timed out after 5s)")
    assert checks.guest_check(PLAN, "nvidia-smi", {"v-1": (0, "ok")}).status == PASS


def test_consistency_wants_integer_counts_and_profile_labels():
    nodes = [node("a", {PREFIX + "L40S-24Q": "2"}, {L40S: 2}), node("b", {}, {L40S: 2})]
    res = checks.discover_resources(cr(pci=[L40S_ENTRY]), nodes)
    row = checks.consistency_checks(res, nodes)[0]
    assert (row.status, row.reason) == (FAIL, "node(s) b advertise it without a accelops.io/vgpu.profile.<profile> label")
    assert set(row.details) == {"vgpu", "mig", "time_sliced"}
    nodes = nodes[:1]
    res = checks.discover_resources(cr(pci=[L40S_ENTRY]), nodes)
    assert checks.consistency_checks(res, nodes)[0].status == PASS


def test_vmi_names_are_dns_labels():
    names, extra = checks.vmi_names(dict(PLAN, profile="H200X-1-18C", count=2))
    assert (names, extra) == (["vgpu-conformance-h200x-1-18c-1", "vgpu-conformance-h200x-1-18c-2"],
                              "vgpu-conformance-h200x-1-18c-extra")


def test_grid_named_mdev_types_map_to_their_profile_labels_and_facts():
    kubevirt = cr(mdev=[{"mdevNameSelector": "GRID T4-8Q", "resourceName": "nvidia.com/GRID_T4-8Q"}])
    nodes = [node("a", {PREFIX + "T4-8Q": "2"}, {"nvidia.com/GRID_T4-8Q": 2})]
    res = checks.discover_resources(kubevirt, nodes)
    assert (res[0].model, res[0].labelled) == ("T4", {"a": {"T4-8Q": 2}})
    facts = {"vfs": [], "mdevs": [{"parent": "0000:47:00.0", "type_name": "GRID T4-8Q"}] * 2}
    rows = checks.accounting_checks(res, {"a": facts})
    assert [(r.status, r.reason) for r in rows] == [(PASS, "allocatable 2, node facts 2 vGPU(s), profile labels 2")]
    assert checks.consistency_checks(res, nodes)[0].status == PASS


RTX_PRO = "nvidia.com/GB202GL_RTX_PRO_6000"
RTX_PRO_ENTRY = {"pciVendorSelector": "10DE:2BB5", "resourceName": RTX_PRO}


def test_a_whole_gpu_passed_through_is_unknown_in_the_inventory_and_counted_by_no_other_check():
    nodes = [node("a", {PREFIX + "L40S-24Q": "2"}, {L40S: 2}), node("p", {}, {RTX_PRO: 1})]
    found = checks.discover_resources(cr(pci=[L40S_ENTRY, RTX_PRO_ENTRY]), nodes)
    assert [(r.name, r.passthrough) for r in found] == [(L40S, False), (RTX_PRO, True)]
    assert checks.vgpu_resources(found) == found[:1]
    inventory = checks.inventory_checks(found)
    assert [(r.subject, r.status) for r in inventory] == [(L40S, PASS), (RTX_PRO, UNKNOWN)]
    assert inventory[1].reason == (
        "pciVendorSelector 10DE:2BB5 (RTX PRO 6000 Blackwell) is permitted for passthrough of a whole GPU (p: 1): no "
        "vGPU profile maps to it, so it is not a vGPU resource of this collection; not attested")
    assert inventory[1].details["passthrough"] is True
    facts = {"p": {"gpus": [{"address": "0000:41:00.0", "vgpus": []}]}}
    assert [r.subject for r in checks.accounting_checks(found, facts)] == ["a " + L40S]
    assert [(r.subject, r.status) for r in checks.consistency_checks(found, nodes)] == [(L40S, PASS)]
    assert checks.select_profiles(found, []) == ["L40S-24Q"]
    assert checks.plan_workloads(found, ["L40S-24Q"], {}, nodes)[0][0]["resource"] == L40S


@pytest.mark.parametrize("pci,mdev", [
    ([{"pciVendorSelector": "10DE:26B9", "resourceName": "nvidia.com/NVIDIA_L40S"}], []),  # model naming, no label yet
    ([], [{"mdevNameSelector": "NVIDIA A16-4Q", "resourceName": "nvidia.com/a16"}]),     # an mdev is always a vGPU
])
def test_a_vgpu_resource_without_profile_labels_is_never_passthrough(pci, mdev):
    name = (pci + mdev)[0]["resourceName"]
    found = checks.discover_resources(cr(pci=pci, mdev=mdev), [node("a", {}, {name: 1})])
    assert found[0].passthrough is False


@pytest.mark.parametrize("allocatable, dra_served, status, reason", [
    # the agent split the node: 1 vGPU through the device plugin, 2 through DRA
    (1, {"a": {"L40S-24Q": 2}}, PASS, "allocatable 1, node facts 1 vGPU(s), profile labels 1 (2 more through the DRA "
                                      "driver)"),
    # both ways on the same GPUs (refused by the agent since issue 31.5): the extended resource counts them all
    (3, {"a": {"L40S-24Q": 3}}, PASS, "allocatable 3, node facts 3 vGPU(s), profile labels 3"),
    (2, {"a": {"L40S-24Q": 2}}, FAIL, "allocatable 2, node facts 3 vGPU(s), profile labels 3"),
    (3, {"b": {"L40S-24Q": 3}, "a": {"L40S-8Q": 1}}, PASS, "allocatable 3, node facts 3 vGPU(s), profile labels 3"),
])
def test_accounting_leaves_out_what_the_dra_driver_publishes(allocatable, dra_served, status, reason):
    res = checks.discover_resources(cr(pci=[L40S_ENTRY]), [node("a", {PREFIX + "L40S-24Q": "3"}, {L40S: allocatable})])
    rows = checks.accounting_checks(res, {"a": TWO_L40S}, dra_served)
    assert [(r.subject, r.status, r.reason) for r in rows] == [("a " + L40S, status, reason)]


def test_a_gpu_the_dra_driver_publishes_is_no_physical_gpu_of_the_extended_resource():
    # a node split between the device plugin (GPU 41) and DRA (GPU 42): two VMIs of the resource share one GPU
    res = checks.discover_resources(cr(pci=[L40S_ENTRY]), [node("a", {PREFIX + "L40S-24Q": "1"}, {L40S: 2})])
    split = {"gpus": [{"address": "0000:41:00.0", "vgpus": [{"after": "L40S-24Q"}] * 2},
                      {"address": "0000:42:00.0", "vgpus": [{"after": "L40S-24Q"}] * 2}]}
    plans, dummy = checks.plan_workloads(res, ["L40S-24Q"], {"a": split}, [node("a", {}, {})])
    assert (plans[0]["physical_gpus"], plans[0]["gpus"]) == (2, ["0000:41:00.0", "0000:42:00.0"])
    plans, dummy = checks.plan_workloads(res, ["L40S-24Q"], {"a": split}, [node("a", {}, {})],
                                         {"a": {"0000:42:00.0"}, "b": {"0000:41:00.0"}})
    assert (plans[0]["physical_gpus"], plans[0]["gpus"]) == (1, ["0000:41:00.0"])
