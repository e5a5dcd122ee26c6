"""What a conformance run creates: the labelled namespace and the pinned, vGPU-requesting VMIs."""

from __future__ import annotations

from ansible_collections.accelops.vgpu.plugins.module_utils.cluster.conformance import workloads

PLAN = {"profile": "L40S-24Q", "resource": "nvidia.com/NVIDIA_L40S-24Q", "node": "gpu-a", "hostname": "gpu-a.lan"}
PARAMS = {"container_disk_image": "registry.example.com/fedora-nvidia:41", "vmi_memory": "2Gi"}


def test_a_vmi_requests_one_vgpu_on_the_plans_node_and_carries_the_run_label():
    vmi = workloads.vmi_manifest("v-1", "ns", "run1", PLAN, PARAMS)
    assert vmi["metadata"] == {"name": "v-1", "namespace": "ns", "labels": {
        "accelops.io/vgpu-conformance": "run1", "accelops.io/vgpu-conformance-profile": "L40S-24Q"}}
    spec = vmi["spec"]
    assert spec["nodeSelector"] == {"kubernetes.io/hostname": "gpu-a.lan"}
    assert spec["domain"]["devices"]["gpus"] == [{"name": "vgpu1", "deviceName": "nvidia.com/NVIDIA_L40S-24Q"}]
    assert spec["domain"]["resources"] == {"requests": {"memory": "2Gi"}}
    assert spec["volumes"] == [{"name": "containerdisk",
                                "containerDisk": {"image": "registry.example.com/fedora-nvidia:41"}}]
    assert [d["name"] for d in spec["domain"]["devices"]["disks"]] == ["containerdisk"]
    assert workloads.describe(vmi) == "VirtualMachineInstance ns/v-1"


def test_cloud_init_user_data_becomes_a_nocloud_disk():
    vmi = workloads.vmi_manifest("v-1", "ns", "run1", PLAN, dict(PARAMS, cloud_init_user_data="#cloud-config\n"))
    assert vmi["spec"]["volumes"][1] == {"name": "cloudinit", "cloudInitNoCloud": {"userData": "#cloud-config\n"}}
    assert [d["name"] for d in vmi["spec"]["domain"]["devices"]["disks"]] == ["containerdisk", "cloudinit"]


def test_ownership_is_the_run_label():
    ns = workloads.namespace_manifest("vgpu-conformance", "run1")
    assert workloads.describe(ns) == "Namespace vgpu-conformance"
    assert (workloads.is_ours(ns), workloads.run_of(ns)) == (True, "run1")
    assert workloads.is_ours({"metadata": {"name": "default"}}) is False
    assert workloads.valid_namespace("vgpu-conformance") and not workloads.valid_namespace("Vgpu_x")
