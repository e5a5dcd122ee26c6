"""The vendor-VFIO backend on plain-file trees: planning rules and the write step.

The trees show what the driver shows (brief 1.3/1.4): a VF with a type lists nothing creatable,
free VFs list what still fits. The shrinking lists themselves are exercised against gpusim in
tests/integration.
"""

import pytest

from fake_node import FakeNode, RecordingSysfs

from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import inuse
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import vgpu_vfio
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import Sysfs
from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout.vgpu_layout import LayoutError, from_layout, nvidia_gpus
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.vgpu_types import VgpuType

PF = "0000:41:00.0"
L40S = [VgpuType(1145, "NVIDIA L40S-1B"), VgpuType(1152, "NVIDIA L40S-8Q"), VgpuType(1153, "NVIDIA L40S-12Q"),
        VgpuType(1155, "NVIDIA L40S-24Q"), VgpuType(1156, "NVIDIA L40S-48Q")]
BY_NAME = dict((t.short, t) for t in L40S)


def size(vgpu_type):
    return int(vgpu_type.short.split("-")[1][:-1])


class L40sNode:
    def __init__(self, tmp_path, vfs=4):
        self.node = FakeNode(tmp_path)
        self.node.pf(PF)
        self.vfs = self.node.set_numvfs(PF, vfs)
        self.sysfs = Sysfs(str(self.node.sys))
        self.set_types({})

    def set_types(self, types):
        """VF -> short name; free VFs list the types of the same size that still fit (homogeneous mode)."""
        sizes = [size(BY_NAME[name]) for name in types.values()]
        fits = [t for t in L40S if (not sizes or size(t) in sizes) and sum(sizes) + size(t) <= 48]
        for vf in self.vfs:
            name = types.get(vf)
            self.node.set_type(vf, BY_NAME[name].type_id if name else 0)
            listed = [] if name else fits
            text = "ID    : vGPU Name\n" + "".join("%d  : %s\n" % t for t in listed)
            (self.node.dir(vf) / "nvidia/creatable_vgpu_types").write_text(text)

    def hold(self, vf):
        return self.node.hold("devices/vfio%d" % (self.vfs.index(vf) + 1))

    def view(self, names=None):
        held = inuse.held_devices(self.sysfs, str(self.node.dev), str(self.node.proc))
        return vgpu_vfio.VfioGpu(self.sysfs, nvidia_gpus(self.sysfs)[0], held, names)

    def plan(self, profiles, names=None, **kwargs):
        view = self.view(names)
        return view, vgpu_vfio.plan(view, from_layout([{"profiles": profiles}]), **kwargs)


def remembered(pf):
    """A type-name source that knows every L40S type (the node cache or nvidia-smi)."""
    assert pf == PF
    return list(L40S), True


def seen_collapsed(pf):
    """A cache filled from collapsed lists: it names 12Q but cannot tell the GPU's framebuffer."""
    assert pf == PF
    return [BY_NAME["L40S-12Q"]], False


def forgotten(pf):
    """A type-name source that knows nothing."""
    assert pf == PF
    return [], False


def slots(plan):
    return [(v.address, v.before and v.before.short, v.after and v.after.short) for v in plan.vgpus]


def test_free_vfs_are_filled_in_vf_order(tmp_path):
    gpu = L40sNode(tmp_path)
    dummy, plan = gpu.plan({"L40S-24Q": 2})
    assert plan.steps == [("set", gpu.vfs[0], 1155), ("set", gpu.vfs[1], 1155)]
    assert slots(plan)[:3] == [(gpu.vfs[0], None, "L40S-24Q"), (gpu.vfs[1], None, "L40S-24Q"), (gpu.vfs[2], None, None)]
    assert plan.model == "L40S" and plan.framework == "vendor-vfio"


def test_a_node_that_matches_plans_nothing(tmp_path):
    gpu = L40sNode(tmp_path)
    gpu.set_types({gpu.vfs[0]: "L40S-24Q", gpu.vfs[1]: "L40S-24Q"})
    dummy, plan = gpu.plan({"L40S-24Q": 2}, names=remembered)
    assert plan.steps == [] and not plan.changed


def test_a_consumed_type_id_nobody_can_name_is_an_error(tmp_path):
    gpu = L40sNode(tmp_path)
    gpu.set_types({gpu.vfs[0]: "L40S-24Q", gpu.vfs[1]: "L40S-24Q"})
    with pytest.raises(LayoutError) as err:
        gpu.plan({"L40S-24Q": 2}, names=forgotten)
    assert str(err.value).startswith("VF %s of GPU %s has vGPU type ID 1155" % (gpu.vfs[0], PF))


def test_the_framebuffer_check_needs_a_complete_catalog(tmp_path):
    gpu = L40sNode(tmp_path, vfs=8)
    gpu.set_types({gpu.vfs[0]: "L40S-12Q"})
    dummy, plan = gpu.plan({"L40S-12Q": 4}, names=seen_collapsed)
    assert len(plan.steps) == 3
    with pytest.raises(LayoutError) as err:
        gpu.plan({"L40S-12Q": 5}, names=remembered)
    assert "5 x L40S-12Q need 60 GB of framebuffer, the GPU has 48 GB" in str(err.value)


def test_changing_size_clears_only_what_it_must_then_fills(tmp_path):
    gpu = L40sNode(tmp_path)
    gpu.set_types({gpu.vfs[0]: "L40S-24Q", gpu.vfs[1]: "L40S-24Q"})
    dummy, plan = gpu.plan({"L40S-12Q": 4}, names=remembered)
    assert plan.steps == [("clear", gpu.vfs[0], 0), ("clear", gpu.vfs[1], 0)] + [
        ("set", vf, 1153) for vf in gpu.vfs]


def test_a_held_vf_that_must_change_fails_naming_it(tmp_path):
    gpu = L40sNode(tmp_path)
    gpu.set_types({gpu.vfs[0]: "L40S-24Q", gpu.vfs[1]: "L40S-24Q"})
    pid = gpu.hold(gpu.vfs[1])
    with pytest.raises(LayoutError) as err:
        gpu.plan({"L40S-12Q": 4}, names=remembered)
    assert str(err.value) == ("VF %s of GPU %s is held by a VM (pid %d) and has L40S-24Q; the layout needs it "
                              "changed" % (gpu.vfs[1], PF, pid))


def test_a_held_vf_with_a_wanted_type_is_kept_first(tmp_path):
    gpu = L40sNode(tmp_path)
    gpu.set_types({gpu.vfs[0]: "L40S-24Q", gpu.vfs[1]: "L40S-24Q"})
    gpu.hold(gpu.vfs[1])
    dummy, plan = gpu.plan({"L40S-24Q": 1}, names=remembered)
    assert plan.steps == [("clear", gpu.vfs[0], 0)]


def test_mixed_sizes_need_mixed_size(tmp_path):
    gpu = L40sNode(tmp_path)
    with pytest.raises(LayoutError) as err:
        gpu.plan({"L40S-24Q": 1, "L40S-12Q": 2})
    assert "GPU %s: profiles L40S-12Q and L40S-24Q have different framebuffer sizes" % PF in str(err.value)
    dummy, plan = gpu.plan({"L40S-24Q": 1, "L40S-12Q": 2}, mixed_size=True)
    assert [s[2] for s in plan.steps] == [1155, 1153, 1153] and plan.mixed_size


@pytest.mark.parametrize("profiles,message", [
    ({"L40S-24Q": 3}, "3 x L40S-24Q need 72 GB of framebuffer, the GPU has 48 GB"),
    ({"L40S-1B": 5}, "GPU 0000:41:00.0: no free VF left for L40S-1B (4 VFs, 0 held by VMs)"),
    ({"A16-8Q": 1}, "profile A16-8Q (layout[0]) is a profile of A16 GPUs, not of this L40S"),
    ({"L40S-7Q": 1}, "profile L40S-7Q (layout[0]) is not a vGPU type this GPU offers"),
])
def test_impossible_layouts_fail_before_writing(tmp_path, profiles, message):
    gpu = L40sNode(tmp_path)
    with pytest.raises(LayoutError) as err:
        gpu.plan(profiles)
    assert message in str(err.value) and gpu.sysfs.writes == 0


def test_absent_clears_all_but_held_vfs(tmp_path):
    gpu = L40sNode(tmp_path)
    gpu.set_types({gpu.vfs[0]: "L40S-24Q", gpu.vfs[1]: "L40S-24Q"})
    gpu.hold(gpu.vfs[0])
    dummy, plan = gpu.plan({}, names=forgotten, absent=True)
    assert plan.steps == [("clear", gpu.vfs[1], 0)]
    assert "VF %s of GPU %s is held by a VM" % (gpu.vfs[0], PF) in plan.warnings[0]


def test_execute_writes_ids_and_the_view_follows_the_writes(tmp_path):
    gpu = L40sNode(tmp_path)
    view, plan = gpu.plan({"L40S-24Q": 2})
    vgpu_vfio.execute(gpu.sysfs, view, plan)
    assert gpu.sysfs.write_log == [("bus/pci/devices/%s/nvidia/current_vgpu_type" % vf, "1155")
                                   for vf in gpu.vfs[:2]]
    assert vgpu_vfio.current_profiles(view) == {"L40S-24Q": 2}
    assert vgpu_vfio.current_profiles(gpu.view(remembered)) == {"L40S-24Q": 2}


def test_a_type_that_stopped_being_creatable_stops_the_apply(tmp_path):
    # a GPU with vGPUs already: what stays creatable is not predictable, so each list is re-read
    gpu = L40sNode(tmp_path)
    gpu.set_types({gpu.vfs[0]: "L40S-12Q"})
    view, plan = gpu.plan({"L40S-12Q": 3}, names=remembered)
    assert not vgpu_vfio.predictable(view, plan)
    (gpu.node.dir(gpu.vfs[2]) / "nvidia/creatable_vgpu_types").write_text("ID : vGPU Name\n1145 : NVIDIA L40S-1B\n")
    with pytest.raises(LayoutError) as err:
        vgpu_vfio.execute(gpu.sysfs, view, plan)
    assert str(err.value) == ("VF %s of GPU %s: L40S-12Q (ID 1153) is not creatable now (creatable: L40S-1B)"
                              % (gpu.vfs[2], PF))
    assert gpu.sysfs.writes == 1


def test_a_refused_write_names_the_errno_and_what_the_vf_offers(tmp_path):
    # a GPU without vGPUs getting one size: predictable, the driver's own check stands in for a re-read
    gpu = L40sNode(tmp_path)
    view, plan = gpu.plan({"L40S-24Q": 2})
    assert vgpu_vfio.predictable(view, plan)
    type_file = gpu.node.dir(gpu.vfs[1]) / "nvidia/current_vgpu_type"
    type_file.unlink()
    type_file.mkdir()  # open(O_WRONLY) fails with EISDIR, as a driver refusal fails the write(2)
    (gpu.node.dir(gpu.vfs[1]) / "nvidia/creatable_vgpu_types").write_text("ID : vGPU Name\n1145 : NVIDIA L40S-1B\n")
    sysfs = RecordingSysfs(gpu.sysfs.root)
    with pytest.raises(LayoutError) as err:
        vgpu_vfio.execute(sysfs, view, plan)
    assert str(err.value) == ("VF %s of GPU %s: L40S-24Q (ID 1155) is not creatable now (the driver refused it: "
                              "write bus/pci/devices/%s/nvidia/current_vgpu_type: Is a directory (EISDIR); "
                              "creatable: L40S-1B)" % (gpu.vfs[1], PF, gpu.vfs[1]))
    assert sysfs.write_log == [("bus/pci/devices/%s/nvidia/current_vgpu_type" % gpu.vfs[0], "1155")]
    assert sysfs.reads == ["bus/pci/devices/%s/nvidia/creatable_vgpu_types" % gpu.vfs[1]]
    assert view.current[gpu.vfs[0]] == 1155 and view.current[gpu.vfs[1]] == 0


def test_several_sizes_or_set_vgpus_make_execute_reread_each_list(tmp_path):
    gpu = L40sNode(tmp_path)
    view, plan = gpu.plan({"L40S-24Q": 1, "L40S-12Q": 2}, mixed_size=True)
    assert not vgpu_vfio.predictable(view, plan)
    sysfs = RecordingSysfs(gpu.sysfs.root)
    vgpu_vfio.execute(sysfs, view, plan)
    assert sysfs.reads == ["bus/pci/devices/%s/nvidia/creatable_vgpu_types" % vf for vf in gpu.vfs[:3]]


def test_a_gpu_offering_its_whole_framebuffer_type_has_no_vgpu_to_read(tmp_path):
    gpu = L40sNode(tmp_path)
    sysfs = RecordingSysfs(gpu.sysfs.root)
    gpu_info = nvidia_gpus(sysfs)[0]
    sysfs.reads = []
    view = vgpu_vfio.VfioGpu(sysfs, gpu_info, {}, remembered, known_types=list(L40S))
    first = "bus/pci/devices/%s/nvidia/" % gpu.vfs[0]
    assert [read for read in sysfs.reads if "/nvidia/" in read] == [first + "current_vgpu_type", first + "creatable_vgpu_types"]
    assert view.all_free and view.lists_complete and view.current == dict((vf, 0) for vf in gpu.vfs)


def test_set_ids_the_node_cache_names_need_no_other_list(tmp_path):
    gpu = L40sNode(tmp_path)
    gpu.set_types({gpu.vfs[0]: "L40S-24Q", gpu.vfs[1]: "L40S-24Q"})
    sysfs = RecordingSysfs(gpu.sysfs.root)
    gpu_info = nvidia_gpus(sysfs)[0]
    sysfs.reads = []
    view = vgpu_vfio.VfioGpu(sysfs, gpu_info, {}, forgotten, known_types=list(L40S))
    assert [r for r in sysfs.reads if r.endswith("creatable_vgpu_types")] == [
        "bus/pci/devices/%s/nvidia/creatable_vgpu_types" % gpu.vfs[0]]
    assert view.complete and view.total_gb() == 48 and vgpu_vfio.current_profiles(view) == {"L40S-24Q": 2}
    # an ID the cache does not name: every list is read, as without a cache
    sysfs.reads = []
    vgpu_vfio.VfioGpu(sysfs, gpu_info, {}, remembered, known_types=[BY_NAME["L40S-12Q"]])
    assert len([r for r in sysfs.reads if r.endswith("creatable_vgpu_types")]) == len(gpu.vfs)


@pytest.mark.parametrize("known,vgpu_on_third", [
    (None, False),                                    # nothing cached: no way to tell
    (list(L40S), True),                               # a vGPU on VF 2: 48Q is gone from VF 0's list
    ([VgpuType(1156, "NVIDIA L40S-32Q")], False),     # a cached ID that now means another type
])
def test_without_the_whole_gpu_type_in_the_list_every_vf_is_read(tmp_path, known, vgpu_on_third):
    gpu = L40sNode(tmp_path)
    if vgpu_on_third:
        gpu.set_types({gpu.vfs[2]: "L40S-24Q"})
    sysfs = RecordingSysfs(gpu.sysfs.root)
    gpu_info = nvidia_gpus(sysfs)[0]
    sysfs.reads = []
    view = vgpu_vfio.VfioGpu(sysfs, gpu_info, {}, remembered, known_types=known)
    assert not view.all_free
    assert [r for r in sysfs.reads if r.endswith("current_vgpu_type")] == [
        "bus/pci/devices/%s/nvidia/current_vgpu_type" % vf for vf in gpu.vfs]
    assert view.current[gpu.vfs[2]] == (1155 if vgpu_on_third else 0)


def test_no_vfs_is_a_clear_error(tmp_path):
    gpu = L40sNode(tmp_path, vfs=0)
    with pytest.raises(LayoutError) as err:
        gpu.plan({"L40S-24Q": 2})
    assert "SR-IOV VFs are not enabled" in str(err.value)
