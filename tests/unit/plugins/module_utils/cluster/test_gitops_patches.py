"""The KubeVirt and ClusterPolicy patches computed from layouts alone, and the layouts they refuse."""

from __future__ import annotations

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.cluster import gitops_patches


def document(**configs):
    return {"version": "v1", "vgpu-configs": configs}


L40S_24Q = [{"devices": "all", "device-filter": "0x26B910DE", "vgpu-devices": {"L40S-24Q": 2}}]
L40S_8Q = [{"devices": "all", "device-filter": ["0x26B910DE"], "vgpu-devices": {"L40S-8Q": 6}}]
H100 = [{"devices": "all", "device-filter": "0x233110DE", "vgpu-devices": {"H100-20C": 4}}]


def test_one_resource_per_gpu_model_appended_with_the_feature_gate():
    ops = gitops_patches.kubevirt_patch(document(a=L40S_24Q, b=L40S_8Q, c=H100))
    assert ops == [
        {"op": "add", "path": "/spec/configuration/permittedHostDevices/pciHostDevices/-",
         "value": {"resourceName": "nvidia.com/NVIDIA_H100", "pciVendorSelector": "10DE:2331"}},
        {"op": "add", "path": "/spec/configuration/permittedHostDevices/pciHostDevices/-",
         "value": {"resourceName": "nvidia.com/NVIDIA_L40S", "pciVendorSelector": "10DE:26B9"}},
        {"op": "add", "path": "/spec/configuration/developerConfiguration/featureGates/-", "value": "HostDevices"}]


def test_per_profile_naming_takes_one_profile_per_gpu_model():
    ops = gitops_patches.kubevirt_patch(document(a=L40S_24Q), naming="profile", feature_gate=False)
    assert [op["value"] for op in ops] == [{"resourceName": "nvidia.com/NVIDIA_L40S-24Q",
                                            "pciVendorSelector": "10DE:26B9"}]
    with pytest.raises(gitops_patches.GitopsPatchError, match="GPU model 10DE:26B9 has several profiles"):
        gitops_patches.kubevirt_patch(document(a=L40S_24Q, b=L40S_8Q), naming="profile")


@pytest.mark.parametrize("entries, message", [
    ([{"devices": "all", "vgpu-devices": {"L40S-24Q": 2}}],
     "layout x entry 1 has no device-filter: the GPU model (PCI ID) cannot be told from the layout"),
    ([{"devices": "all", "device-filter": "0x1EB810DE", "vgpu-devices": {"T4-8Q": 2}}],
     "layout x entry 1: device-filter '0x1EB810DE' is an mdev GPU; its mediatedDevices entry needs the driver's "
     "mdev type name"),
    ([{"devices": "all", "device-filter": "0x123410DE", "vgpu-devices": {"X-8Q": 2}}],
     "layout x entry 1: device-filter '0x123410DE' is a GPU model this collection does not know"),
    ([{"devices": "all", "device-filter": "0x26B98086", "vgpu-devices": {"L40S-8Q": 2}}],
     "layout x entry 1: device-filter '0x26B98086' is not an NVIDIA GPU"),
    ([{"devices": "all", "device-filter": "26B9", "vgpu-devices": {"L40S-8Q": 2}}],
     "layout x entry 1: device-filter '26B9' is not a PCI ID 0x<device><vendor>"),
])
def test_layouts_the_patches_cannot_come_from_fail_naming_them(entries, message):
    with pytest.raises(gitops_patches.GitopsPatchError) as caught:
        gitops_patches.kubevirt_patch(document(x=entries))
    assert str(caught.value).startswith(message)


def test_the_cluster_policy_patch_turns_only_the_vgpu_device_manager_off():
    assert gitops_patches.cluster_policy_patch()["spec"] == {"vgpuDeviceManager": {"enabled": False}}
