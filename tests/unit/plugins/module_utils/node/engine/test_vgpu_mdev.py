"""The mdev backend on plain-file trees: T4 (the PF is the parent) and A16 (each VF is a parent)."""

import pytest

from fake_node import FakeNode

from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import inuse
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import vgpu_mdev
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import Sysfs
from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout.vgpu_layout import LayoutError, from_layout, nvidia_gpus

T4 = "0000:43:00.0"
A16 = "0000:44:00.0"
T4_TYPES = (("nvidia-230", "GRID T4-1Q", 1, 16), ("nvidia-232", "GRID T4-4Q", 4, 4), ("nvidia-234", "GRID T4-16Q", 16, 1))
A16_TYPES = (("nvidia-689", "NVIDIA A16-4Q", 4, 4), ("nvidia-690", "NVIDIA A16-8Q", 8, 2), ("nvidia-691", "NVIDIA A16-16Q", 16, 1))


def add_types(node, parent, types):
    for dirname, name, size, count in types:
        node.mdev_type(parent, dirname, name, 1 if node.dir(parent).joinpath("physfn").exists() else count)
        (node.dir(parent) / "mdev_supported_types" / dirname / "description").write_text(
            "num_heads=4, frl_config=60, framebuffer=%dM, max_resolution=5120x2880, max_instance=%d\n"
            % (size * 1024, count))


@pytest.fixture
def t4(tmp_path):
    node = FakeNode(tmp_path)
    node.device(T4, device="0x1eb8")
    add_types(node, T4, T4_TYPES)
    return node


@pytest.fixture
def a16(tmp_path):
    node = FakeNode(tmp_path)
    node.pf(A16, total=4, vf_style="plain", device="0x25b6")
    for vf in node.set_numvfs(A16, 4):
        add_types(node, vf, A16_TYPES)
    return node


def plan(node, profiles, **kwargs):
    sysfs = Sysfs(str(node.sys))
    held = inuse.held_devices(sysfs, str(node.dev), str(node.proc))
    view = vgpu_mdev.MdevGpu(sysfs, nvidia_gpus(sysfs)[0], held)
    return view, vgpu_mdev.plan(view, from_layout([{"profiles": profiles}]), **kwargs)


def test_t4_mdevs_on_the_pf_get_deterministic_uuids(t4):
    dummy, result = plan(t4, {"T4-4Q": 4})
    uuids = [vgpu_mdev.mdev_uuid(T4, "T4-4Q", i) for i in range(4)]
    assert result.steps == [("create", u, T4, "nvidia-232") for u in uuids]
    assert result.model == "T4" and result.framework == "mdev"
    assert uuids == [vgpu_mdev.mdev_uuid(T4, "T4-4Q", i) for i in range(4)] and len(set(uuids)) == 4


def test_existing_mdevs_of_a_wanted_type_are_kept(t4):
    t4.mdev("00000000-0000-0000-0000-000000000001", T4, "nvidia-232")
    t4.mdev(vgpu_mdev.mdev_uuid(T4, "T4-4Q", 0), T4, "nvidia-232")
    dummy, result = plan(t4, {"T4-4Q": 2})
    assert result.steps == []
    dummy, result = plan(t4, {"T4-4Q": 3})
    assert result.steps == [("create", vgpu_mdev.mdev_uuid(T4, "T4-4Q", 1), T4, "nvidia-232")]


def test_a_held_mdev_is_never_removed(t4):
    uuid = "00000000-0000-0000-0000-000000000001"
    t4.mdev(uuid, T4, "nvidia-232")
    pid = t4.hold(t4.group_of(uuid, "bus/mdev/devices"))
    with pytest.raises(LayoutError) as err:
        plan(t4, {"T4-1Q": 16})
    assert str(err.value) == ("mdev %s (T4-4Q) on %s of GPU %s is held by a VM (pid %d); the layout needs it "
                              "removed" % (uuid, T4, T4, pid))
    dummy, result = plan(t4, {}, absent=True)
    assert result.steps == [] and "held by a VM" in result.warnings[0]


def test_unwanted_mdevs_are_removed_before_creating(t4):
    t4.mdev("00000000-0000-0000-0000-000000000001", T4, "nvidia-234")
    dummy, result = plan(t4, {"T4-4Q": 1})
    assert [s[0] for s in result.steps] == ["remove", "create"]


def test_a16_spreads_one_mdev_per_vf(a16):
    dummy, result = plan(a16, {"A16-8Q": 2})
    vfs = [s[2] for s in result.steps]
    assert vfs == ["0000:44:00.4", "0000:44:00.5"] and result.model == "A16"
    assert [v.to_dict()["after"] for v in result.vgpus] == ["A16-8Q", "A16-8Q"]


@pytest.mark.parametrize("profiles,message", [
    ({"A16-8Q": 3}, "3 x A16-8Q need 24 GB of framebuffer, the GPU has 16 GB"),
    ({"A16-4Q": 5}, "no free VF left for A16-4Q"),
    ({"A16-8Q": 1, "A16-4Q": 1}, "different framebuffer sizes"),
    ({"A2-8Q": 1}, "is a profile of A2 GPUs, not of this A16"),
])
def test_impossible_mdev_layouts(a16, profiles, message):
    with pytest.raises(LayoutError) as err:
        plan(a16, profiles)
    assert message in str(err.value)


def test_execute_checks_that_the_mdev_appeared(t4):
    view, result = plan(t4, {"T4-16Q": 1})
    (t4.dir(T4) / "mdev_supported_types/nvidia-234/create").write_text("")
    sysfs = Sysfs(str(t4.sys))
    with pytest.raises(LayoutError) as err:
        vgpu_mdev.execute(sysfs, view, result)
    assert "did not appear after create" in str(err.value)
    assert sysfs.write_log == [("class/mdev_bus/%s/mdev_supported_types/nvidia-234/create" % T4,
                                vgpu_mdev.mdev_uuid(T4, "T4-16Q", 0))]
