import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw import vgpu_types as vt
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import Sysfs

L40S_CREATABLE = """ID    : vGPU Name
1145  : NVIDIA L40S-1B
1155  : NVIDIA L40S-24Q

2164  : NVIDIA L40S-3B
"""


def test_creatable_list_with_header_is_parsed_in_order():
    types = vt.parse_creatable(L40S_CREATABLE)
    assert types == [vt.VgpuType(1145, "NVIDIA L40S-1B"), vt.VgpuType(1155, "NVIDIA L40S-24Q"),
                     vt.VgpuType(2164, "NVIDIA L40S-3B")]
    assert types[1].short == "L40S-24Q"


def test_creatable_list_without_header_and_odd_whitespace():
    text = "  1428 :NVIDIA   H200X-141C\t\n\n1414:  NVIDIA H200X-1-18C"
    assert vt.parse_creatable(text) == [vt.VgpuType(1428, "NVIDIA H200X-141C"),
                                        vt.VgpuType(1414, "NVIDIA H200X-1-18C")]


@pytest.mark.parametrize("text", ["", "\n", "ID : vGPU Name\n"])
def test_empty_creatable_lists(text):
    assert vt.parse_creatable(text) == []


def test_garbage_line_names_the_line():
    with pytest.raises(vt.VgpuTypeError) as err:
        vt.parse_creatable("1155 : NVIDIA L40S-24Q\nbroken line\n")
    assert "broken line" in str(err.value)


@pytest.mark.parametrize("full,short", [
    ("NVIDIA RTX Pro 6000 Blackwell DC-48C", "DC-48C"),
    ("NVIDIA L40S-24Q", "L40S-24Q"),
    ("GRID T4-1Q", "T4-1Q"),
    ("  A16-8Q ", "A16-8Q"),
])
def test_short_name_is_the_last_token(full, short):
    assert vt.short_name(full) == short


@pytest.mark.parametrize("name,expected", [
    ("L40S-24Q", ("L40S", None, 24, "Q", None)),
    ("NVIDIA H200X-1-18C", ("H200X", 1, 18, "C", None)),
    ("DC-1-24QGFX", ("DC", 1, 24, "Q", "GFX")),
    ("A30-1-6CME", ("A30", 1, 6, "C", "ME")),
    ("A100-1-10CNOME", ("A100", 1, 10, "C", "NOME")),
    ("H100-1-10CMEALL", ("H100", 1, 10, "C", "MEALL")),
    ("RTX6000-Ada-24Q", ("RTX6000-Ada", None, 24, "Q", None)),
    ("T4-16Q", ("T4", None, 16, "Q", None)),
])
def test_profile_names_are_parsed(name, expected):
    parsed = vt.parse_profile(name)
    assert tuple(parsed) == expected
    assert parsed.mig_backed == (expected[1] is not None)


@pytest.mark.parametrize("name", ["L40S", "24Q", "L40S-24", "L40S-Q", ""])
def test_bad_profile_names_are_named(name):
    with pytest.raises(vt.VgpuTypeError) as err:
        vt.parse_profile(name)
    assert repr(name) in str(err.value)


def test_users_may_give_short_or_full_names_and_vdm_suffixes():
    types = [vt.VgpuType(1155, "NVIDIA L40S-24Q"), vt.VgpuType(1414, "NVIDIA H200X-1-18C")]
    assert vt.find_type("L40S-24Q", types).type_id == 1155
    assert vt.find_type("nvidia  l40s-24q", types).type_id == 1155
    assert vt.find_type("H200X-1-18CME", types).type_id == 1414
    assert vt.find_type("L40S-12Q", types) is None
    assert vt.find_type("A16-8Q", types) is None


def test_a_suffix_the_driver_knows_is_not_stripped():
    types = [vt.VgpuType(1, "NVIDIA A30-1-6C"), vt.VgpuType(2, "NVIDIA A30-1-6CME")]
    assert vt.find_type("A30-1-6CME", types).type_id == 2


@pytest.mark.parametrize("full,resource", [
    ("NVIDIA L40S-24Q", "nvidia.com/NVIDIA_L40S-24Q"),
    ("NVIDIA A2-4Q", "nvidia.com/NVIDIA_A2-4Q"),
    ("NVIDIA RTX Pro 6000 Blackwell DC-48C", "nvidia.com/NVIDIA_RTX_Pro_6000_Blackwell_DC-48C"),
    ("GRID T4/1.5Q", "nvidia.com/GRID_T4_1_5Q"),
])
def test_resource_names_follow_harvester(full, resource):
    assert vt.resource_name(full) == resource


def test_framebuffer_from_mdev_description():
    desc = "num_heads=4, frl_config=45, framebuffer=1024M, max_resolution=5120x2880, max_instance=16"
    assert vt.parse_description(desc)["max_instance"] == "16"
    assert vt.framebuffer_mib(desc) == 1024
    assert vt.framebuffer_mib("framebuffer=8G") == 8192
    assert vt.framebuffer_mib("num_heads=1") is None


def test_mdev_types_are_read_in_type_number_order(tmp_path):
    base = tmp_path / "class/mdev_bus/0000:08:01.7/mdev_supported_types"
    for number, name, avail in ((745, "NVIDIA A2-4Q", 1), (1000, "NVIDIA A2-16Q", 0), (742, "NVIDIA A2-1B", 0)):
        tdir = base / ("nvidia-%d" % number)
        tdir.mkdir(parents=True)
        (tdir / "name").write_text(name + "\n")
        (tdir / "available_instances").write_text("%d\n" % avail)
        (tdir / "description").write_text("framebuffer=4096M\n")
    (base / "not-a-type").mkdir()
    sysfs = Sysfs(str(tmp_path))
    types = vt.read_mdev_types(sysfs, "0000:08:01.7")
    assert [t.dirname for t in types] == ["nvidia-742", "nvidia-745", "nvidia-1000"]
    assert types[1].available_instances == 1 and types[1].short == "A2-4Q"
    assert types[1].type_path == "class/mdev_bus/0000:08:01.7/mdev_supported_types/nvidia-745"
    assert vt.mdev_parents(sysfs) == ["0000:08:01.7"]


def test_vfio_type_files_are_read(tmp_path):
    nv = tmp_path / "bus/pci/devices/0000:41:00.4/nvidia"
    nv.mkdir(parents=True)
    (nv / "creatable_vgpu_types").write_text(L40S_CREATABLE)
    (nv / "current_vgpu_type").write_text("0\n")
    sysfs = Sysfs(str(tmp_path))
    assert len(vt.read_creatable(sysfs, "0000:41:00.4")) == 3
    assert vt.read_current(sysfs, "0000:41:00.4") == 0
    assert vt.has_vfio_types(sysfs, "0000:41:00.4")
    assert not vt.has_vfio_types(sysfs, "0000:41:00.5")
    assert vt.read_current(sysfs, "0000:41:00.5") is None


def test_smi_supported_list_names_consumed_ids():
    text = """GPU 00000000:41:00.0
    vGPU Type ID                          : 0x47b
        Name                              : NVIDIA L40S-1B
        Class                             : NVS
    vGPU Type ID                          : 1155
        Name                              : NVIDIA  L40S-24Q
    vGPU Type ID                          : bogus
        Name                              : NVIDIA L40S-99Q
"""
    assert vt.parse_smi_supported(text) == [vt.VgpuType(0x47B, "NVIDIA L40S-1B"),
                                            vt.VgpuType(1155, "NVIDIA L40S-24Q")]
