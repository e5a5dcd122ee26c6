"""A layout for GPUs whose VFs are not enabled is validated before the first write (gpusim): the
driver's supported list, else the catalog, else fail closed; check mode gives the same verdict."""

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout import layout_fit
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import vgpu_apply
from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout.vgpu_layout import (
    LayoutError, from_layout, from_vdm_config, nvidia_gpus)
from ansible_collections.accelops.vgpu.plugins.module_utils.runner import CommandRunner
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import Sysfs

PF = "0000:41:00.0"
REJECTED = [
    ("three-24q-on-48gb", [{"devices": [PF], "profiles": {"L40S-24Q": 3}}], "need 72 GB of framebuffer, the GPU has 48 GB"),
    ("other-model", [{"devices": [PF], "profiles": {"A16-4Q": 1}}], "A16-4Q (layout[0]) is a profile of A16 GPUs"),
    ("unknown-size", [{"devices": [PF], "profiles": {"L40S-7Q": 1}}], "L40S-7Q (layout[0]) is not a vGPU type"),
    ("mixed-sizes", [{"devices": [PF], "profiles": {"L40S-24Q": 1, "L40S-12Q": 1}}], "different framebuffer sizes"),
    ("above-one-per-vf", [{"devices": [PF], "profiles": {"L40S-1Q": 33}}],
     "33 vGPUs requested (33 x L40S-1Q) but the GPU has only 32 slots"),
]


class NoSmi(CommandRunner):
    """A node whose nvidia-smi is missing (the driver cannot list types)."""

    def which(self, name, extra_paths=()):
        return None if name == "nvidia-smi" else super().which(name, extra_paths)


def engine(node, monkeypatch, tmp_path, runner=None):
    for name in ("PATH", "GPUSIM_ROOT"):
        monkeypatch.setenv(name, node.env[name])
    return vgpu_apply.NodeEngine(Sysfs(node.root), runner or CommandRunner(), node.dev_root, "/proc", cache_dir=str(tmp_path))


@pytest.fixture
def fresh(gpusim_node, monkeypatch, tmp_path):
    """One L40S without VFs (every test gets its own node: a failing case must leave it untouched)."""
    node = gpusim_node("l40s:1", fresh=True)
    return node, engine(node, monkeypatch, tmp_path)


@pytest.mark.parametrize("layout,message", [pytest.param(l, m, id=i) for i, l, m in REJECTED])
@pytest.mark.parametrize("check_mode", [False, True], ids=["apply", "check"])
def test_a_layout_that_cannot_fit_writes_nothing_not_even_the_vfs(fresh, layout, message, check_mode):
    node, eng = fresh
    with pytest.raises(LayoutError) as err:
        vgpu_apply.apply(eng, from_layout(layout), enable_vfs=True, check_mode=check_mode)
    assert message in str(err.value) and PF in str(err.value) and "\n" not in str(err.value)
    assert node.log() == [] and node.state()["pfs"][0]["numvfs"] == 0
    assert node.state()["pfs"][0]["driver"] == "nvidia"  # sriov-manage never ran (it rebinds the PF)


def test_a_fitting_layout_is_validated_then_applied(fresh):
    node, eng = fresh
    layout = [{"devices": [PF], "profiles": {"L40S-24Q": 2}}]
    check = vgpu_apply.apply(eng, from_layout(layout), enable_vfs=True, check_mode=True)
    assert node.log() == [] and "validated" not in " ".join(check["warnings"])  # apply's own wording
    result = vgpu_apply.apply(eng, from_layout(layout), enable_vfs=True)
    assert result["vfs_enabled"] == [PF] and vgpu_apply.check(eng, from_layout(layout)) == []


def test_vdm_entry_choice_holds_before_the_vfs_exist(fresh):
    """VDM's default config lists A16 and A2 profiles for one PCI ID; here L40S then a profile it lacks."""
    node, eng = fresh
    config = {"version": "v1", "vgpu-configs": {"default": [
        {"devices": "all", "vgpu-devices": {"L40S-24Q": 2}}, {"devices": "all", "vgpu-devices": {"A16-4Q": 4}}]}}
    result = vgpu_apply.apply(eng, from_vdm_config(config, "default"), enable_vfs=True, check_mode=True)
    assert result["diff"]["after"][PF] == {"vfs": "enabled", "profiles": {"L40S-24Q": 2}} and node.log() == []


def test_without_nvidia_smi_the_catalog_decides(fresh, monkeypatch, tmp_path):
    node, dummy = fresh
    eng = engine(node, monkeypatch, tmp_path / "no-smi", NoSmi())
    offer = layout_fit.offer_of(eng.sysfs, nvidia_gpus(eng.sysfs)[0], eng.names)
    assert offer.source == layout_fit.CATALOG and offer.framebuffer_gb == 48 and offer.slots == 32
    with pytest.raises(LayoutError, match="need 72 GB of framebuffer, the GPU has 48 GB"):
        vgpu_apply.apply(eng, from_layout(REJECTED[0][1]), enable_vfs=True, check_mode=True)
    assert node.log() == []


def test_the_driver_list_is_preferred_to_the_catalog(fresh):
    node, eng = fresh
    offer = layout_fit.offer_of(eng.sysfs, nvidia_gpus(eng.sysfs)[0], eng.names)
    assert offer.source == layout_fit.DRIVER and len(offer.types) == 23 and offer.framebuffer_gb == 48


def test_a_gpu_neither_the_driver_nor_the_catalog_knows_fails_closed(gpusim_node, monkeypatch, tmp_path):
    node = gpusim_node("h200:1", fresh=True)
    eng = engine(node, monkeypatch, tmp_path, NoSmi())
    with pytest.raises(LayoutError) as err:
        vgpu_apply.apply(eng, from_layout([{"profiles": {"H200X-70C": 2}}]), enable_vfs=True)
    assert str(err.value).startswith("GPU %s (PCI ID 10de:2335): cannot check the layout before its VFs are enabled"
                                     % PF)
    assert node.log() == []


def test_catalog_types_are_named_like_the_driver():
    names = [t.name for t in layout_fit.catalog_types("H100", {"C": (40, 80)})]
    assert names == ["NVIDIA H100-40C", "NVIDIA H100-80C"]
