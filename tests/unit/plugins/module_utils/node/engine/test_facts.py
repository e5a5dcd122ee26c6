import os
import shutil

from fake_node import FakeNode, RecordingSysfs

from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import inuse
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import facts
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import Sysfs
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.vgpu_types import VgpuType

L40S, A16, T4, NIC = "0000:41:00.0", "0000:51:00.0", "0000:81:00.0", "0000:61:00.0"
UUID = "5c8f3b52-0c1c-4a4b-9f5e-0000000000aa"


def gather(node, root=None):
    sysfs = Sysfs(str(root or node.sys))
    return facts.gather(sysfs, inuse.held_devices(sysfs, str(node.dev), str(node.proc)))


def build(tmp_path):
    """L40S with 2 VFs (one typed and held), an A16 with 2 mdev VFs (one mdev), a T4 (PF mdev parent), a NIC."""
    node = FakeNode(tmp_path)
    node.pf(L40S, total=32)
    node.set_numvfs(L40S, 2)
    node.set_type("0000:41:00.5", 1155)
    (node.dir("0000:41:00.4") / "nvidia/creatable_vgpu_types").write_text("ID : vGPU Name\n1155 : NVIDIA L40S-24Q\n")
    node.mdev_gpu(A16, total=2)
    node.mdev(UUID, "0000:51:00.4")
    node.device(T4, device="0x1eb8", cls="0x030000")
    node.mdev_type(T4, "nvidia-222", "GRID T4-1B", 16)
    node.nic(NIC)
    node.set_numvfs(NIC, 2)
    return node


def by(items, key):
    return dict((item[key], item) for item in items)


def test_gpus_models_and_frameworks(tmp_path):
    node = build(tmp_path)
    gpus = by(gather(node)["gpus"], "address")
    assert sorted(gpus) == [L40S, A16, T4]        # the NIC is no GPU
    assert [(gpus[a]["model"], gpus[a]["framework"]) for a in (L40S, A16, T4)] == \
        [("L40S", "vendor-vfio"), ("A2/A16", "mdev"), ("T4", "mdev")]
    assert gpus[L40S]["pci_id"] == "10de:26b9" and gpus[L40S]["driver"] == "nvidia"
    assert (gpus[L40S]["sriov_totalvfs"], gpus[L40S]["sriov_numvfs"]) == (32, 2)
    assert gpus[L40S]["vfs"] == ["0000:41:00.4", "0000:41:00.5"]
    assert gpus[T4]["mdev_types"] == [{"type": "nvidia-222", "name": "GRID T4-1B", "available_instances": 16}]
    assert (gpus[T4]["sriov_totalvfs"], gpus[T4]["vfs"]) == (0, [])


def test_a_gpu_without_vfs_has_no_framework_yet(tmp_path):
    node = FakeNode(tmp_path)
    node.pf(L40S)
    assert gather(node)["gpus"][0]["framework"] == "none"


def test_vendor_vfio_vfs_report_type_names_from_sibling_lists_and_holders(tmp_path):
    node = build(tmp_path)
    pid = node.hold(node.group_of("0000:41:00.5"))
    vfs = by(gather(node)["vfs"], "address")
    assert sorted(vfs) == ["0000:41:00.4", "0000:41:00.5", "0000:51:00.4", "0000:51:00.5"]
    typed = vfs["0000:41:00.5"]
    assert (typed["pf"], typed["vgpu_type_id"], typed["vgpu_type"]) == (L40S, 1155, "NVIDIA L40S-24Q")
    assert (typed["held"], typed["holders"]) == (True, [pid])
    free = vfs["0000:41:00.4"]
    assert (free["vgpu_type_id"], free["vgpu_type"], free["held"]) == (0, None, False)
    assert free["creatable_types"] == [{"id": 1155, "name": "NVIDIA L40S-24Q"}]
    assert free["iommu_group"] == node.group_of("0000:41:00.4") and free["driver"] == "nvidia"
    assert "vendor_vfio" not in free


def test_mdev_vfs_and_mdevs(tmp_path):
    node = build(tmp_path)
    pid = node.hold(node.group_of(UUID, "bus/mdev/devices"))
    found = gather(node)
    vf = by(found["vfs"], "address")["0000:51:00.4"]
    assert vf["vgpu_type_id"] is None and vf["mdevs"] == [UUID] and vf["held"]
    assert vf["mdev_types"] == [{"type": "nvidia-742", "name": "NVIDIA A2-1B", "available_instances": 1}]
    assert found["mdevs"] == [{"uuid": UUID, "parent": "0000:51:00.4", "type": "nvidia-742",
                               "type_name": "NVIDIA A2-1B", "iommu_group": node.group_of(UUID, "bus/mdev/devices"),
                               "held": True, "holders": [pid]}]


def test_a_copied_tree_with_broken_and_missing_attributes_still_reports(tmp_path):
    node = build(tmp_path / "live")
    copy = tmp_path / "copy"
    shutil.copytree(str(node.sys), str(copy), symlinks=True)
    dev = copy / "devices/pci0000:00"
    (dev / L40S / "sriov_numvfs").write_text("garbage\n")
    (dev / "0000:41:00.4/nvidia/creatable_vgpu_types").write_text("not a type list\n")
    os.unlink(dev / "0000:41:00.5/iommu_group")
    os.unlink(dev / A16 / "device")
    os.unlink(dev / "0000:51:00.4" / UUID / "mdev_type")
    found = gather(node, copy)
    gpus, vfs = by(found["gpus"], "address"), by(found["vfs"], "address")
    assert gpus[L40S]["sriov_numvfs"] == 0 and gpus[L40S]["vfs"] == ["0000:41:00.4", "0000:41:00.5"]
    assert vfs["0000:41:00.4"]["creatable_types"] == [] and vfs["0000:41:00.5"]["iommu_group"] is None
    assert (gpus[A16]["device"], gpus[A16]["pci_id"], gpus[A16]["model"]) == (None, None, None)
    assert found["mdevs"][0]["type"] is None and found["mdevs"][0]["parent"] == "0000:51:00.4"


def _census_view(vfs):
    return sorted((vf["address"], vf["vgpu_type_id"], vf["vgpu_type"], vf["held"], vf["iommu_group"]) for vf in vfs)


def test_the_census_counts_what_gather_reports_with_one_read_per_vf(tmp_path):
    node = build(tmp_path)
    node.hold(node.group_of("0000:41:00.5"))
    node.hold(node.group_of(UUID, "bus/mdev/devices"))
    sysfs = RecordingSysfs(str(node.sys))
    held = inuse.held_devices(sysfs, str(node.dev), str(node.proc))
    full = facts.gather(sysfs, held)
    sysfs.reads = []
    census = facts.vgpu_census(sysfs, held)        # no type names: the type is named from a creatable list
    assert _census_view(census["vfs"]) == _census_view(vf for vf in full["vfs"] if vf["vgpu_type_id"]) == [
        ("0000:41:00.5", 1155, "NVIDIA L40S-24Q", True, node.group_of("0000:41:00.5"))]
    assert census["mdevs"] == full["mdevs"]
    sysfs.reads = []
    census = facts.vgpu_census(sysfs, held, lambda pf: ([VgpuType(1155, "NVIDIA L40S-24Q")], False),
                               lambda vf: "group-%s" % vf)
    assert _census_view(census["vfs"]) == [("0000:41:00.5", 1155, "NVIDIA L40S-24Q", True, "group-0000:41:00.5")]
    vf_reads = [r for r in sysfs.reads if r.startswith(("bus/pci/devices/0000:41:00.4", "bus/pci/devices/0000:41:00.5"))]
    assert vf_reads == ["bus/pci/devices/0000:41:00.%d/nvidia/current_vgpu_type" % n for n in (4, 5)]


def test_an_empty_tree_has_no_gpus(tmp_path):
    (tmp_path / "proc").mkdir()
    assert facts.gather(Sysfs(str(tmp_path / "nothing")), {}) == {"gpus": [], "vfs": [], "mdevs": []}


def test_a_type_no_list_shows_any_more_is_named_by_type_names(tmp_path):
    node = FakeNode(tmp_path)
    node.pf(L40S, total=32)
    node.set_numvfs(L40S, 2)
    for vf in ("0000:41:00.4", "0000:41:00.5"):
        node.set_type(vf, 1153)       # 12Q: not in the fake creatable list
    asked = []

    def type_names(pf):
        asked.append(pf)
        return [VgpuType(1153, "NVIDIA L40S-12Q")], False   # vgpu_apply.TypeNames' answer: (types, complete)
    sysfs = Sysfs(str(node.sys))
    vfs = facts.gather(sysfs, {}, type_names)["vfs"]
    assert [vf["vgpu_type"] for vf in vfs] == ["NVIDIA L40S-12Q"] * 2 and asked == [L40S]
    assert [vf["vgpu_type"] for vf in facts.gather(sysfs, {})["vfs"]] == [None, None]
