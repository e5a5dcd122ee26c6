"""Legacy mdev: T4 (PF parent) and A16/A2 (VF parents, one instance each)."""

from __future__ import annotations

import errno
import os

from simhelpers import enable_vfs, read, write, write_fails

UUIDS = ["0f5c4e4a-0000-4000-8000-%012d" % index for index in range(40)]


def _types(node, parent):
    return node.path("class/mdev_bus", parent, "mdev_supported_types")


def _available(node, parent, type_name):
    return int(read(os.path.join(_types(node, parent), type_name, "available_instances")))


def test_t4_pf_is_the_parent_with_type_files(gpusim_node):
    node = gpusim_node("t4:1")
    pf = node.pfs()[0]
    assert os.listdir(node.path("class/mdev_bus")) == [pf]
    type_dir = os.path.join(_types(node, pf), "nvidia-230")
    assert sorted(os.listdir(type_dir)) == ["available_instances", "create", "description", "device_api",
                                            "devices", "name"]
    assert read(os.path.join(type_dir, "name")) == "GRID T4-1Q"
    assert read(os.path.join(type_dir, "device_api")) == "vfio-pci"
    assert read(os.path.join(type_dir, "available_instances")) == "16"
    assert "framebuffer=1024M" in read(os.path.join(type_dir, "description"))


def test_t4_create_remove_and_homogeneous_counts(gpusim_node):
    node = gpusim_node("t4:1")
    pf = node.pfs()[0]
    create = os.path.join(_types(node, pf), "nvidia-232", "create")          # T4-4Q
    write(create, UUIDS[0])
    mdev = node.path("bus/mdev/devices", UUIDS[0])
    assert os.path.realpath(os.path.join(mdev, "mdev_type")) == os.path.realpath(os.path.dirname(create))
    assert os.readlink(os.path.join(mdev, "iommu_group")) == "../../../../kernel/iommu_groups/5000"
    assert os.listdir(os.path.join(os.path.dirname(create), "devices")) == [UUIDS[0]]
    assert _available(node, pf, "nvidia-232") == 3                         # 16 GB / 4 GB - 1
    assert _available(node, pf, "nvidia-227") == 3                         # T4-4A: same size
    assert _available(node, pf, "nvidia-233") == 0                         # T4-8Q: other size
    write_fails(os.path.join(_types(node, pf), "nvidia-233", "create"), UUIDS[1], errno.EINVAL)
    write_fails(create, "not-a-uuid", errno.EINVAL)
    write_fails(create, UUIDS[0], errno.EEXIST)                            # kernel mdev_device_create
    node.hold(UUIDS[0])
    write_fails(os.path.join(mdev, "remove"), "1", errno.EBUSY)
    node.release(UUIDS[0])
    write(os.path.join(mdev, "remove"), "1")
    assert os.listdir(node.path("bus/mdev/devices")) == []
    assert _available(node, pf, "nvidia-233") == 2


def test_a16_has_four_gpus_with_vf_parents(gpusim_node):
    node = gpusim_node("a16:1")
    pfs = node.pfs("a16")
    assert pfs == ["0000:41:00.0", "0000:42:00.0", "0000:43:00.0", "0000:44:00.0"]
    assert os.listdir(node.path("class/mdev_bus")) == []                    # no parents before sriov enable
    vfs = enable_vfs(node, pfs[0])
    assert sorted(os.listdir(node.path("class/mdev_bus"))) == vfs
    assert not os.path.exists(node.device_path(vfs[0], "nvidia"))           # mdev, not vendor-VFIO
    type_4q = "nvidia-689"
    assert _available(node, vfs[0], type_4q) == 1
    write(os.path.join(_types(node, vfs[0]), type_4q, "create"), UUIDS[0])
    assert _available(node, vfs[0], type_4q) == 0                           # one instance per VF
    assert _available(node, vfs[1], type_4q) == 1
    assert _available(node, vfs[1], "nvidia-690") == 0                      # A16-8Q: other size
    for index in (1, 2, 3):
        write(os.path.join(_types(node, vfs[index]), type_4q, "create"), UUIDS[index])
    assert _available(node, vfs[4], type_4q) == 0                           # 16 GB / 4 GB = 4 used
    enable_vfs(node, pfs[1])
    assert _available(node, node.vfs(pfs[1])[0], "nvidia-690") == 1         # other GPU unaffected


def test_a2_type_names_and_ids(gpusim_node):
    node = gpusim_node("a2:1")
    vf = enable_vfs(node, node.pfs()[0])[0]
    names = {entry: read(os.path.join(_types(node, vf), entry, "name")) for entry in os.listdir(_types(node, vf))}
    assert names["nvidia-742"] == "NVIDIA A2-1B" and names["nvidia-756"] == "NVIDIA A2-16C"
    assert len(names) == 15
