"""provider agent: the node agent's device plugin serves every profile, KubeVirt only permits them
(externalResourceProvider: true), so one GPU model may carry several profiles across and within nodes."""

from __future__ import annotations

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.cluster import kubevirt as kv
from ansible_collections.accelops.vgpu.tests.unit.plugins.module_utils.cluster.test_kubevirt import apply_patch


def res(profile, selector="10DE:26B9", count=2, framework="vendor-vfio"):
    out = {"profile": profile, "type_name": "NVIDIA " + profile, "count": count, "pci_vendor_selector": selector,
           "resource_name": "nvidia.com/NVIDIA_" + profile, "framework": framework}
    if framework == "mdev":
        out["mdev_name_selector"] = "NVIDIA " + profile
    return out


def cr(pci, version="v1.6.5"):
    return {"apiVersion": "kubevirt.io/v1", "kind": "KubeVirt",
            "metadata": {"name": "kubevirt", "namespace": "kubevirt", "resourceVersion": "3"},
            "spec": {"configuration": {"permittedHostDevices": {"pciHostDevices": pci}}},
            "status": {"observedKubeVirtVersion": version}}


MIXED = [{"name": "gpu-a", "resources": [res("L40S-24Q", count=2), res("L40S-12Q", count=4)]},
         {"name": "gpu-b", "resources": [res("L40S-48Q", count=1)]}]


def test_a_mixed_profile_fleet_on_one_model_gets_one_external_entry_per_profile():
    kubevirt = kv.plan_cluster_resources(MIXED)
    assert len(kubevirt["errors"]) == 2     # today's provider refuses it (per node and cluster-wide)
    agent = kv.plan_cluster_resources(MIXED, provider="agent",
                                      extra_profiles=[res("L40S-8Q"), res("L40S-24Q")])
    assert agent["errors"] == []
    assert agent["pci_host_devices"] == [
        {"pci_vendor_selector": "10DE:26B9", "resource_name": "nvidia.com/NVIDIA_L40S-" + p, "vendor_vfio": True,
         "external_resource_provider": True} for p in ("24Q", "12Q", "48Q", "8Q")]
    assert agent["nodes"] == [{"name": "gpu-a", "profiles": {"L40S-24Q": 2, "L40S-12Q": 4}, "vendor_vfio": True},
                              {"name": "gpu-b", "profiles": {"L40S-48Q": 1}, "vendor_vfio": True}]


def test_the_agent_names_resources_per_profile_only():
    plan = kv.plan_cluster_resources(MIXED, naming="model", provider="agent")
    assert plan["errors"] == ["provider agent serves one resource per profile: resource naming must be profile, "
                              "not 'model'"]
    assert kv.plan_cluster_resources(MIXED, provider="vendor")["errors"] == [
        "provider must be one of kubevirt, agent, not 'vendor'"]


def test_mdev_profiles_are_external_too():
    plan = kv.plan_cluster_resources([{"name": "t", "resources": [res("T4-4Q", "10DE:1EB8", 4, "mdev")]}],
                                     mdev_external_provider=False, provider="agent")
    assert plan["mediated_devices"] == [{"mdev_name_selector": "NVIDIA T4-4Q", "resource_name": "nvidia.com/NVIDIA_T4-4Q",
                                         "external_resource_provider": True}]


def entries(names):
    return [kv.pci_entry("nvidia.com/NVIDIA_L40S-" + n, "10DE:26B9", external_resource_provider=True) for n in names]


def test_external_entries_share_a_selector_and_switching_updates_ours_in_place():
    today = [kv.pci_entry("nvidia.com/NVIDIA_L40S-24Q", "10DE:26B9"),
             {"pciVendorSelector": "8086:1572", "resourceName": "intel.com/x710"}]
    plan = kv.plan_host_devices(cr(today), entries(["24Q", "12Q"]))
    assert plan.changes == ["pciHostDevices: update nvidia.com/NVIDIA_L40S-24Q",
                            "pciHostDevices: add nvidia.com/NVIDIA_L40S-12Q", "featureGates: add HostDevices"]
    assert plan.after["permittedHostDevices"]["pciHostDevices"] == [
        entries(["24Q"])[0], today[1], entries(["12Q"])[0]]


def test_a_foreign_entry_kubevirt_would_serve_for_the_same_vfs_still_fails():
    foreign = {"pciVendorSelector": "10DE:26B9", "resourceName": "nvidia.com/L40S"}
    with pytest.raises(kv.KubeVirtError, match="two device plugins advertising the same devices"):
        kv.plan_host_devices(cr([foreign]), entries(["24Q"]))
    other_external = dict(foreign, externalResourceProvider=True)  # someone's own plugin: KubeVirt serves nothing
    plan = kv.plan_host_devices(cr([other_external]), entries(["24Q"]))
    assert plan.after["permittedHostDevices"]["pciHostDevices"] == [other_external] + entries(["24Q"])


@pytest.mark.parametrize("version, ok", [("v1.6.5", True), ("v1.0.0", True), ("v0.59.0", False), (None, False)])
def test_the_agent_path_needs_no_kubevirt_1_9(version, ok):
    if ok:
        assert kv.check_external_pci_version(cr([], version)) == version
    else:
        with pytest.raises(kv.KubeVirtError, match=r"^KubeVirt kubevirt/kubevirt: KubeVirt .*need KubeVirt >= 1.0.0"):
            kv.check_external_pci_version(cr([], version))


class Api:
    def __init__(self, current):
        self.current, self.patches = current, []

    def list_custom(self, *dummy):
        return [self.current]

    def patch_custom(self, *args, **kwargs):
        self.patches.append((args, kwargs))


def test_the_module_checks_the_agent_paths_version_and_shows_the_switch_in_check_mode():
    api = Api(cr([kv.pci_entry("nvidia.com/NVIDIA_L40S-24Q", "10DE:26B9")], version="v1.6.5"))
    params = {"pci_host_devices": [{"resource_name": "nvidia.com/NVIDIA_L40S-24Q", "pci_vendor_selector": "10DE:26B9",
                                    "external_resource_provider": True}], "dry_run": "client"}
    result = kv.run_hostdevices(api, params, check_mode=True)
    assert result["changed"] and result["changes"][0] == "pciHostDevices: update nvidia.com/NVIDIA_L40S-24Q"
    assert result["diff"]["after"]["permittedHostDevices"]["pciHostDevices"][0]["externalResourceProvider"] is True
    assert api.patches == []
    old = Api(cr([], version="v0.58.0"))
    with pytest.raises(kv.KubeVirtError, match="need KubeVirt >= 1.0.0"):
        kv.run_hostdevices(old, params, check_mode=True)
    kubevirt_path = dict(params, pci_host_devices=[dict(params["pci_host_devices"][0], external_resource_provider=False)])
    with pytest.raises(kv.KubeVirtError, match="needs KubeVirt >= 1.9.0"):
        kv.run_hostdevices(Api(cr([], version="v1.6.5")), kubevirt_path, check_mode=True)


def test_switching_back_to_kubevirt_replaces_our_other_external_entries_of_that_model():
    """agent (24Q + 12Q, both ours per the owned annotation) -> kubevirt (24Q only): the 12Q entry would leave a
    second name on the PCI ID KubeVirt now serves; as ours it goes without take_over, a foreign one would fail."""
    first = kv.plan_host_devices(cr([]), entries(["24Q", "12Q"]))
    current = apply_patch(cr([]), first.patch)
    plan = kv.plan_host_devices(current, [kv.pci_entry("nvidia.com/NVIDIA_L40S-24Q", "10DE:26B9")])
    assert plan.changes[:2] == ["pciHostDevices: update nvidia.com/NVIDIA_L40S-24Q",
                                "pciHostDevices: remove nvidia.com/NVIDIA_L40S-12Q (ours from an earlier run, "
                                "replaced by nvidia.com/NVIDIA_L40S-24Q)"]
    assert plan.after["permittedHostDevices"]["pciHostDevices"] == [
        {"pciVendorSelector": "10DE:26B9", "resourceName": "nvidia.com/NVIDIA_L40S-24Q"}]
