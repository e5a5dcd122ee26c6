"""node/engine/mig.py: names, nvidia-smi parsers, planning of MIG mode and GPU instances, execution order."""

from collections import OrderedDict, namedtuple

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import mig
from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout.vgpu_layout import (
    GpuPlan, LayoutEntry, LayoutError, VgpuChange)
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.vgpu_types import VgpuType

PF = "0000:41:00.0"
VFS = ["0000:41:00.%d" % f for f in range(4, 8)]
T_1_10C, T_1_20C = VgpuType(1118, "NVIDIA H100-1-10C"), VgpuType(1120, "NVIDIA H100-1-20C")
T_3_40C = VgpuType(1122, "NVIDIA H100-3-40C")
T_7_80C, T_40C = VgpuType(1124, "NVIDIA H100-7-80C"), VgpuType(1116, "NVIDIA H100-40C")
MIG_TYPES = {1118: mig.MigType(1118, "NVIDIA H100-1-10C", 19), 1120: mig.MigType(1120, "NVIDIA H100-1-20C", 15),
             1122: mig.MigType(1122, "NVIDIA H100-3-40C", 9), 1124: mig.MigType(1124, "NVIDIA H100-7-80C", 0)}

SUPPORTED = """GPU 00000000:41:00.0
    vGPU Type ID                          : 0x460
        Name                              : NVIDIA H100-1-20C
        Max Instances                     : 4
        FB Memory                         : 20480 MiB
        GPU Instance Profile ID           : 15
        Max Instances Per GI              : 1
    vGPU Type ID                          : 0x45c
        Name                              : NVIDIA H100-40C
        Max Instances                     : 2
"""
LGI = """+-------------------------------------------------------+
| GPU instances:                                        |
| GPU   Name             Profile  Instance   Placement  |
|                          ID       ID       Start:Size |
|=======================================================|
|   0  MIG 1g.20gb          15        1        0:2      |
+-------------------------------------------------------+
|   0  MIG 1g.20gb+me       20        7        6:1      |
+-------------------------------------------------------+
"""
LGIP = """|=============================================================================|
|   0  MIG 1g.10gb        19     5/7       9.70       No     16     0     0   |
|                                                             1     0     0   |
+-----------------------------------------------------------------------------+
|   0  MIG 3g.40gb         9     1/2       38.80      No     48     0     0   |
"""
LGIPP = "GPU  0 Profile ID 19 Placements: {0,1,2,3,4,5,6}:1\nGPU  0 Profile ID  9 Placement : {0,4}:4\n"


def test_names_and_kinds():
    assert mig.gi_profile_name("H100-1-20C") == "1g.20gb"
    assert mig.gi_profile_name("NVIDIA H100-1-10CME") == "1g.10gb+me"
    assert mig.gi_profile_name("DC-1-24QGFX") == "1g.24gb+gfx" and mig.gi_profile_name("A100-1-5CNOME") == "1g.5gb-me"
    assert mig.gi_profile_name("H200X-7-141C") == "7g.141gb"
    assert mig.mig_backed("H200X-1-18C") and not mig.mig_backed("H100-40C") and not mig.mig_backed("junk")
    entry = LayoutEntry("cfg[0]", None, (), OrderedDict([("H100-3-40C", 1), ("H100-40C", 1)]), False)
    with pytest.raises(LayoutError, match="^GPU 0000:41:00.0: cfg\\[0\\] mixes MIG-backed H100-3-40C and "
                                          "time-sliced H100-40C; a GPU carries one kind of vGPU$"):
        mig.check_kinds(PF, [entry])
    other_models = LayoutEntry("cfg[1]", None, (), OrderedDict([("H100-3-40C", 1), ("L40S-24Q", 1)]), False)
    mig.check_kinds(PF, [other_models])   # different models: each GPU takes its own


def test_options_are_checked():
    assert mig.MigOptions() == ("after-vfs", True, "destroy")
    with pytest.raises(LayoutError, match="MIG mode order 'first'"):
        mig.MigOptions(mode_order="first")
    with pytest.raises(LayoutError, match="cleanup 'never'"):
        mig.MigOptions(gi_cleanup="never")


def test_parsers():
    assert mig.parse_supported(SUPPORTED) == [mig.MigType(0x460, "NVIDIA H100-1-20C", 15)]
    assert mig.parse_instances(LGI) == [mig.GpuInstance(1, 15, "1g.20gb", 0, 2), mig.GpuInstance(7, 20, "1g.20gb+me", 6, 1)]
    assert mig.parse_profiles(LGIP) == OrderedDict([(19, ("1g.10gb", 5, 7)), (9, ("3g.40gb", 1, 2))])
    assert mig.parse_placements(LGIPP) == {19: (1, (0, 1, 2, 3, 4, 5, 6)), 9: (4, (0, 4))}
    assert [mig.parse_mode(t) for t in ("Enabled\n", "Disabled", "[N/A]")] == [True, False, None]
    with pytest.raises(LayoutError, match="cannot read the MIG mode"):
        mig.parse_mode("Pending")


class FakeRunner:
    """nvidia-smi answers by argument tuple; records every call."""

    def __init__(self, answers):
        self.answers, self.calls = answers, []

    def which(self, name):
        return "/usr/bin/" + name

    def run(self, argv, check=True):
        self.calls.append(argv[1:])
        return self.answers.get(tuple(argv[1:]), (0, "", ""))


View = namedtuple("View", "gpu held")
Gpu = namedtuple("Gpu", "address")


def state(mode, gis=(), vf_gi=None, options=None):
    result = mig.MigPlan(PF, mode, list(gis), options or mig.MigOptions())
    result.types = dict(MIG_TYPES)
    result.vf_gi = dict(vf_gi or {})
    return result


def gpu_plan(changes):
    plan = GpuPlan(PF, "vendor-vfio", "H100", "10de:2331")
    plan.vgpus = [VgpuChange(vf, before, after) for vf, before, after in changes]
    return plan


def test_fresh_gpu_gets_mode_and_one_gi_per_vgpu_largest_first():
    smi = mig.Smi(FakeRunner({}))
    plan = gpu_plan([(VFS[0], None, T_3_40C), (VFS[1], None, T_1_10C), (VFS[2], None, T_1_10C)])
    result = mig.plan(state(False), plan, View(Gpu(PF), {}), smi)
    assert result.steps() == [("mig-mode", PF, 1), ("mig-gi-create", PF, 9), ("mig-gi-create", PF, 19),
                              ("mig-gi-create", PF, 19)]
    assert plan.steps == result.steps() and plan.mig is result
    assert result.state(False) == {"mode": "disabled", "gpu_instances": []}
    assert result.state(True) == {"mode": "enabled", "gpu_instances": ["1g.10gb", "1g.10gb", "3g.40gb"]}
    assert smi.runner.calls == []          # MIG mode off: Hopper geometry, no -lgipp


def test_held_vf_blocks_switching_mig_mode():
    plan = gpu_plan([(VFS[0], None, T_1_20C)])
    with pytest.raises(LayoutError, match="^GPU 0000:41:00.0: MIG mode must be enabled for H100-1-20C, but VF "
                                          "0000:41:00.7 is held by a VM \\(pid 42\\)$"):
        mig.plan(state(False), plan, View(Gpu(PF), {VFS[3]: [42]}), mig.Smi(FakeRunner({})))


def test_kept_vgpus_keep_their_gi_free_ones_are_reused_the_rest_destroyed():
    gis = [mig.GpuInstance(1, 15, "1g.20gb", 0, 2), mig.GpuInstance(2, 15, "1g.20gb", 2, 2),
           mig.GpuInstance(3, 15, "1g.20gb", 4, 2), mig.GpuInstance(4, 15, "1g.20gb", 6, 2)]
    runner = FakeRunner({("mig", "-i", PF, "-lgipp"): (0, "GPU  0 Profile ID 15 Placements: {0,2,4,6}:2", ""),
                         ("mig", "-i", PF, "-lgip"): (0, "|   0  MIG 1g.20gb        15     0/4    19.40  No  16 0 0 |", "")})
    # VF .4 keeps its 1-20C (GI 2), .5 is cleared (GI 1 becomes free, reused), GIs 3 and 4 unneeded
    plan = gpu_plan([(VFS[0], T_1_20C, T_1_20C), (VFS[1], T_1_20C, None), (VFS[2], None, T_1_20C)])
    result = mig.plan(state(True, gis, {VFS[0]: 2, VFS[1]: 1}), plan, View(Gpu(PF), {}), mig.Smi(runner))
    assert result.steps() == [("mig-gi-destroy", PF, 3), ("mig-gi-destroy", PF, 4)]
    kept = mig.plan(state(True, gis, {VFS[0]: 2, VFS[1]: 1}, mig.MigOptions(gi_cleanup="keep")),
                    gpu_plan([(VFS[0], T_1_20C, T_1_20C), (VFS[1], T_1_20C, None), (VFS[2], None, T_1_20C)]),
                    View(Gpu(PF), {}), mig.Smi(runner))
    assert kept.steps() == [] and not kept.changed


def test_gis_that_do_not_fit_fail():
    plan = gpu_plan([(VFS[0], None, T_7_80C), (VFS[1], None, T_1_10C)])
    with pytest.raises(LayoutError, match="^GPU 0000:41:00.0: GPU instances 1g.10gb, 7g.80gb do not fit \\(empty GPU\\)$"):
        mig.plan(state(False), plan, View(Gpu(PF), {}), mig.Smi(FakeRunner({})))


def test_time_sliced_on_a_mig_gpu_is_one_plan_out_of_mig_mode():
    gis = [mig.GpuInstance(2, 15, "1g.20gb", 2, 2), mig.GpuInstance(1, 15, "1g.20gb", 0, 2)]
    plan = gpu_plan([(VFS[0], T_1_20C, T_40C), (VFS[1], T_1_20C, None)])
    plan.steps = [("clear", VFS[0], 0), ("clear", VFS[1], 0), ("set", VFS[0], T_40C.type_id)]
    smi = mig.Smi(FakeRunner({}))
    result = mig.plan(state(True, gis, {VFS[0]: 1, VFS[1]: 2}, mig.MigOptions(gi_cleanup="keep")), plan,
                      View(Gpu(PF), {}), smi)
    assert result.leave and plan.mig is result and smi.runner.calls == []
    assert plan.steps == [("clear", VFS[0], 0), ("clear", VFS[1], 0), ("mig-gi-destroy", PF, 1),
                          ("mig-gi-destroy", PF, 2), ("disable-vfs", PF), ("mig-mode", PF, 0), ("enable-vfs", PF),
                          ("set", VFS[0], T_40C.type_id)]   # every GI goes, also with gi_cleanup keep
    assert result.state(False) == {"mode": "enabled", "gpu_instances": ["1g.20gb", "1g.20gb"]}
    assert result.state(True) == {"mode": "disabled", "gpu_instances": []}


def test_a_held_vf_refuses_the_way_out_of_mig_mode_naming_it():
    with pytest.raises(LayoutError, match="^GPU 0000:41:00.0 is in MIG mode; time-sliced H100-40C needs it off, which "
                                          "needs its VFs disabled, but VF 0000:41:00.5 is held by a VM \\(pid 7\\)$"):
        mig.plan(state(True), gpu_plan([(VFS[0], None, T_40C)]), View(Gpu(PF), {VFS[1]: [7]}), mig.Smi(FakeRunner({})))


def test_mode_off_is_read_back():
    query = ("-i", PF, "--query-gpu=mig.mode.current", "--format=csv,noheader")
    runner = FakeRunner({query: (0, "Disabled\n", "")})
    mig.mode_off(mig.Smi(runner), PF)
    assert runner.calls == [["-i", PF, "-mig", "0"], list(query)]
    with pytest.raises(LayoutError, match="^GPU 0000:41:00.0: MIG mode is still on after nvidia-smi -mig 0"):
        mig.mode_off(mig.Smi(FakeRunner({query: (0, "Enabled\n", "")})), PF)


def test_execute_order_and_read_back():
    gis_after = ("|   0  MIG 3g.40gb  9  1  0:4 |\n|   0  MIG 3g.40gb  9  2  4:4 |\n")
    runner = FakeRunner({("-i", PF, "--query-gpu=mig.mode.current", "--format=csv,noheader"): (0, "Enabled\n", ""),
                         ("mig", "-i", PF, "-lgi"): (0, gis_after, "")})
    plan = state(False, [mig.GpuInstance(5, 19, "1g.10gb", 0, 1)])
    plan.mode_before = True
    plan.destroy, plan.create, plan.names = [plan.gis_before[0]], [9, 9], {9: "3g.40gb"}
    mig.execute(mig.Smi(runner), plan)
    assert runner.calls == [["mig", "-i", PF, "-dci", "-gi", "5"], ["mig", "-i", PF, "-dgi", "-gi", "5"],
                            ["mig", "-i", PF, "-cgi", "9,9", "-C"], ["mig", "-i", PF, "-lgi"]]
    runner.calls = []
    plan.options = mig.MigOptions(compute_instances=False)
    plan.destroy = []
    plan.gis_before = []
    with pytest.raises(LayoutError, match="after the MIG changes it has GPU instances 3g.40gb, 3g.40gb, expected "
                                          "3g.40gb$"):
        plan.create = [9]
        mig.execute(mig.Smi(runner), plan)
    assert ["mig", "-i", PF, "-cgi", "9"] in runner.calls


def test_a_failing_command_names_the_gpu():
    runner = FakeRunner({("-i", PF, "-mig", "1"): (1, "Unable to enable MIG Mode for GPU 00000000:41:00.0: In use by "
                                                      "another client\n", "")})
    plan = state(False)
    plan.mode_after = True
    with pytest.raises(LayoutError, match="^GPU 0000:41:00.0: nvidia-smi -mig 1 failed: Unable to enable MIG Mode"):
        mig.execute(mig.Smi(runner), plan)


def test_pending_state_and_facts():
    expected = {"mode": "enabled", "gpu_instances": ["1g.20gb", "1g.20gb"]}
    assert mig.pending_state({"H100-1-20C": 2, "H100-3-40C": 0}) == expected
    assert mig.pending_state({"H100-40C": 2}) is None
    runner = FakeRunner({("-i", PF, "--query-gpu=mig.mode.current", "--format=csv,noheader"): (0, "Enabled\n", ""),
                         ("mig", "-i", PF, "-lgi"): (0, LGI, "")})
    found = mig.facts(mig.Smi(runner), PF)
    assert found["mig_mode"] == "enabled"
    assert found["gpu_instances"][1] == {"id": 7, "profile_id": 20, "name": "1g.20gb+me", "placement": "6:1"}
    no_mig = FakeRunner({("-i", PF, "--query-gpu=mig.mode.current", "--format=csv,noheader"): (0, "[N/A]\n", "")})
    assert mig.facts(mig.Smi(no_mig), PF) == {"mig_mode": None, "gpu_instances": []}


def test_check_pending_fits_an_empty_gpu_before_vfs_are_enabled():
    supported = SUPPORTED + ("    vGPU Type ID                          : 0x462\n"
                             "        Name                              : NVIDIA H100-3-40C\n"
                             "        GPU Instance Profile ID           : 9\n")
    runner = FakeRunner({("-i", PF, "--query-gpu=mig.mode.current", "--format=csv,noheader"): (0, "Disabled\n", ""),
                         ("vgpu", "-s", "-v", "-i", PF): (0, supported, "")})
    mig.check_pending(mig.Smi(runner), PF, {"H100-1-20C": 4})
    mig.check_pending(mig.Smi(runner), PF, {"H100-40C": 2})            # time-sliced: nothing to ask
    with pytest.raises(LayoutError, match="GPU instances 1g.20gb, 1g.20gb, 3g.40gb, 3g.40gb do not fit"):
        mig.check_pending(mig.Smi(runner), PF, {"H100-3-40C": 2, "H100-1-20C": 2})
    with pytest.raises(LayoutError, match="names no GPU instance profile for H100-7-80C"):
        mig.check_pending(mig.Smi(runner), PF, {"H100-7-80C": 1})


def test_fixed_answers_are_asked_once_per_identity_and_mig_mode_and_mode_and_instances_every_time():
    mode, lgipp = ("-i", PF, "--query-gpu=mig.mode.current", "--format=csv,noheader"), ("mig", "-i", PF, "-lgipp")
    runner = FakeRunner({mode: (0, "Enabled\n", ""), ("vgpu", "-s", "-v", "-i", PF): (0, SUPPORTED, ""),
                         ("mig", "-i", PF, "-lgip"): (0, LGIP, ""), lgipp: (0, "", ""),
                         ("mig", "-i", PF, "-lgi"): (0, LGI, "")})
    answers, identity = mig.FixedAnswers(), ["driver 580.1"]

    def reconcile():      # a new Smi per engine, the answers kept across them (the agent's)
        del runner.calls[:]
        smi = mig.Smi(runner, answers, lambda pf: identity[0])
        smi.mode(PF), smi.instances(PF), smi.supported(PF), smi.geometry(PF), smi.supported(PF)
        return [call[-1] for call in runner.calls]
    # -lgipp answered empty (as with MIG mode off) is not kept
    assert reconcile() == ["--format=csv,noheader", "-lgi", PF, "-lgipp", "-lgip"]
    runner.answers[lgipp] = (0, LGIPP, "")
    assert reconcile() == ["--format=csv,noheader", "-lgi", "-lgipp"]
    assert reconcile() == ["--format=csv,noheader", "-lgi"]
    identity[0] = "driver 580.2"          # a reload, a swapped GPU, a reboot
    assert reconcile() == ["--format=csv,noheader", "-lgi", PF, "-lgipp", "-lgip"]
    runner.answers[mode] = (0, "Disabled\n", "")     # read in the other MIG mode: asked again
    assert reconcile()[2:] == [PF, "-lgipp", "-lgip"]
    assert reconcile()[2:] == []
