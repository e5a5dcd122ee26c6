"""The node's vGPUs as device plugin resources, from the engine's apply result on gpusim (plain data, no gRPC)."""

from __future__ import annotations

import os

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet import device_plugin
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.errors import AllocationError
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import devices as dra_devices
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import facts, vgpu_apply
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import Sysfs
from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout.vgpu_layout import from_layout
from ansible_collections.accelops.vgpu.plugins.module_utils.runner import CommandRunner

R24, R12 = "nvidia.com/NVIDIA_L40S-24Q", "nvidia.com/NVIDIA_L40S-12Q"
# one GPU model, two profiles on one node: what KubeVirt's PCI-ID selector cannot offer
MIXED_FLEET = [{"devices": ["0000:41:00.0"], "profiles": {"L40S-24Q": 2}},
               {"devices": ["0000:42:00.0"], "profiles": {"L40S-12Q": 4}}]


def engine_for(node, monkeypatch, tmp_path):
    for name in ("PATH", "GPUSIM_ROOT"):
        monkeypatch.setenv(name, node.env[name])
    return vgpu_apply.NodeEngine(Sysfs(node.root), CommandRunner(), node.dev_root, "/proc", cache_dir=str(tmp_path))


@pytest.fixture
def mixed(gpusim_node, monkeypatch, tmp_path):
    node = gpusim_node("l40s:2")
    engine = engine_for(node, monkeypatch, tmp_path)
    result = vgpu_apply.apply(engine, from_layout(MIXED_FLEET), enable_vfs=True)
    return node, engine, result


def test_env_names_follow_kubevirts_rule_and_keep_the_dash():
    assert device_plugin.env_name("PCI_RESOURCE", R24) == "PCI_RESOURCE_NVIDIA_COM_NVIDIA_L40S-24Q"
    assert device_plugin.env_name("MDEV_PCI_RESOURCE", "nvidia.com/GRID_T4-4Q") == \
        "MDEV_PCI_RESOURCE_NVIDIA_COM_GRID_T4-4Q"


def test_one_resource_per_profile_with_the_vfs_that_carry_it(mixed):
    node, engine, result = mixed
    devices = device_plugin.devices_from_apply(engine.sysfs, result)
    views = device_plugin.resource_views(devices)
    assert sorted(views) == [R12, R24]
    assert [d.id for d in views[R24].devices] == ["0000:41:00.4", "0000:41:00.5"]
    assert [d.id for d in views[R12].devices] == ["0000:42:00.4", "0000:42:00.5", "0000:42:00.6", "0000:42:00.7"]
    # the sysfs truth: each device's type, NUMA node and IOMMU group as the node shows them
    for device in devices:
        base = "bus/pci/devices/%s" % device.id
        assert device.kind == "pci" and device.healthy
        assert device.type_id == int(node.read(base + "/nvidia/current_vgpu_type"))
        assert device.numa_nodes == (int(node.read(base + "/numa_node")),)
        assert device.iommu_group == os.path.basename(os.readlink(node.path(base, "iommu_group")))
        assert device.cdevs == tuple(os.listdir(node.path(base, "vfio-dev")))
    assert set(d.numa_nodes for d in views[R24].devices) == {(0,)}
    assert set(d.numa_nodes for d in views[R12].devices) == {(1,)}


def test_allocate_gives_kubevirts_env_and_the_vfio_nodes(mixed):
    dummy, engine, result = mixed
    view = device_plugin.resource_views(device_plugin.devices_from_apply(engine.sysfs, result))[R24]
    first, second = view.devices
    allocation = view.allocate([second.id, first.id])
    assert allocation.envs == {"PCI_RESOURCE_NVIDIA_COM_NVIDIA_L40S-24Q": "0000:41:00.5,0000:41:00.4"}
    assert allocation.device_specs == [
        ("/dev/vfio/vfio", "/dev/vfio/vfio", "mrw"),
        ("/dev/vfio/" + second.iommu_group, "/dev/vfio/" + second.iommu_group, "mrw"),
        ("/dev/vfio/devices/" + second.cdevs[0], "/dev/vfio/devices/" + second.cdevs[0], "mrw"),
        ("/dev/vfio/" + first.iommu_group, "/dev/vfio/" + first.iommu_group, "mrw"),
        ("/dev/vfio/devices/" + first.cdevs[0], "/dev/vfio/devices/" + first.cdevs[0], "mrw")]
    with pytest.raises(AllocationError) as refused:
        view.allocate(["0000:42:00.4"])     # a VF of the other profile
    assert str(refused.value) == "resource %s: no vGPU 0000:42:00.4 on this node" % R24


def test_mdev_vgpus_are_their_uuids_and_use_the_mdev_variable(gpusim_node, monkeypatch, tmp_path):
    node = gpusim_node("t4:1")
    engine = engine_for(node, monkeypatch, tmp_path)
    result = vgpu_apply.apply(engine, from_layout([{"profiles": {"T4-4Q": 2}}]), enable_vfs=True)
    views = device_plugin.resource_views(device_plugin.devices_from_apply(engine.sysfs, result))
    assert list(views) == ["nvidia.com/GRID_T4-4Q"]
    devices = views["nvidia.com/GRID_T4-4Q"].devices
    assert sorted(d.id for d in devices) == sorted(os.listdir(node.path("bus/mdev/devices")))
    assert all(d.kind == "mdev" and d.parent == "0000:41:00.0" for d in devices)
    allocation = views["nvidia.com/GRID_T4-4Q"].allocate([devices[0].id])
    assert allocation.envs == {"MDEV_PCI_RESOURCE_NVIDIA_COM_GRID_T4-4Q": devices[0].id}
    group = os.path.basename(os.readlink(node.path("bus/mdev/devices", devices[0].id, "iommu_group")))
    assert allocation.device_specs[1] == ("/dev/vfio/" + group, "/dev/vfio/" + group, "mrw")
    assert device_plugin.check_health(engine.sysfs, devices) == devices
    node.ctl("reboot")                  # the vGPU manager restarts: the mdevs are gone
    assert not any(d.healthy for d in device_plugin.check_health(engine.sysfs, devices))


def test_a_manager_restart_makes_them_unhealthy_and_a_reapply_healthy_again(mixed):
    node, engine, result = mixed
    devices = device_plugin.devices_from_apply(engine.sysfs, result)
    node.ctl("reboot")
    assert not any(d.healthy for d in device_plugin.check_health(engine.sysfs, devices))
    again = vgpu_apply.apply(engine, from_layout(MIXED_FLEET), enable_vfs=True)
    assert again["changed"]
    restored = device_plugin.devices_from_apply(engine.sysfs, again)
    assert device_plugin.check_health(engine.sysfs, restored) == restored == devices


def test_a_vf_that_lost_its_driver_or_type_is_unhealthy_and_a_held_one_stays_healthy(mixed):
    node, engine, result = mixed
    devices = device_plugin.devices_from_apply(engine.sysfs, result)
    node.hold("0000:41:00.4")                                              # a VM runs on it
    node.write("bus/pci/devices/0000:42:00.5/nvidia/current_vgpu_type", "0")   # someone cleared the type
    node.write("bus/pci/drivers/nvidia/unbind", "0000:42:00.6")            # off the nvidia driver
    health = dict((d.id, d.healthy) for d in device_plugin.check_health(engine.sysfs, devices))
    assert health == {"0000:41:00.4": True, "0000:41:00.5": True, "0000:42:00.4": True,
                      "0000:42:00.5": False, "0000:42:00.6": False, "0000:42:00.7": True}


def programmed(engine, gpus=None, serves=None):
    found = dra_devices.inventory(engine.sysfs, facts.gather(engine.sysfs, {}, engine.names))
    return device_plugin.devices_programmed(engine.sysfs, found, gpus, serves)


@pytest.mark.parametrize("spec, layout", [("l40s:2", MIXED_FLEET), ("t4:1,a16:1", [{"profiles": {"T4-4Q": 2}},
                                                                                   {"profiles": {"A16-4Q": 4}}])])
def test_what_the_node_has_programmed_is_what_the_apply_served(gpusim_node, monkeypatch, tmp_path, spec, layout):
    # issue 31.4: an agent whose first layout is refused serves what sysfs shows, the same devices an apply gives
    node = gpusim_node(spec)
    engine = engine_for(node, monkeypatch, tmp_path)
    result = vgpu_apply.apply(engine, from_layout(layout), enable_vfs=True)
    applied = sorted(device_plugin.devices_from_apply(engine.sysfs, result))
    assert applied and sorted(programmed(engine)) == applied
    first = result["gpus"][0]["address"]
    only_first = sorted(device_plugin.devices_from_apply(engine.sysfs, result, serves={first}.__contains__))
    assert 0 < len(only_first) < len(applied) and sorted(programmed(engine, gpus={first})) == only_first


def test_programmed_vgpus_are_served_as_healthy_as_sysfs_says(mixed):
    node, engine, dummy = mixed
    node.write("bus/pci/devices/0000:42:00.5/nvidia/current_vgpu_type", "0")   # no type: not programmed, not served
    devices = programmed(engine)
    assert "0000:42:00.5" not in [d.id for d in devices] and all(d.healthy for d in devices)
    assert sorted(d.id for d in programmed(engine, serves={"0000:41:00.0"}.__contains__)) == [
        "0000:41:00.4", "0000:41:00.5"]
