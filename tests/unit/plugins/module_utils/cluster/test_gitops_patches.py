"""The KubeVirt and ClusterPolicy patches computed from layouts alone, and the layouts they refuse."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

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


def test_device_filters_are_read_as_the_nodes_read_them():
    """The engine's parser (node/hw/pci.parse_id_filter): VDM's 0x<device><vendor> and lspci's vvvv:dddd alike."""
    lspci = [dict(L40S_24Q[0], **{"device-filter": "10de:26b9"})]
    assert gitops_patches.kubevirt_patch(document(a=lspci)) == gitops_patches.kubevirt_patch(document(a=L40S_24Q))
    with pytest.raises(gitops_patches.GitopsPatchError, match="device-filter 'L40S' is not a PCI ID"):
        gitops_patches.kubevirt_patch(document(a=[dict(L40S_24Q[0], **{"device-filter": "L40S"})]))


def test_per_profile_naming_takes_one_profile_per_gpu_model():
    ops = gitops_patches.kubevirt_patch(document(a=L40S_24Q), naming="profile", feature_gate=False)
    assert [op["value"] for op in ops] == [{"resourceName": "nvidia.com/NVIDIA_L40S-24Q",
                                            "pciVendorSelector": "10DE:26B9"}]
    with pytest.raises(gitops_patches.GitopsPatchError, match="GPU model 10DE:26B9 has several profiles"):
        gitops_patches.kubevirt_patch(document(a=L40S_24Q, b=L40S_8Q), naming="profile")


def test_agent_provider_is_one_external_entry_per_profile_of_one_model():
    """The chart's device plugin serves each profile: 24Q and 8Q of one L40S model side by side (issue 21)."""
    ops = gitops_patches.kubevirt_patch(document(a=L40S_24Q, b=L40S_8Q, c=H100), naming="profile", provider="agent")
    assert [op["value"] for op in ops] == [
        {"resourceName": "nvidia.com/NVIDIA_H100-20C", "pciVendorSelector": "10DE:2331", "externalResourceProvider": True},
        {"resourceName": "nvidia.com/NVIDIA_L40S-24Q", "pciVendorSelector": "10DE:26B9", "externalResourceProvider": True},
        {"resourceName": "nvidia.com/NVIDIA_L40S-8Q", "pciVendorSelector": "10DE:26B9", "externalResourceProvider": True},
        "HostDevices"]
    with pytest.raises(gitops_patches.GitopsPatchError, match="resource naming must be profile"):
        gitops_patches.kubevirt_patch(document(a=L40S_24Q), naming="model", provider="agent")


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


def test_the_tool_writes_the_agent_providers_patch(tmp_path):
    """tools/gitops-patches.py --provider agent: per-profile external entries, naming profile implied."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))))
    layouts = tmp_path / "layouts.json"
    layouts.write_text(json.dumps(document(a=L40S_24Q, b=L40S_8Q)))
    proc = subprocess.run([sys.executable, os.path.join(root, "tools", "gitops-patches.py"), str(layouts),
                           str(tmp_path / "out"), "--provider", "agent"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    ops = yaml.safe_load((tmp_path / "out" / "kubevirt-permitted-host-devices.yaml").read_text())
    assert [op["value"]["resourceName"] for op in ops[:-1]] == ["nvidia.com/NVIDIA_L40S-24Q", "nvidia.com/NVIDIA_L40S-8Q"]
    assert all(op["value"]["externalResourceProvider"] is True for op in ops[:-1])
