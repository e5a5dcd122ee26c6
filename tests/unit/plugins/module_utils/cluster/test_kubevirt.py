"""KubeVirt CR planning: resourceName-keyed merges, feature gate, CR selection, version gate."""

from __future__ import annotations

import copy
import json

import jsonpatch

import pytest
from hypothesis import given, settings, strategies as st

from ansible_collections.accelops.vgpu.plugins.module_utils.cluster import kubevirt as kv

L40S = kv.pci_entry("nvidia.com/NVIDIA_L40S-24Q", "10de:26b9")
H100 = kv.pci_entry("nvidia.com/NVIDIA_H100-40C", "10DE:2331")
T4_MDEV = kv.mdev_entry("nvidia.com/GRID_T4-1Q", "GRID T4-1Q", external_resource_provider=True)
FOREIGN_NIC = {"pciVendorSelector": "8086:1572", "resourceName": "intel.com/x710", "team": "net"}
FOREIGN_T4 = {"pciVendorSelector": "10DE:1EB8", "resourceName": "nvidia.com/TU104GL_Tesla_T4"}


def make_cr(pci=None, mdev=None, gates=None, rv="7", version="v1.9.0", owned=None):
    configuration = {"permittedHostDevices": {}, "developerConfiguration": {"featureGates": gates or []},
                     "evictionStrategy": "LiveMigrate"}
    if pci is not None:
        configuration["permittedHostDevices"]["pciHostDevices"] = pci
    if mdev is not None:
        configuration["permittedHostDevices"]["mediatedDevices"] = mdev
    cr = {"apiVersion": "kubevirt.io/v1", "kind": "KubeVirt",
          "metadata": {"name": "kubevirt", "namespace": "kubevirt", "resourceVersion": rv},
          "spec": {"configuration": configuration}, "status": {"observedKubeVirtVersion": version}}
    if owned is not None:
        cr["metadata"]["annotations"] = {kv.OWNED_ANNOTATION: owned_text(**owned)}
    return cr


def owned_text(pci=(), mdev=()):
    return json.dumps({"mediatedDevices": sorted(mdev), "pciHostDevices": sorted(pci)}, separators=(",", ":"),
                      sort_keys=True)


def apply_patch(cr, patch):
    """What the API server does with our merge patch (dicts merge, lists replace)."""
    def merge(target, change):
        for key, value in change.items():
            if isinstance(value, dict) and isinstance(target.get(key), dict):
                merge(target[key], value)
            else:
                target[key] = copy.deepcopy(value)
    out = copy.deepcopy(cr)
    merge(out, patch or {})
    return out


def test_adds_ours_after_foreign_entries_and_the_feature_gate():
    cr = make_cr(pci=[FOREIGN_NIC], gates=["LiveMigration"])
    plan = kv.plan_host_devices(cr, pci=[L40S])
    assert plan.patch["metadata"] == {"resourceVersion": "7", "annotations": {
        kv.OWNED_ANNOTATION: owned_text(pci=[L40S["resourceName"]])}}
    conf = plan.patch["spec"]["configuration"]
    assert conf["permittedHostDevices"] == {"pciHostDevices": [FOREIGN_NIC, {
        "resourceName": "nvidia.com/NVIDIA_L40S-24Q", "pciVendorSelector": "10DE:26B9"}]}
    assert conf["developerConfiguration"]["featureGates"] == ["LiveMigration", "HostDevices"]
    assert plan.changes == ["pciHostDevices: add nvidia.com/NVIDIA_L40S-24Q", "featureGates: add HostDevices"]


def test_second_run_on_the_patched_cr_plans_nothing():
    cr = make_cr(pci=[FOREIGN_NIC], mdev=[{"mdevNameSelector": "X", "resourceName": "other/x"}])
    first = kv.plan_host_devices(cr, pci=[L40S], mdev=[T4_MDEV])
    second = kv.plan_host_devices(apply_patch(cr, first.patch), pci=[L40S], mdev=[T4_MDEV])
    assert first.changed and not second.changed
    assert second.patch is None and second.changes == []


def test_updates_ours_in_place_keeping_unknown_keys_and_order():
    old = {"pciVendorSelector": "10DE:26B5", "resourceName": L40S["resourceName"],
           "externalResourceProvider": True, "futureField": 1}
    cr = make_cr(pci=[FOREIGN_T4, old, FOREIGN_NIC], gates=["HostDevices"])
    plan = kv.plan_host_devices(cr, pci=[L40S])
    new = plan.patch["spec"]["configuration"]["permittedHostDevices"]["pciHostDevices"]
    assert new == [FOREIGN_T4, {"pciVendorSelector": "10DE:26B9", "resourceName": L40S["resourceName"],
                                "futureField": 1}, FOREIGN_NIC]
    assert plan.changes == ["pciHostDevices: update nvidia.com/NVIDIA_L40S-24Q"]
    assert "developerConfiguration" not in plan.patch["spec"]["configuration"]


def test_explicit_false_external_provider_counts_as_unchanged():
    existing = dict(L40S, externalResourceProvider=False)
    plan = kv.plan_host_devices(make_cr(pci=[existing], gates=["HostDevices"], owned={"pci": [L40S["resourceName"]]}),
                                pci=[L40S])
    assert not plan.changed


def test_an_entry_that_already_matches_is_claimed_in_a_metadata_only_write():
    plan = kv.plan_host_devices(make_cr(pci=[L40S], gates=["HostDevices"]), pci=[L40S])
    assert plan.patch == {"metadata": {"resourceVersion": "7", "annotations": {
        kv.OWNED_ANNOTATION: owned_text(pci=[L40S["resourceName"]])}}}
    assert plan.changes == ["annotation %s: %s" % (kv.OWNED_ANNOTATION, owned_text(pci=[L40S["resourceName"]]))]


L40S_12Q = kv.pci_entry("nvidia.com/NVIDIA_L40S-12Q", "10DE:26B9")
A16_MDEV_OLD = kv.mdev_entry("nvidia.com/NVIDIA_A16-4Q", "NVIDIA A16-4Q", external_resource_provider=True)
A16_MDEV_NEW = kv.mdev_entry("nvidia.com/NVIDIA_A16-8Q", "NVIDIA A16-8Q", external_resource_provider=True)


def test_our_own_earlier_profile_is_replaced_without_take_over_and_stale_mdevs_go():
    """24Q -> 12Q on the fleet (same PCI ID): the 24Q entry the collection wrote is replaced; with
    prune_owned the A16-4Q mdev type of the earlier profile goes too; foreign entries stay."""
    cr = make_cr(pci=[FOREIGN_NIC, L40S], mdev=[A16_MDEV_OLD], gates=["HostDevices"],
                 owned={"pci": [L40S["resourceName"]], "mdev": [A16_MDEV_OLD["resourceName"]]})
    plan = kv.plan_host_devices(cr, pci=[L40S_12Q], mdev=[A16_MDEV_NEW], prune_owned=True)
    after = apply_patch(cr, plan.patch)
    permitted = after["spec"]["configuration"]["permittedHostDevices"]
    assert permitted == {"pciHostDevices": [FOREIGN_NIC, L40S_12Q], "mediatedDevices": [A16_MDEV_NEW]}
    assert plan.changes == [
        "pciHostDevices: remove nvidia.com/NVIDIA_L40S-24Q (ours from an earlier run, replaced by "
        "nvidia.com/NVIDIA_L40S-12Q)", "pciHostDevices: add nvidia.com/NVIDIA_L40S-12Q",
        "mediatedDevices: remove nvidia.com/NVIDIA_A16-4Q (ours from an earlier run, no longer wanted)",
        "mediatedDevices: add nvidia.com/NVIDIA_A16-8Q"]
    assert kv.owned_names(after) == {kv.PCI: {L40S_12Q["resourceName"]}, kv.MDEV: {A16_MDEV_NEW["resourceName"]}}
    assert not kv.plan_host_devices(after, pci=[L40S_12Q], mdev=[A16_MDEV_NEW], prune_owned=True).changed


def test_without_prune_an_earlier_own_entry_without_a_successor_stays():
    cr = make_cr(mdev=[A16_MDEV_OLD], gates=["HostDevices"], owned={"mdev": [A16_MDEV_OLD["resourceName"]]})
    plan = kv.plan_host_devices(cr, mdev=[A16_MDEV_NEW])
    permitted = apply_patch(cr, plan.patch)["spec"]["configuration"]["permittedHostDevices"]
    assert permitted["mediatedDevices"] == [A16_MDEV_OLD, A16_MDEV_NEW]


def test_a_foreign_entry_with_our_selector_still_needs_take_over_and_nothing_is_claimed():
    foreign = kv.pci_entry("team/l40s", "10DE:26B9")
    cr = make_cr(pci=[foreign], gates=["HostDevices"], owned={"pci": ["nvidia.com/NVIDIA_L40S-24Q"]})
    with pytest.raises(kv.KubeVirtError, match="list team/l40s in take_over"):
        kv.plan_host_devices(cr, pci=[L40S_12Q], prune_owned=True)
    # and prune never removes what the annotation does not list
    plan = kv.plan_host_devices(cr, pci=[H100], prune_owned=True)
    assert foreign in apply_patch(cr, plan.patch)["spec"]["configuration"]["permittedHostDevices"]["pciHostDevices"]


def test_absent_drops_our_names_from_the_annotation():
    cr = make_cr(pci=[L40S, FOREIGN_NIC], gates=["HostDevices"], owned={"pci": [L40S["resourceName"]]})
    plan = kv.plan_host_devices(cr, pci=[L40S], state="absent")
    after = apply_patch(cr, plan.patch)
    assert after["spec"]["configuration"]["permittedHostDevices"]["pciHostDevices"] == [FOREIGN_NIC]
    assert kv.owned_names(after) == {kv.PCI: set(), kv.MDEV: set()}


def test_absent_removes_only_ours_and_keeps_the_gate():
    cr = make_cr(pci=[FOREIGN_NIC, L40S, FOREIGN_T4], mdev=[T4_MDEV], gates=["HostDevices"])
    plan = kv.plan_host_devices(cr, pci=[{"resourceName": L40S["resourceName"]}],
                                mdev=[{"resourceName": T4_MDEV["resourceName"]}], state="absent")
    permitted = plan.patch["spec"]["configuration"]["permittedHostDevices"]
    assert permitted == {"pciHostDevices": [FOREIGN_NIC, FOREIGN_T4], "mediatedDevices": []}
    assert plan.after["featureGates"] == ["HostDevices"]


def test_exclusive_vendor_removes_other_nvidia_entries_only():
    cr = make_cr(pci=[FOREIGN_T4, FOREIGN_NIC, H100], gates=["HostDevices"])
    plan = kv.plan_host_devices(cr, pci=[L40S, H100], exclusive_pci_vendors=["10de"])
    new = plan.after["permittedHostDevices"]["pciHostDevices"]
    assert new == [FOREIGN_NIC, H100, L40S]
    assert "pciHostDevices: remove nvidia.com/TU104GL_Tesla_T4 (not ours, exclusive vendor 10DE)" in plan.changes


def test_exclusive_mdev_prefix():
    foreign = {"mdevNameSelector": "GRID A10-4Q", "resourceName": "nvidia.com/GRID_A10-4Q"}
    keep = {"mdevNameSelector": "i915-GVTg_V5_4", "resourceName": "intel.com/gvt"}
    plan = kv.plan_host_devices(make_cr(mdev=[foreign, keep]), mdev=[T4_MDEV], exclusive_mdev_prefixes=["GRID "])
    assert plan.after["permittedHostDevices"]["mediatedDevices"] == [keep, T4_MDEV]


HAND_WRITTEN = {"pciVendorSelector": "10de:26B9", "resourceName": "nvidia.com/L40S-24Q"}


@pytest.mark.parametrize("foreign", [HAND_WRITTEN, dict(HAND_WRITTEN, externalResourceProvider=True),
                                     dict(HAND_WRITTEN, pciVendorSelector=" 10DE:26b9")])
def test_a_foreign_entry_for_our_devices_fails_naming_both(foreign):
    cr = make_cr(pci=[FOREIGN_NIC, foreign])
    with pytest.raises(kv.KubeVirtError) as err:
        kv.plan_host_devices(cr, pci=[L40S])
    assert str(err.value) == (
        "KubeVirt kubevirt/kubevirt pciHostDevices: pciVendorSelector 10DE:26B9 is permitted as nvidia.com/L40S-24Q "
        "and would also be as nvidia.com/NVIDIA_L40S-24Q (two device plugins advertising the same devices); "
        "list nvidia.com/L40S-24Q in take_over to replace it")


def test_a_foreign_mdev_entry_with_our_name_selector_fails():
    cr = make_cr(mdev=[{"mdevNameSelector": "GRID T4-1Q", "resourceName": "nvidia.com/t4-small"}])
    with pytest.raises(kv.KubeVirtError, match=r"mediatedDevices: mdevNameSelector GRID T4-1Q is permitted as "
                                               r"nvidia.com/t4-small and would also be as nvidia.com/GRID_T4-1Q"):
        kv.plan_host_devices(cr, mdev=[T4_MDEV])


def test_take_over_replaces_the_foreign_entry_in_place_of_order():
    cr = make_cr(pci=[HAND_WRITTEN, FOREIGN_NIC])
    plan = kv.plan_host_devices(cr, pci=[L40S], take_over=["nvidia.com/L40S-24Q"])
    assert plan.changes == ["pciHostDevices: remove nvidia.com/L40S-24Q (taken over by nvidia.com/NVIDIA_L40S-24Q)",
                            "pciHostDevices: add nvidia.com/NVIDIA_L40S-24Q", "featureGates: add HostDevices"]
    assert plan.before["permittedHostDevices"]["pciHostDevices"] == [HAND_WRITTEN, FOREIGN_NIC]
    assert plan.after["permittedHostDevices"]["pciHostDevices"] == [FOREIGN_NIC, L40S]
    again = kv.plan_host_devices(apply_patch(cr, plan.patch), pci=[L40S], take_over=["nvidia.com/L40S-24Q"])
    assert not again.changed


def test_take_over_never_removes_an_entry_for_other_devices():
    cr = make_cr(pci=[FOREIGN_T4])
    plan = kv.plan_host_devices(cr, pci=[L40S], take_over=[FOREIGN_T4["resourceName"]])
    assert plan.after["permittedHostDevices"]["pciHostDevices"] == [FOREIGN_T4, L40S]


def test_exclusive_vendor_and_absent_need_no_take_over():
    cr = make_cr(pci=[HAND_WRITTEN])
    assert kv.plan_host_devices(cr, pci=[L40S], exclusive_pci_vendors=["10DE"]).after[
        "permittedHostDevices"]["pciHostDevices"] == [L40S]
    assert not kv.plan_host_devices(cr, pci=[L40S], state="absent").changed


def test_two_of_ours_for_one_selector_fail():
    with pytest.raises(kv.KubeVirtError, match="pciHostDevices: pciVendorSelector 10DE:26B9 is listed for both "
                                               "nvidia.com/NVIDIA_L40S-24Q and nvidia.com/NVIDIA_L40S"):
        kv.plan_host_devices(make_cr(), pci=[L40S, kv.pci_entry("nvidia.com/NVIDIA_L40S", "10DE:26B9")])


def test_missing_configuration_is_created():
    cr = {"metadata": {"name": "kubevirt", "namespace": "kubevirt", "resourceVersion": "1"}, "spec": {}}
    plan = kv.plan_host_devices(cr, pci=[L40S], feature_gate=False)
    assert plan.patch["spec"] == {"configuration": {"permittedHostDevices": {"pciHostDevices": [L40S]}}}


@pytest.mark.parametrize("pci, message", [
    ([{"resourceName": "nvidia.com/x"}], "pciHostDevices nvidia.com/x: pciVendorSelector is required"),
    ([kv.pci_entry("nvidia.com/x", "10de-26b9")], "pciVendorSelector '10DE-26B9' is not VVVV:DDDD"),
    ([L40S, dict(L40S, pciVendorSelector="10DE:26B5")], "NVIDIA_L40S-24Q: listed twice with different fields"),
    ([{"pciVendorSelector": "10DE:26B9"}], "resourceName is required"),
])
def test_bad_desired_entries_fail_with_one_line(pci, message):
    with pytest.raises(kv.KubeVirtError, match=message.replace("(", r"\(")):
        kv.plan_host_devices(make_cr(), pci=pci)


def test_select_kubevirt_any_namespace_and_pinning():
    one = make_cr()
    other = copy.deepcopy(one)
    other["metadata"].update(name="kv2", namespace="virt")
    assert kv.select_kubevirt([one]) is one
    assert kv.select_kubevirt([one, other], namespace="virt") is other
    with pytest.raises(kv.KubeVirtError, match=r"^KubeVirt \*/\*: 2 KubeVirt CRs found \(kubevirt/kubevirt, virt/kv2\)"):
        kv.select_kubevirt([one, other])
    with pytest.raises(kv.KubeVirtError, match="no KubeVirt CR found"):
        kv.select_kubevirt([one], name="nope")


@pytest.mark.parametrize("version, ok", [("v1.9.0", True), ("v1.10.2", True), ("1.9.0-rc.1", True),
                                         ("v1.8.2", False), ("v1.6.5", False), (None, False)])
def test_vendor_vfio_version_gate(version, ok):
    cr = make_cr(version=version)
    if ok:
        assert kv.check_vendor_vfio_version(cr) == version
    else:
        with pytest.raises(kv.KubeVirtError, match="KubeVirt kubevirt/kubevirt: .*needs KubeVirt >= 1.9.0"):
            kv.check_vendor_vfio_version(cr)


def test_operator_version_is_the_fallback():
    cr = make_cr(version=None)
    cr["status"] = {"operatorVersion": "v1.9.1"}
    assert kv.check_vendor_vfio_version(cr, minimum="1.9.1") == "v1.9.1"


# --- property: foreign entries are never lost, duplicated or reordered -------------------------

NAMES = st.sampled_from(["nvidia.com/a", "nvidia.com/b", "nvidia.com/c", "intel.com/d", "amd.com/e", "x/f"])
VENDORS = st.sampled_from(["10DE", "8086", "1002"])
PCI_ENTRIES = st.builds(lambda name, vendor, dev, erp: dict(kv.pci_entry(name, "%s:%04X" % (vendor, dev), erp)),
                        NAMES, VENDORS, st.integers(0, 0xFFFF), st.booleans())


def claimed_by_vendor(entry, exclusive):
    """The oracle of `exclusive_pci_vendors`, independent of the code under test: the entry's
    selector is VENDOR:DEVICE and VENDOR (any case) is one the caller claims exclusively."""
    return entry["pciVendorSelector"].split(":")[0].upper() in {vendor.upper() for vendor in exclusive}


def conflicting(current, desired, state, exclusive):
    """Whether a foreign entry (not exclusive-removed) shares a selector with one of ours."""
    names = {e["resourceName"] for e in desired}
    ours = {e["pciVendorSelector"].upper() for e in desired}
    return state == "present" and (len(ours) < len(desired) or any(
        e["resourceName"] not in names and e["pciVendorSelector"].upper() in ours
        and not claimed_by_vendor(e, exclusive) for e in current))


def foreign_of(entries, ours, exclusive):
    ours_names = {e["resourceName"] for e in ours}
    return [e for e in entries if e["resourceName"] not in ours_names and not claimed_by_vendor(e, exclusive)]


@settings(max_examples=60, deadline=None)
@given(current=st.lists(PCI_ENTRIES, max_size=8), desired=st.lists(PCI_ENTRIES, max_size=4, unique_by=lambda e: e["resourceName"]),
       state=st.sampled_from(["present", "absent"]), exclusive=st.sampled_from([(), ("10DE",)]))
def test_merge_never_loses_duplicates_or_reorders_foreign_entries(current, desired, state, exclusive):
    cr = make_cr(pci=current)
    snapshot = copy.deepcopy(cr)
    if conflicting(current, desired, state, exclusive):  # one device, one owner: refused, nothing planned
        with pytest.raises(kv.KubeVirtError, match="is permitted as|is listed for both"):
            kv.plan_host_devices(cr, pci=desired, state=state, exclusive_pci_vendors=exclusive)
        return
    plan = kv.plan_host_devices(cr, pci=desired, state=state, exclusive_pci_vendors=exclusive)
    assert cr == snapshot  # pure: the input is not modified
    after = apply_patch(cr, plan.patch)
    new = kv.managed_view(after)["permittedHostDevices"]["pciHostDevices"]
    assert foreign_of(new, desired, exclusive) == foreign_of(current, desired, exclusive)
    names_of_ours = {d["resourceName"] for d in desired}
    assert [e for e in new if claimed_by_vendor(e, exclusive) and e["resourceName"] not in names_of_ours] == []
    names = [e["resourceName"] for e in new if e["resourceName"] in {d["resourceName"] for d in desired}]
    if state == "present":
        assert sorted(names) == sorted(d["resourceName"] for d in desired) and len(names) == len(set(names))
    else:
        assert names == []
    assert after["spec"]["configuration"]["evictionStrategy"] == "LiveMigrate"
    again = kv.plan_host_devices(after, pci=desired, state=state, exclusive_pci_vendors=exclusive)
    assert not again.changed, again.changes


# --- cluster entries from the nodes' vgpu_profile results --------------------------------------

def res(profile, pci_id="10DE:26B9", count=2, framework="vendor-vfio"):
    out = {"profile": profile, "type_name": "NVIDIA " + profile, "pci_vendor_selector": pci_id, "count": count,
           "resource_name": "nvidia.com/NVIDIA_" + profile, "framework": framework}
    if framework == "mdev":
        out["mdev_name_selector"] = "NVIDIA " + profile
    return out


def test_cluster_plan_dedupes_entries_and_sums_node_profiles():
    plan = kv.plan_cluster_resources([
        {"name": "gpu-a", "resources": [res("L40S-24Q"), res("H100-40C", "10de:2331", 1)]},
        {"name": "gpu-b", "resources": [res("L40S-24Q", count=2)]},
        {"name": "gpu-c", "resources": [res("A10-4Q", "10DE:2236", 6, "mdev"), res("A10-8Q", "10DE:2236", 3, "mdev")]},
    ])
    assert plan["errors"] == []
    assert plan["pci_host_devices"] == [
        {"pci_vendor_selector": "10DE:26B9", "resource_name": "nvidia.com/NVIDIA_L40S-24Q", "vendor_vfio": True},
        {"pci_vendor_selector": "10DE:2331", "resource_name": "nvidia.com/NVIDIA_H100-40C", "vendor_vfio": True}]
    assert [m["mdev_name_selector"] for m in plan["mediated_devices"]] == ["NVIDIA A10-4Q", "NVIDIA A10-8Q"]
    assert plan["nodes"][0] == {"name": "gpu-a", "profiles": {"L40S-24Q": 2, "H100-40C": 1}, "vendor_vfio": True}
    assert plan["nodes"][2]["vendor_vfio"] is False


def test_two_profiles_on_one_model_of_a_node_is_an_error_naming_everything():
    plan = kv.plan_cluster_resources([{"name": "gpu-a", "resources": [res("L40S-24Q", count=1), res("L40S-48Q", count=1)]}],
                                     naming="model")
    assert plan["errors"] == ["node gpu-a: GPU model 10DE:26B9 carries 2 profiles (L40S-24Q, L40S-48Q); KubeVirt "
                              "cannot tell vGPU profiles of one PCI ID apart: use one profile per GPU model on a node"]


def test_different_profiles_per_node_need_model_naming():
    nodes = [{"name": "gpu-a", "resources": [res("L40S-24Q")]}, {"name": "gpu-b", "resources": [res("L40S-48Q", count=1)]}]
    by_profile = kv.plan_cluster_resources(nodes)
    assert by_profile["errors"] == ["GPU model 10DE:26B9 has several profiles across nodes (gpu-a: L40S-24Q, gpu-b: "
                                    "L40S-48Q); KubeVirt permits one resource per PCI ID: use one profile per model "
                                    "cluster-wide or resource naming 'model'"]
    by_model = kv.plan_cluster_resources(nodes, naming="model")
    assert by_model["errors"] == []
    assert by_model["pci_host_devices"] == [{"pci_vendor_selector": "10DE:26B9", "resource_name": "nvidia.com/NVIDIA_L40S",
                                             "vendor_vfio": True}]


def test_host_without_results_is_an_error():
    assert kv.plan_cluster_resources([{"name": "gpu-z", "resources": None}])["errors"] == [
        "node gpu-z: no vgpu_profiles_resources (run the vgpu_profiles role on it first)"]


@pytest.mark.parametrize("type_name, resource", [("NVIDIA L40S-24Q", "nvidia.com/NVIDIA_L40S"),
                                                 ("NVIDIA H100-1-10C", "nvidia.com/NVIDIA_H100"),
                                                 ("NVIDIA RTX PRO 6000 Blackwell DC-48Q",
                                                  "nvidia.com/NVIDIA_RTX_PRO_6000_Blackwell_DC")])
def test_model_resource_name(type_name, resource):
    assert kv.model_resource_name(type_name) == resource


def test_virt_handler_image_is_a_json_patch_on_that_one_env_entry():
    """Only the entry the collection sets travels: fields the client's model does not know (here
    `resizePolicy`-like `futureField`) are never read into a model nor sent back."""
    deployment = {"metadata": {"name": "virt-operator", "namespace": "kubevirt", "resourceVersion": "4"},
                  "spec": {"template": {"spec": {"containers": [
                      {"name": "other"},
                      {"name": "virt-operator", "futureField": {"x": 1}, "env": [
                          {"name": "X", "value": "1"}, {"name": "VIRT_HANDLER_IMAGE", "value": "old"}]}]}}}}
    base = "/spec/template/spec/containers/1"
    plan = kv.plan_virt_handler_image(deployment, "new")
    assert plan.patch == [{"op": "test", "path": base + "/name", "value": "virt-operator"},
                          {"op": "test", "path": base + "/env/1/name", "value": "VIRT_HANDLER_IMAGE"},
                          {"op": "replace", "path": base + "/env/1/value", "value": "new"}]
    assert jsonpatch.apply_patch(deployment, plan.patch)["spec"]["template"]["spec"]["containers"][1] == {
        "name": "virt-operator", "futureField": {"x": 1},
        "env": [{"name": "X", "value": "1"}, {"name": "VIRT_HANDLER_IMAGE", "value": "new"}]}
    assert (plan.before, plan.after) == ({"virtHandlerImage": "old"}, {"virtHandlerImage": "new"})
    assert kv.plan_virt_handler_image(deployment, "").patch[-1] == {"op": "remove", "path": base + "/env/1"}
    assert not kv.plan_virt_handler_image(deployment, "old").changed
    with pytest.raises(kv.KubeVirtError, match="Deployment kubevirt/virt-operator: no container 'virt-op'"):
        kv.plan_virt_handler_image(deployment, "new", container="virt-op")


@pytest.mark.parametrize("env, op", [
    (None, {"op": "add", "path": "/spec/template/spec/containers/0/env",
            "value": [{"name": "VIRT_HANDLER_IMAGE", "value": "new"}]}),
    ([{"name": "X", "value": "1"}], {"op": "add", "path": "/spec/template/spec/containers/0/env/-",
                                     "value": {"name": "VIRT_HANDLER_IMAGE", "value": "new"}}),
])
def test_virt_handler_image_added_where_there_is_none(env, op):
    container = {"name": "virt-operator"}
    if env is not None:
        container["env"] = env
    deployment = {"metadata": {"name": "virt-operator", "namespace": "kubevirt"},
                  "spec": {"template": {"spec": {"containers": [container]}}}}
    assert kv.plan_virt_handler_image(deployment, "new").patch[-1] == op


def test_mig_backed_profiles_follow_the_one_profile_per_pci_id_rule():
    """MIG-backed VFs keep the PF's PCI ID (docs/design.md, MIG-backed vGPU): one profile per model still."""
    one = kv.plan_cluster_resources([{"name": "h100-a", "resources": [res("H100-1-20C", "10DE:2331", 4)]}])
    assert one["errors"] == [] and one["pci_host_devices"] == [
        {"pci_vendor_selector": "10DE:2331", "resource_name": "nvidia.com/NVIDIA_H100-1-20C", "vendor_vfio": True}]
    two_sizes = kv.plan_cluster_resources([{"name": "h100-a", "resources": [
        res("H100-3-40C", "10DE:2331", 1), res("H100-2-20C", "10DE:2331", 1)]}])
    assert two_sizes["errors"][0].startswith("node h100-a: GPU model 10DE:2331 carries 2 profiles (H100-2-20C, H100-3-40C)")
    mixed_nodes = [{"name": "h100-a", "resources": [res("H100-1-20C", "10DE:2331", 4)]},
                   {"name": "h100-b", "resources": [res("H100-20C", "10DE:2331", 4)]}]
    assert kv.plan_cluster_resources(mixed_nodes)["errors"][0].startswith("GPU model 10DE:2331 has several profiles")
    by_model = kv.plan_cluster_resources(mixed_nodes, naming="model")
    assert by_model["errors"] == [] and [e["resource_name"] for e in by_model["pci_host_devices"]] == [
        "nvidia.com/NVIDIA_H100"]
    assert kv.model_resource_name("NVIDIA H100-1-10CME") == "nvidia.com/NVIDIA_H100"
