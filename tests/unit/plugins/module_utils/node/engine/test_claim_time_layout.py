"""Claim-time GPUs declared beside the layout (node/engine/claim_time_layout.py) against gpusim: the reconcile leaves
them alone, moves between the modes need free VFs, the declaration's errors name the GPU and the profile."""

import json

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import claim_time
from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout import vgpu_layout
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import claim_time_layout, vgpu_apply
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import Sysfs
from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout.vgpu_layout import LayoutError
from ansible_collections.accelops.vgpu.plugins.module_utils.runner import CommandRunner

GPU0, GPU1 = "0000:41:00.0", "0000:42:00.0"
VDM = {"version": "v1", "vgpu-configs": {"default": [{"devices": "all", "vgpu-devices": {"L40S-24Q": 2}}]}}


def engine_for(node, monkeypatch, tmp_path):
    for name in ("PATH", "GPUSIM_ROOT"):
        monkeypatch.setenv(name, node.env[name])
    engine = vgpu_apply.NodeEngine(Sysfs(node.root), CommandRunner(), node.dev_root, "/proc", cache_dir=str(tmp_path),
                                   kubelet_dir=str(tmp_path / "kubelet"))
    return engine


@pytest.fixture
def l40s(gpusim_node, monkeypatch, tmp_path):
    node = gpusim_node("l40s:2")
    engine = engine_for(node, monkeypatch, tmp_path)
    vgpu_apply.apply(engine, vgpu_layout.from_layout([{"profiles": {}}]), enable_vfs=True)
    node.clear_log()
    return node, engine


def declare(document):
    return claim_time_layout.declaration(document, "config.yaml")


def apply(engine, document):
    engine.claim_time_declaration = declare(document)
    return vgpu_apply.apply(engine, vgpu_layout.from_document(document, "default", "config.yaml"))


def type_writes(node):
    return [(w["path"].split("/")[3], w["value"]) for w in node.log() if w["path"].endswith("current_vgpu_type")]


def test_vdm_document_with_claim_time_key_parses_and_the_layout_ignores_it():
    doc = dict(VDM, **{"claim-time": [{"devices": [1], "profiles": ["L40S-24Q", "NVIDIA L40S-12Q"]}]})
    assert [e.profiles for e in vgpu_layout.from_document(doc, "default")] == [{"L40S-24Q": 2}]
    found = declare(doc)
    assert [(e.devices, e.profiles) for e in found.entries] == [((1,), ("L40S-24Q", "L40S-12Q"))]
    simple = {"layout": [{"devices": [GPU0], "profiles": {"L40S-24Q": 2}}], "claim_time": [{"devices": [GPU1]}]}
    assert len(vgpu_layout.from_document(simple)) == 1
    assert declare(simple).entries[0].profiles is None
    assert not declare(VDM)


@pytest.mark.parametrize("entry, message", [
    ({"devices": [1], "profiles": ["nonsense"]}, "config.yaml: claim-time[0]: 'nonsense' is not a vGPU profile name"),
    ({"devices": [1], "profiles": ["H100-1-10C", "H100-20Q"]},
     "config.yaml: claim-time[0]: profiles mix MIG-backed and time-sliced profiles"),
    ({"devices": [1], "profiles": []}, "config.yaml: claim-time[0]: profiles must be a non-empty list"),
    ({"profiles": ["L40S-24Q"]}, "config.yaml: claim-time[0]: devices is required"),
    ({"devices": [1], "bogus": 1}, "config.yaml: claim-time[0]: unknown field(s) 'bogus'"),
])
def test_a_bad_declaration_is_one_line_naming_the_entry(entry, message):
    with pytest.raises(LayoutError) as err:
        declare(dict(VDM, **{"claim-time": [entry]}))
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_reconcile_never_writes_a_claim_time_gpu_and_publishes_its_offers(l40s):
    node, engine = l40s
    result = apply(engine, dict(VDM, **{"claim-time": [{"devices": [1], "profiles": ["L40S-24Q", "L40S-12Q"]}]}))
    assert [gpu["address"] for gpu in result["gpus"]] == [GPU0]
    assert {vf for vf, dummy in type_writes(node)} == {"0000:41:00.4", "0000:41:00.5"}
    [ct] = result["claim_time"]
    assert ct["address"] == GPU1 and ct["model"] and ct["vfs"] == 32
    assert [(p["profile"], p["max_instances"], p["size_mib"]) for p in ct["profiles"]] == [
        ("L40S-24Q", 2, 24576), ("L40S-12Q", 4, 12288)]
    with open(engine.modes_file) as handle:
        assert json.load(handle) == {"gpus": [GPU1]}
    node.clear_log()
    again = apply(engine, dict(VDM, **{"claim-time": [{"devices": [1]}]}))
    assert type_writes(node) == [] and not again["changed"]
    profiles = [p["profile"] for p in again["claim_time"][0]["profiles"]]
    assert "L40S-48Q" in profiles and "L40S-24Q" in profiles and all(p.endswith("Q") for p in profiles)


def test_an_allowed_profile_the_gpu_lacks_is_one_line_naming_gpu_and_profile(l40s):
    node, engine = l40s
    with pytest.raises(LayoutError) as err:
        apply(engine, dict(VDM, **{"claim-time": [{"devices": [1], "profiles": ["A16-8Q"]}]}))
    assert str(err.value).startswith("GPU %s (L40S): claim-time profile A16-8Q is a profile of A16 GPUs" % GPU1)
    assert node.log() == []


def test_a_held_vf_stops_a_move_into_claim_time_mode_and_a_free_gpu_moves_with_its_types_cleared(l40s):
    node, engine = l40s
    apply(engine, VDM)   # both GPUs label-driven: 2 x 24Q each
    node.hold("0000:42:00.4")
    node.clear_log()
    doc = dict(VDM, **{"claim-time": [{"devices": [1]}]})
    with pytest.raises(LayoutError) as err:
        apply(engine, doc)
    assert str(err.value).startswith("GPU %s: cannot move into claim-time mode while VF 0000:42:00.4 is held by pid"
                                     % GPU1)
    assert node.log() == []
    node.release("0000:42:00.4")
    result = apply(engine, doc)
    assert sorted(type_writes(node)) == [("0000:42:00.4", "0"), ("0000:42:00.5", "0")]
    assert result["changed"] and result["claim_time"][0]["address"] == GPU1


def test_the_boot_unit_without_a_declaration_keeps_the_agents_claim_time_gpus(l40s, tmp_path):
    node, engine = l40s
    apply(engine, dict(VDM, **{"claim-time": [{"devices": [1]}]}))
    node.clear_log()
    engine.claim_time_declaration = None   # the node CLI / boot unit: declares nothing
    vgpu_apply.apply(engine, vgpu_layout.from_document(VDM, "default"))
    assert all(vf.startswith("0000:41:") for vf, dummy in type_writes(node)) and type_writes(node) == []


def test_max_instances_are_read_from_nvidia_smi_verbose_output():
    text = ("GPU 00000000:41:00.0\n    vGPU Type ID : 0x483\n        Name : NVIDIA L40S-24Q\n"
            "        Max Instances : 2\n    vGPU Type ID : 0x481\n        Name : NVIDIA L40S-12Q\n"
            "        Max Instances : 4\n        Max Instances Per GI : 1\n    vGPU Type ID : junk\n")
    assert claim_time_layout.parse_max_instances(text) == {0x483: 2, 0x481: 4}


def test_a_claim_time_gpu_passed_through_is_reserved_offers_nothing_and_is_never_written(
        gpusim_node, monkeypatch, tmp_path):
    node = gpusim_node("l40s:2")
    engine = engine_for(node, monkeypatch, tmp_path)
    vgpu_apply.apply(engine, vgpu_layout.from_layout([{"devices": [GPU0], "profiles": {}}]), enable_vfs=True)
    node.bind(GPU1, "vfio-pci")          # reserved for whole-GPU passthrough (driverctl)
    node.clear_log()
    doc = dict(VDM, **{"claim-time": [{"devices": "all", "profiles": ["L40S-24Q"]}]})
    result = apply(engine, doc)
    reason = ("bound to vfio-pci, not to the vGPU host driver nvidia (reserved for whole-GPU passthrough); as a "
              "claim-time GPU it offers no vGPU")
    assert result["reserved"] == [{"address": GPU1, "driver": "vfio-pci", "reason": reason}]
    by_address = {gpu["address"]: gpu for gpu in result["claim_time"]}
    assert by_address[GPU1]["profiles"] == [] and by_address[GPU1]["reserved"] == reason
    assert [p["profile"] for p in by_address[GPU0]["profiles"]] == ["L40S-24Q"]
    assert not any(GPU1[:7] in w["path"] for w in node.log())
    assert claim_time.gpus_of(claim_time.offers(engine.sysfs, result["claim_time"])) == {GPU0}


def test_after_a_reboot_apply_enables_a_claim_time_gpus_vfs_and_offers_it_check_mode_alike(l40s):
    """Issue 40 item 3: the boot unit (no declaration: the modes file says which GPUs are claim-time) and the agent
    (its declaration) enable the VFs of claim-time GPUs a reboot left without; no type is written to them."""
    node, engine = l40s
    apply(engine, dict(VDM, **{"claim-time": [{"devices": "all", "profiles": ["L40S-24Q"]}]}))
    node.ctl("reboot")
    node.clear_log()
    engine.claim_time_declaration = None                    # as the node CLI / boot unit runs it
    layout = vgpu_layout.from_document(VDM, "default")
    assert vgpu_apply.check(engine, layout) == ["GPU %s: claim-time mode: SR-IOV VFs are not enabled" % gpu
                                                for gpu in (GPU0, GPU1)]
    checked = vgpu_apply.apply(engine, layout, enable_vfs=True, check_mode=True)
    assert node.log() == [] and checked["changed"] and checked["claim_time"][0]["vfs"] == 0
    result = vgpu_apply.apply(engine, layout, enable_vfs=True)
    assert result["vfs_enabled"] == [GPU0, GPU1] and result["changed"] and result["gpus"] == []
    assert result["diff"] == checked["diff"]
    assert result["diff"]["after"][GPU1] == {"vfs": "enabled", "claim_time": True}
    # the boot unit knows the GPU, not the allow-list (the agent's): every Q profile; the agent publishes offers
    offered = result["claim_time"][1]
    assert offered["vfs"] == 32 and ("L40S-24Q", 2) in [(p["profile"], p["max_instances"]) for p in offered["profiles"]]
    assert type_writes(node) == []
    assert not vgpu_apply.apply(engine, layout, enable_vfs=True)["changed"]
    assert vgpu_apply.check(engine, layout) == []


def test_without_enable_vfs_a_claim_time_gpu_without_vfs_is_a_warning_and_nothing_is_written(l40s):
    node, engine = l40s
    doc = dict(VDM, **{"claim-time": [{"devices": "all"}]})
    apply(engine, doc)
    node.ctl("reboot")
    node.clear_log()
    result = apply(engine, doc)     # the module without enable_vfs
    assert not result["changed"] and node.log() == [] and result["vfs_enabled"] == []
    assert "GPU %s: claim-time mode: SR-IOV VFs are not enabled" % GPU0 in result["warnings"][0]
