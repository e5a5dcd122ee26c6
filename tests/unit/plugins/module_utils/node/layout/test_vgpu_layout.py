import json

import pytest

from fake_node import FakeNode

from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout import vgpu_layout as vl
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import Sysfs
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.vgpu_types import VgpuType

DEFAULT_CONFIG = {
    "version": "v1",
    "vgpu-configs": {
        "default": [
            {"device-filter": "0x26B910DE", "devices": "all", "vgpu-devices": {"L40S-24Q": 2}},
            {"device-filter": ["0x25B610DE"], "devices": "all", "vgpu-devices": {"A16-8Q": 2}},
            {"device-filter": "0x25B610DE", "devices": "all", "vgpu-devices": {"A2-8Q": 2}},
        ],
        "T4-small": [
            {"devices": [0], "vgpu-devices": {"T4-1Q": 16}},
            {"devices": [1, 7], "vgpu-devices": {"T4-2Q": 8}},
        ],
    },
}

L40S = ("10de", "26b9")
A16 = ("10de", "25b6")


def gpus(*ids):
    return [vl.Gpu(i, "0000:%02x:00.0" % (0x41 + i), v, d, None) for i, (v, d) in enumerate(ids)]


def test_vdm_default_config_selects_by_device_filter():
    entries = vl.from_vdm_config(DEFAULT_CONFIG, "default")
    chosen = vl.resolve(entries, gpus(L40S, A16))
    assert [e.origin for e in chosen["0000:41:00.0"]] == ["vgpu-configs.default[0]"]
    assert [e.origin for e in chosen["0000:42:00.0"]] == ["vgpu-configs.default[1]", "vgpu-configs.default[2]"]
    assert chosen["0000:41:00.0"][0].profiles == {"L40S-24Q": 2}


def test_vdm_indices_count_gpus_and_missing_ones_select_nothing():
    chosen = vl.resolve(vl.from_vdm_config(DEFAULT_CONFIG, "T4-small"), gpus(L40S, L40S))
    assert chosen["0000:41:00.0"][0].profiles == {"T4-1Q": 16}
    assert chosen["0000:42:00.0"][0].profiles == {"T4-2Q": 8}


def test_single_config_needs_no_selection():
    config = {"version": "v1", "vgpu-configs": {"only": [{"devices": "all", "vgpu-devices": {"L40S-24Q": 2}}]}}
    assert vl.from_vdm_config(config)[0].origin == "vgpu-configs.only[0]"


@pytest.mark.parametrize("config,selected,message", [
    (dict(DEFAULT_CONFIG, version="v2"), "default", "version must be 'v1'"),
    (dict(DEFAULT_CONFIG, extra=1), "default", "unknown field(s) 'extra'"),
    (DEFAULT_CONFIG, "nope", "selected config 'nope' not present"),
    (DEFAULT_CONFIG, None, "select one of T4-small, default"),
    ({"version": "v1", "vgpu-configs": {"x": [{"devices": "all", "vgpu-devices": {"L40S-24Q": 2}, "mig": 1}]}},
     "x", "vgpu-configs.x[0]: unknown field(s) 'mig'"),
    ({"version": "v1", "vgpu-configs": {"x": [{"vgpu-devices": {"L40S-24Q": 2}}]}}, "x",
     "vgpu-configs.x[0]: devices is required"),
    ({"version": "v1", "vgpu-configs": {"x": [{"devices": [-1], "vgpu-devices": {}}]}}, "x",
     "vgpu-configs.x[0]: devices must be 'all' or a list of GPU indices"),
    ({"version": "v1", "vgpu-configs": {"x": [{"devices": "all", "vgpu-devices": {"L40S-24Q": -2}}]}}, "x",
     "vgpu-configs.x[0]: profile L40S-24Q: count -2"),
    ({"version": "v1", "vgpu-configs": {"x": [{"devices": "all", "vgpu-devices": {"L40S": 2}}]}}, "x",
     "vgpu-configs.x[0]: 'L40S' is not a vGPU profile name"),
    ({"version": "v1", "vgpu-configs": {"x": [{"devices": "all", "device-filter": "L40S",
                                               "vgpu-devices": {}}]}}, "x", "vgpu-configs.x[0]: device filter"),
    ({"version": "v1", "vgpu-configs": {"x": []}}, "x", "vgpu-configs.x must be a non-empty list"),
])
def test_bad_vdm_configs_name_what_is_wrong(config, selected, message):
    with pytest.raises(vl.LayoutError) as err:
        vl.from_vdm_config(config, selected)
    assert message in str(err.value)


def test_device_filter_with_subsystem():
    entry = vl.from_vdm_config({"version": "v1", "vgpu-configs": {"x": [
        {"devices": "all", "device-filter": "0x26B910DE:0x18511028", "vgpu-devices": {}}]}}, "x")[0]
    assert entry.filters[0] == vl.DeviceFilter("10de", "26b9", ("1028", "1851"))
    assert entry.selects(vl.Gpu(0, "0000:41:00.0", "10de", "26b9", ("1028", "1851")))
    assert not entry.selects(vl.Gpu(0, "0000:41:00.0", "10de", "26b9", ("10de", "0000")))


def test_simple_layout_by_address_index_and_filter():
    entries = vl.from_layout([
        {"devices": ["41:00.0"], "profiles": {"L40S-24Q": "2"}},
        {"devices": [1], "device_filter": "10de:26b9", "profiles": {"L40S-12Q": 4}},
    ])
    chosen = vl.resolve(entries, gpus(L40S, L40S))
    assert chosen["0000:41:00.0"][0].profiles == {"L40S-24Q": 2}
    assert chosen["0000:42:00.0"][0].origin == "layout[1]"


@pytest.mark.parametrize("layout,message", [
    ([{"devices": ["0000:99:00.0"], "profiles": {}}], "layout[0]: devices: 0000:99:00.0 is not an NVIDIA GPU"),
    ([{"devices": ["41:00.0", "0000:41:00.0"], "profiles": {}}],
     "layout[0]: devices: '41:00.0' and '0000:41:00.0' select the same devices"),
    ([{"devices": [0, "0000:41:00.0"], "profiles": {}}],
     "layout[0]: devices: 0000:41:00.0 is selected twice (by 0 and '0000:41:00.0')"),
    ([{"devices": [1, "1"], "profiles": {}}], "layout[0]: devices: 1 and '1' select the same devices"),
    ([{"devices": [5], "profiles": {}}], "layout[0]: GPU index 5 does not exist"),
    ([{"devices": ["gpu0"], "profiles": {}}], "layout[0]: devices: 'gpu0' is not a PCI address"),
    ([{"devices": "all"}], "layout[0]: profiles is required"),
    ([{"profiles": {}, "count": 1}], "layout[0]: unknown field(s) 'count'"),
    ([], "layout must be a non-empty list"),
])
def test_bad_simple_layouts(layout, message):
    with pytest.raises(vl.LayoutError) as err:
        vl.resolve(vl.from_layout(layout), gpus(L40S, L40S))
    assert message in str(err.value)


def test_vdm_indices_listed_twice_are_refused():
    config = {"version": "v1", "vgpu-configs": {"two": [{"devices": [0, 0], "vgpu-devices": {"L40S-24Q": 1}}]}}
    with pytest.raises(vl.LayoutError) as err:
        vl.from_vdm_config(config, "two")
    assert str(err.value) == "vgpu-configs.two[0]: devices: 0 and 0 select the same devices"


def test_the_same_gpu_in_two_entries_is_an_override_not_a_duplicate():
    entries = vl.from_layout([{"devices": "all", "profiles": {"L40S-24Q": 2}},
                              {"devices": ["41:00.0"], "profiles": {"L40S-48Q": 1}}])
    assert [e.origin for e in vl.resolve(entries, gpus(L40S))["0000:41:00.0"]] == ["layout[0]", "layout[1]"]


def test_documents_are_recognised():
    assert vl.from_document(DEFAULT_CONFIG, "default")[0].origin == "vgpu-configs.default[0]"
    assert vl.from_document({"layout": [{"profiles": {}}]})[0].origin == "layout[0]"
    assert vl.from_document([{"profiles": {}}])[0].devices is None
    with pytest.raises(vl.LayoutError):
        vl.from_document({"profiles": {}})
    with pytest.raises(vl.LayoutError) as err:
        vl.entries(layout=[{"profiles": {}}], selected="default")
    assert "selected" in str(err.value)


@pytest.mark.parametrize("content,message", [
    ("all:\n  hosts:\n    gpu-a: {}\n", "is neither a vGPU config (version/vgpu-configs) nor a layout list (it parses as dict)"),
    ("gpu-a\n", "is neither a vGPU config (version/vgpu-configs) nor a layout list (it parses as str)"),
    ("version: v2\nvgpu-configs: {a: []}\n", ": vGPU config: version must be 'v1'"),
    ("- {profiles: {L40S-24Q: -1}}\n", ": layout[0]: profile L40S-24Q: count -1"),
])
def test_file_errors_name_the_file(tmp_path, content, message):
    path = tmp_path / "hosts.yaml"
    path.write_text(content)
    with pytest.raises(vl.LayoutError) as err:
        vl.from_file(str(path))
    assert str(err.value).startswith(str(path)) and message in str(err.value)
    with pytest.raises(vl.LayoutError) as err:
        vl.from_document(vl.load_file(str(path)), source="ConfigMap vgpu/configs")
    assert str(err.value).startswith("ConfigMap vgpu/configs")


def test_json_and_yaml_files(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(DEFAULT_CONFIG))
    assert vl.load_file(str(path)) == DEFAULT_CONFIG
    path = tmp_path / "c.yaml"
    path.write_text("version: v1\nvgpu-configs:\n  a:\n    - devices: all\n      vgpu-devices: {L40S-24Q: 2}\n")
    assert vl.load_file(str(path))["vgpu-configs"]["a"][0]["devices"] == "all"
    with pytest.raises(vl.LayoutError) as err:
        vl.load_file(str(tmp_path / "missing.yaml"))
    assert "missing.yaml" in str(err.value)


def test_nvidia_gpus_are_pfs_in_address_order(tmp_path):
    node = FakeNode(tmp_path)
    node.pf("0000:42:00.0")
    node.pf("0000:41:00.0")
    node.nic("0000:05:00.0")
    node.set_numvfs("0000:41:00.0", 2)
    found = vl.nvidia_gpus(Sysfs(str(node.sys)))
    assert [(g.index, g.address) for g in found] == [(0, "0000:41:00.0"), (1, "0000:42:00.0")]


def test_choosing_among_entries_skips_profiles_of_other_models():
    a2_types = [VgpuType(747, "NVIDIA A2-8Q")]
    entries = vl.from_vdm_config(DEFAULT_CONFIG, "default")[1:]
    entry, wanted = vl.choose_profiles("0000:42:00.0", "A2", entries, lambda p: next(
        (t for t in a2_types if t.short == p), None))
    assert entry.origin == "vgpu-configs.default[2]" and wanted == {a2_types[0]: 2}
    with pytest.raises(vl.LayoutError) as err:
        vl.choose_profiles("0000:41:00.0", "L40S", entries, lambda p: None)
    assert str(err.value) == ("GPU 0000:41:00.0 (L40S): profile A16-8Q (vgpu-configs.default[1]) is a profile of "
                              "A16 GPUs, not of this L40S")


def test_size_checks():
    q24, q12 = VgpuType(1155, "NVIDIA L40S-24Q"), VgpuType(1153, "NVIDIA L40S-12Q")
    vl.check_sizes("0000:41:00.0", [q24, q24], False, 48, 32)
    with pytest.raises(vl.LayoutError) as err:
        vl.check_sizes("0000:41:00.0", [q24, q12], False, 48, 32)
    assert "L40S-12Q and L40S-24Q have different framebuffer sizes" in str(err.value)
    vl.check_sizes("0000:41:00.0", [q24, q12, q12], True, 48, 32)
    with pytest.raises(vl.LayoutError) as err:
        vl.check_sizes("0000:41:00.0", [q24] * 3, False, 48, 32)
    assert "3 x L40S-24Q need 72 GB of framebuffer, the GPU has 48 GB" in str(err.value)
    with pytest.raises(vl.LayoutError) as err:
        vl.check_sizes("0000:41:00.0", [q12] * 4, False, None, 3)
    assert "only 3 slots" in str(err.value)
