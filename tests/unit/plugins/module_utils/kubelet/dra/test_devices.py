import dataclasses
import os
import re

from dra_node import A16, A16_UUID, L40S, T4, T4_UUID, build, inventory, node_facts

from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import devices
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import Sysfs

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def by_key(found):
    return {device.key: device for device in found}


def test_one_device_per_typed_vf_and_per_mdev_with_sysfs_truth(tmp_path):
    node = build(tmp_path)
    found = by_key(inventory(node))
    assert sorted(found) == sorted(["0000:41:00.4", "0000:41:00.5", A16_UUID, T4_UUID])
    vf = found["0000:41:00.4"]
    assert vf.to_api() == {"name": "l40s-24q-0000-41-00-4", "attributes": {
        "resource.kubernetes.io/pciBusID": {"string": "0000:41:00.4"},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:00"},
        "profile": {"string": "L40S-24Q"}, "typeName": {"string": "NVIDIA L40S-24Q"}, "typeID": {"int": 1155},
        "framework": {"string": "vendor-vfio"}, "parentGPU": {"string": L40S}, "productName": {"string": "L40S"},
        "numaNode": {"int": 1}, "migBacked": {"bool": False}},
        "capacity": {"framebuffer": {"value": "24Gi"}}}
    assert devices.vfio_nodes(Sysfs(str(node.sys)), vf) == (node.group_of("0000:41:00.4"), "devices/vfio1")


def test_mdevs_carry_the_unqualified_uuid_and_their_parent_function(tmp_path):
    node = build(tmp_path)
    found = by_key(inventory(node))
    a16, t4 = found[A16_UUID], found[T4_UUID]
    assert a16.attributes()["mdevUUID"] == {"string": A16_UUID}
    assert a16.address == "0000:51:00.4" and a16.parent_gpu == A16          # the VF is the mdev parent
    assert a16.attributes()["resource.kubernetes.io/pciBusID"] == {"string": "0000:51:00.4"}
    assert (t4.address, t4.parent_gpu, t4.type_id, t4.profile) == (T4, T4, 222, "T4-1B")
    assert "numaNode" not in t4.attributes()      # the kernel says -1: no NUMA node
    assert devices.vfio_nodes(Sysfs(str(node.sys)), t4) == (node.group_of(T4_UUID, "bus/mdev/devices"),)


def test_an_untyped_vf_is_no_device(tmp_path):
    node = build(tmp_path)
    node.set_type("0000:41:00.5", 0)
    assert "0000:41:00.5" not in by_key(inventory(node))


def test_a_retyped_vf_is_another_device(tmp_path):
    node = build(tmp_path)
    before = by_key(inventory(node))["0000:41:00.5"]
    node.set_type("0000:41:00.5", 1156)
    after = by_key(inventory(node))["0000:41:00.5"]
    assert (before.name, after.name) == ("l40s-24q-0000-41-00-5", "l40s-48q-0000-41-00-5")
    assert after.capacity() == {"framebuffer": {"value": "48Gi"}}


def test_device_names_are_dns_labels_and_unique(tmp_path):
    node = build(tmp_path)
    names = [device.name for device in inventory(node)]
    assert len(set(names)) == len(names) and all(DNS_LABEL.match(name) for name in names)
    long_name = devices.device_name("RTX PRO 6000 Blackwell DC-48C-with-a-long-suffix", A16_UUID)
    assert DNS_LABEL.match(long_name) and long_name.endswith(A16_UUID)


def test_mig_backed_profiles_say_so():
    device = devices.DraDevice(name="h100-1-20c-0000-41-00-4", framework="vendor-vfio", address="0000:41:00.4",
                               parent_gpu="0000:41:00.0", profile="H100-1-20C", type_name="NVIDIA H100-1-20C",
                               type_id=1093, mig_backed=True, framebuffer_mib=20480)
    assert device.attributes()["migBacked"] == {"bool": True}


def test_pcie_root_follows_the_sysfs_link(tmp_path):
    node = build(tmp_path)
    sysfs = Sysfs(str(node.sys))
    assert devices.pcie_root(sysfs, L40S) == "pci0000:00"
    os.unlink(node.sys / "bus/pci/devices" / L40S)
    os.symlink("../../../elsewhere/" + L40S, node.sys / "bus/pci/devices" / L40S)
    assert devices.pcie_root(sysfs, L40S) is None        # not below devices/pci*: unknown, not guessed


def test_the_driver_view_checks_a_few_devices_without_reading_the_node_again(tmp_path):
    node = build(tmp_path)
    reads = []
    view = devices.NodeView(Sysfs(str(node.sys)), lambda: reads.append(1) or node_facts(node))
    first = view.devices()
    names = [first[0].name, first[2].name]
    assert view.current(names) == {name: d for d in first for name in names if d.name == name} and len(reads) == 1
    node.set_type("0000:41:00.4", 1156)                               # retyped behind the view's back
    assert "l40s-24q-0000-41-00-4" not in view.current(["l40s-24q-0000-41-00-4"]) and len(reads) == 1
    assert view.current(["l40s-48q-0000-41-00-4"]) and len(reads) == 2   # a name never seen: one full read


def test_the_apply_result_gives_the_devices_a_full_read_of_the_node_gives(gpusim_node, monkeypatch, tmp_path):
    """The agent publishes from the reconcile's own result (no second scan); it must be the sysfs truth: vendor-VFIO
    VFs, mdevs on a GPU and mdevs on VFs (A16), each with its type, parent, pcieRoot and NUMA node."""
    from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import facts, vgpu_apply
    from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout.vgpu_layout import from_layout
    from ansible_collections.accelops.vgpu.plugins.module_utils.runner import CommandRunner

    node = gpusim_node("l40s:1,t4:1,a16:1")
    for name in ("PATH", "GPUSIM_ROOT"):
        monkeypatch.setenv(name, node.env[name])
    engine = vgpu_apply.NodeEngine(Sysfs(node.root), CommandRunner(), node.dev_root, "/proc", cache_dir=str(tmp_path))
    layout = [{"device_filter": "10de:26b9", "profiles": {"L40S-24Q": 2}},
              {"device_filter": "10de:1eb8", "profiles": {"T4-4Q": 2}},
              {"device_filter": "10de:25b6", "profiles": {"A16-8Q": 2}}]
    result = vgpu_apply.apply(engine, from_layout(layout), enable_vfs=True)
    from_result = devices.from_apply(engine.sysfs, result)
    read = devices.inventory(engine.sysfs, facts.gather(engine.sysfs, {}, engine.names))
    assert {d.framework for d in from_result} == {"vendor-vfio", "mdev"}
    assert len(from_result) == 2 + 2 + 8
    # the one difference: the engine names the product from the driver's types (A16), the PCI ID alone cannot
    assert {d.product for d in from_result if d.parent_gpu == "0000:46:00.0"} == {"A16"}
    assert {d.product for d in read if d.parent_gpu == "0000:46:00.0"} == {"A2/A16"}
    assert from_result == [dataclasses.replace(d, product="A16") if d.product == "A2/A16" else d for d in read]
