import os
import shutil
import threading

import pytest

from fake_node import FakeNode, FakeSriovManage, KernelSysfs, Rendezvous

from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import inuse
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import sriov
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import Sysfs

GPU_A, GPU_B, NIC = "0000:41:00.0", "0000:42:00.0", "0000:61:00.0"
T4 = "0000:81:00.0"   # a display device without SR-IOV


@pytest.fixture
def node(tmp_path):
    node = FakeNode(tmp_path)
    node.pf(GPU_A, total=32)
    node.pf(GPU_B, total=32)
    node.nic(NIC, total=8)
    node.device(T4, device="0x1eb8")
    return node


def make(node, **kwargs):
    return KernelSysfs(node, **kwargs), FakeSriovManage(node)


def plan(sysfs, runner, node, **kwargs):
    def held():
        return inuse.held_devices(sysfs, str(node.dev), str(node.proc))
    return sriov.plan_vfs(sysfs, runner, held=held, **kwargs)


def addresses(the_plan):
    return [p.address for p in the_plan.pfs]


# --- selection ---------------------------------------------------------------------------------

def test_all_selects_sriov_gpus_and_never_the_nic(node):
    sysfs, runner = make(node)
    assert addresses(plan(sysfs, runner, node, devices="all")) == [GPU_A, GPU_B]
    assert addresses(plan(sysfs, runner, node, devices=["ALL"])) == [GPU_A, GPU_B]


def test_all_on_a_node_without_sriov_gpus_is_an_empty_unchanged_plan(tmp_path):
    node = FakeNode(tmp_path)
    node.nic(NIC)
    sysfs, runner = make(node)
    the_plan = plan(sysfs, runner, node, devices="all")
    assert the_plan.pfs == [] and not the_plan.changed


@pytest.mark.parametrize("devices,expected", [
    (["41:00.0"], [GPU_A]),
    (["0x26B910DE"], [GPU_A, GPU_B]),
    (["10de:26b9"], [GPU_A, GPU_B]),
    (["8086:1572"], [NIC]),                       # a filter may name any SR-IOV PF
    ([NIC, "10de:2bb5"], [NIC]),                  # a filter matching nothing is fine in a list
    (["0000:42:00.0", "0000:41:00.0"], [GPU_A, GPU_B]),
])
def test_addresses_and_filters(node, devices, expected):
    sysfs, runner = make(node)
    assert addresses(plan(sysfs, runner, node, devices=devices, method="sysfs")) == expected


def test_filters_never_select_vfs_that_share_the_pf_id(node):
    sysfs, runner = make(node)
    node.set_numvfs(GPU_A, 32)
    assert addresses(plan(sysfs, runner, node, devices=["10de:26b9"])) == [GPU_A, GPU_B]


@pytest.mark.parametrize("devices,message", [
    (["0000:99:00.0"], "devices: no PCI device 0000:99:00.0 on this node"),
    ([T4], "devices: %s does not support SR-IOV (no sriov_totalvfs)" % T4),
    (["gpu0"], "devices: 'gpu0' is neither a PCI address nor a vendor/device filter"),
    (["10de:2bb5"], "devices: 10de:2bb5 match no SR-IOV physical function on this node"),
    ([GPU_A, "41:00.0"], "devices: '0000:41:00.0' and '41:00.0' select the same devices"),
    (["10de:26b9", "0x26b910de"], "devices: '10de:26b9' and '0x26b910de' select the same devices"),
    ([GPU_A, "10de:26b9"], "devices: %s is selected twice (by '%s' and '10de:26b9')" % (GPU_A, GPU_A)),
    (["all", GPU_A], "devices: 'all' cannot be combined with other entries"),
    ([], "devices: the list is empty"),
])
def test_bad_selections_fail_naming_the_input_with_zero_writes(node, devices, message):
    sysfs, runner = make(node)
    with pytest.raises(sriov.SriovError) as err:
        plan(sysfs, runner, node, devices=devices)
    assert str(err.value).startswith(message)
    assert "\n" not in str(err.value) and sysfs.writes == 0


def test_a_vf_address_points_to_its_pf(node):
    node.set_numvfs(GPU_A, 2)
    sysfs, runner = make(node)
    with pytest.raises(sriov.SriovError) as err:
        plan(sysfs, runner, node, devices=["0000:41:00.5"])
    assert str(err.value) == "devices: 0000:41:00.5 is a VF of %s; select its physical function" % GPU_A


# --- planning ----------------------------------------------------------------------------------

@pytest.mark.parametrize("value,expected", [("max", None), ("TOTAL", None), (4, 4), ("16", 16), (0, 0)])
def test_num_vfs_values(value, expected):
    assert sriov.parse_num_vfs(value) == expected


@pytest.mark.parametrize("value", [-1, "-1", "four", True, "4.5", None])
def test_bad_num_vfs(value):
    with pytest.raises(sriov.SriovError) as err:
        sriov.parse_num_vfs(value)
    assert "num_vfs" in str(err.value)


def test_auto_uses_sriov_manage_for_nvidia_and_sysfs_for_the_nic(node):
    sysfs, runner = make(node)
    the_plan = plan(sysfs, runner, node, devices=[GPU_A, NIC])
    assert [(p.address, p.method, p.desired) for p in the_plan.pfs] == \
        [(GPU_A, "sriov_manage", 32), (NIC, "sysfs", 8)]
    assert the_plan.pfs[0].tool == FakeSriovManage.PATH


def test_sriov_manage_path_names_the_tool(node, tmp_path):
    tool = tmp_path / "run/nvidia/driver/usr/lib/nvidia/sriov-manage"
    tool.parent.mkdir(parents=True)
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    sysfs, runner = KernelSysfs(node), FakeSriovManage(node, installed=False)
    runner.PATH = str(tool)
    the_plan = plan(sysfs, runner, node, devices=[GPU_A], sriov_manage_path=str(tool))
    assert (the_plan.pfs[0].method, the_plan.pfs[0].tool) == ("sriov_manage", str(tool))
    sriov.apply_vfs(sysfs, runner, the_plan, timeout=2, poll_interval=0.01)
    assert runner.calls == [[str(tool), "-e", GPU_A]] and node.numvfs(GPU_A) == 32


@pytest.mark.parametrize("name,message", [
    ("absent", "no executable file there"), ("not-executable", "no executable file there"),
    ("relative", "not an absolute path")])
def test_a_bad_sriov_manage_path_fails_naming_it_before_any_write(node, tmp_path, name, message):
    (tmp_path / "not-executable").write_text("#!/bin/sh\n")
    path = "usr/lib/nvidia/sriov-manage" if name == "relative" else str(tmp_path / name)
    sysfs, runner = make(node)
    with pytest.raises(sriov.SriovError) as err:
        plan(sysfs, runner, node, devices=[GPU_A], sriov_manage_path=path)
    assert str(err.value) == "sriov_manage_path %s: %s" % (path, message) and sysfs.writes == 0
    assert plan(sysfs, runner, node, devices=[NIC], sriov_manage_path=path).pfs[0].method == "sysfs"


def test_auto_falls_back_to_sysfs_without_the_tool(node):
    sysfs = KernelSysfs(node)
    the_plan = plan(sysfs, FakeSriovManage(node, installed=False), node, devices=[GPU_A])
    assert the_plan.pfs[0].method == "sysfs"


@pytest.mark.parametrize("kwargs,message", [
    ({"devices": [GPU_A], "num_vfs": 4, "method": "sriov_manage"},
     "%s: sriov-manage always enables all 32 VFs; num_vfs 4 needs method sysfs" % GPU_A),
    ({"devices": [GPU_A], "num_vfs": 4},
     "%s: sriov-manage always enables all 32 VFs; num_vfs 4 needs method sysfs" % GPU_A),
    ({"devices": [NIC], "method": "sriov_manage"},
     "%s: method sriov_manage only handles NVIDIA GPUs (vendor 10de, not 8086)" % NIC),
    ({"devices": [GPU_B, NIC], "num_vfs": 9, "method": "sysfs"}, "%s: num_vfs 9 exceeds sriov_totalvfs 8" % NIC),
    ({"devices": "all", "method": "sideways"}, "method 'sideways' is not one of auto, sysfs, sriov_manage"),
    ({"devices": "all", "state": "gone"}, "state 'gone' is not one of present, absent"),
])
def test_invalid_plans_fail_before_any_write(node, kwargs, message):
    sysfs, runner = make(node)
    with pytest.raises(sriov.SriovError) as err:
        plan(sysfs, runner, node, **kwargs)
    assert str(err.value) == message
    assert sysfs.writes == 0 and runner.calls == []


def test_explicit_sriov_manage_without_the_tool_names_where_it_looked(node):
    sysfs = KernelSysfs(node)
    with pytest.raises(sriov.SriovError) as err:
        plan(sysfs, FakeSriovManage(node, installed=False), node, devices=[GPU_A], method="sriov_manage")
    assert str(err.value) == "%s: sriov-manage not found (looked in /usr/lib/nvidia/sriov-manage and PATH)" % GPU_A


def test_num_vfs_equal_to_total_is_allowed_with_sriov_manage(node):
    sysfs, runner = make(node)
    assert plan(sysfs, runner, node, devices=[GPU_A], num_vfs=32, method="sriov_manage").pfs[0].desired == 32


def test_plan_result_and_diff_show_every_pf_and_the_changes(node):
    node.set_numvfs(GPU_B, 32)
    sysfs, runner = make(node)
    the_plan = plan(sysfs, runner, node, devices="all")
    assert the_plan.changed
    assert the_plan.as_list() == [
        {"address": GPU_A, "before": {"num_vfs": 0}, "after": {"num_vfs": 32}, "method": "sriov_manage",
         "changed": True, "discarded_profiles": []},
        {"address": GPU_B, "before": {"num_vfs": 32}, "after": {"num_vfs": 32}, "method": "sriov_manage",
         "changed": False, "discarded_profiles": []}]
    assert the_plan.diff() == {"before": {GPU_A: {"num_vfs": 0}}, "after": {GPU_A: {"num_vfs": 32}}}


# --- VFs that a change would destroy ---------------------------------------------------------------

@pytest.mark.parametrize("state,num_vfs", [("present", 4), ("absent", "max")])
@pytest.mark.parametrize("force", [False, True])
def test_a_held_vf_blocks_any_change_even_with_force(node, state, num_vfs, force):
    node.set_numvfs(NIC, 8)
    node.set_numvfs(GPU_A, 2)
    pid = node.hold(node.group_of("0000:41:00.5"))
    sysfs, runner = make(node)
    with pytest.raises(sriov.SriovError) as err:
        plan(sysfs, runner, node, devices=[NIC, GPU_A], num_vfs=num_vfs, state=state, method="sysfs", force=force)
    assert str(err.value).startswith("%s: VF 0000:41:00.5 is held by a VM (pid %d)" % (GPU_A, pid))
    assert sysfs.writes == 0


def test_a_vf_held_through_its_mdev_blocks_the_change(tmp_path):
    node = FakeNode(tmp_path)
    node.mdev_gpu(GPU_A, total=4)
    uuid = "5c8f3b52-0c1c-4a4b-9f5e-000000000001"
    node.mdev(uuid, "0000:41:00.6")
    node.hold(node.group_of(uuid, "bus/mdev/devices"))
    sysfs, runner = make(node)
    with pytest.raises(sriov.SriovError) as err:
        plan(sysfs, runner, node, devices=[GPU_A], state="absent", force=True)
    assert "VF 0000:41:00.6 is held by a VM" in str(err.value)


def test_a_programmed_vf_needs_force_and_force_discards_it(node):
    node.set_numvfs(GPU_A, 32)
    node.set_type("0000:41:00.7", 1155)
    sysfs, runner = make(node)
    with pytest.raises(sriov.SriovError) as err:
        plan(sysfs, runner, node, devices=[GPU_A], num_vfs=16, method="sysfs")
    assert str(err.value) == ("%s: VF 0000:41:00.7 has vGPU type 1155 that changing 32 -> 16 VFs would discard; "
                              "set force to allow it" % GPU_A)
    the_plan = plan(sysfs, runner, node, devices=[GPU_A], num_vfs=16, method="sysfs", force=True)
    assert the_plan.pfs[0].discard == ["0000:41:00.7"]
    sriov.apply_vfs(sysfs, runner, the_plan, timeout=2, poll_interval=0.01)
    assert sysfs.write_log == [
        ("bus/pci/devices/0000:41:00.7/nvidia/current_vgpu_type", "0"),
        ("bus/pci/devices/%s/sriov_numvfs" % GPU_A, "0"),
        ("bus/pci/devices/%s/sriov_numvfs" % GPU_A, "16")]
    assert node.numvfs(GPU_A) == 16


def test_force_removes_mdevs_before_disabling(tmp_path):
    node = FakeNode(tmp_path)
    node.mdev_gpu(GPU_A, total=4)
    uuid = "5c8f3b52-0c1c-4a4b-9f5e-000000000002"
    node.mdev(uuid, "0000:41:00.4")
    sysfs, runner = make(node)
    the_plan = plan(sysfs, runner, node, devices=[GPU_A], state="absent", force=True)
    sriov.apply_vfs(sysfs, runner, the_plan, timeout=2, poll_interval=0.01)
    assert sysfs.write_log[0] == ("bus/mdev/devices/%s/remove" % uuid, "1")
    assert node.numvfs(GPU_A) == 0 and inuse.mdev_parents(sysfs) == {}


def test_enabling_from_zero_ignores_held_scans(node):
    sysfs, runner = make(node)

    def explode():
        raise AssertionError("held devices must not be scanned when no VF goes away")
    assert sriov.plan_vfs(sysfs, runner, devices="all", held=explode).changed


# --- applying ----------------------------------------------------------------------------------

def test_sysfs_goes_through_zero_from_n_to_m(node):
    node.set_numvfs(NIC, 4)
    sysfs, runner = make(node)
    the_plan = plan(sysfs, runner, node, devices=[NIC], num_vfs=6)
    assert sriov.apply_vfs(sysfs, runner, the_plan, timeout=2, poll_interval=0.01) == [NIC]
    assert sysfs.write_log == [("bus/pci/devices/%s/sriov_numvfs" % NIC, "0"),
                               ("bus/pci/devices/%s/sriov_numvfs" % NIC, "6")]
    assert node.numvfs(NIC) == 6


def test_second_apply_changes_nothing_and_writes_nothing(node):
    sysfs, runner = make(node)
    sriov.apply_vfs(sysfs, runner, plan(sysfs, runner, node, devices="all"), timeout=2, poll_interval=0.01)
    calls, writes = list(runner.calls), sysfs.writes
    again = plan(sysfs, runner, node, devices="all")
    assert not again.changed and sriov.apply_vfs(sysfs, runner, again) == []
    assert runner.calls == calls and sysfs.writes == writes


def test_sriov_manage_enables_and_disables_and_is_verified_in_sysfs(node):
    sysfs, runner = make(node)
    sriov.apply_vfs(sysfs, runner, plan(sysfs, runner, node, devices=[GPU_A]), timeout=2, poll_interval=0.01)
    assert node.numvfs(GPU_A) == 32 and runner.calls == [[FakeSriovManage.PATH, "-e", GPU_A]]
    sriov.apply_vfs(sysfs, runner, plan(sysfs, runner, node, devices=[GPU_A], state="absent"), timeout=2)
    assert node.numvfs(GPU_A) == 0 and runner.calls[-1] == [FakeSriovManage.PATH, "-d", GPU_A]
    assert sysfs.writes == 0


def test_sriov_manage_from_a_partial_count_disables_first(node):
    node.set_numvfs(GPU_A, 4)
    sysfs, runner = make(node)
    sriov.apply_vfs(sysfs, runner, plan(sysfs, runner, node, devices=[GPU_A]), timeout=2, poll_interval=0.01)
    assert [call[1] for call in runner.calls] == ["-d", "-e"] and node.numvfs(GPU_A) == 32


def test_sriov_manage_exiting_zero_without_vfs_is_retried(node):
    sysfs, runner = KernelSysfs(node), FakeSriovManage(node, noop_calls=2)
    the_plan = plan(sysfs, runner, node, devices=[GPU_A])
    sriov.apply_vfs(sysfs, runner, the_plan, timeout=2, poll_interval=0.01, retry_delay=0.01)
    assert len(runner.calls) == 3 and node.numvfs(GPU_A) == 32


def test_sriov_manage_that_never_enables_fails_naming_the_pf(node):
    sysfs, runner = KernelSysfs(node), FakeSriovManage(node, noop_calls=99)
    the_plan = plan(sysfs, runner, node, devices=[GPU_A])
    with pytest.raises(sriov.SriovError) as err:
        sriov.apply_vfs(sysfs, runner, the_plan, timeout=2, retries=3, retry_delay=0.01)
    assert str(err.value) == ("%s: /usr/lib/nvidia/sriov-manage -e %s left sriov_numvfs at 0 instead of 32 "
                              "after 3 attempts (last exit 0: Enabling VFs on %s)" % (GPU_A, GPU_A, GPU_A))


class MeetingSysfs(KernelSysfs):
    def __init__(self, node, rendezvous):
        super().__init__(node)
        self.rendezvous = rendezvous

    def write(self, rel, value):
        if rel.endswith("/sriov_numvfs") and str(value) != "0":
            self.rendezvous.enable()
        super().write(rel, value)


class MeetingSriovManage(FakeSriovManage):
    def __init__(self, node, rendezvous):
        super().__init__(node)
        self.rendezvous = rendezvous

    def _execute(self, argv):
        if argv[1] == "-e":
            self.rendezvous.enable()
        return super()._execute(argv)


def test_pfs_are_applied_in_parallel(node):
    rendezvous = Rendezvous(3)
    sysfs, runner = MeetingSysfs(node, rendezvous), MeetingSriovManage(node, rendezvous)
    the_plan = plan(sysfs, runner, node, devices=[GPU_A, GPU_B, NIC])
    assert [p.method for p in the_plan.pfs] == ["sriov_manage", "sriov_manage", "sysfs"]
    sriov.apply_vfs(sysfs, runner, the_plan, timeout=5, poll_interval=0.01)
    assert rendezvous.most_in_flight == 3 and not rendezvous.barrier.broken
    assert [node.numvfs(pf) for pf in (GPU_A, GPU_B, NIC)] == [32, 32, 8]


def test_the_rendezvous_fails_serial_enabling():
    """The check above can fail: enables one after another break the barrier."""
    rendezvous = Rendezvous(2, timeout=0.05)
    with pytest.raises(threading.BrokenBarrierError):
        rendezvous.enable()
    assert rendezvous.most_in_flight == 1


class DriverUnloadingSriovManage(FakeSriovManage):
    """sriov-manage -e during which the PF's driver goes away: exit 0, no VFs, no driver link."""

    def _execute(self, argv):
        (self.node.dir(argv[2]) / "driver").unlink()
        return 0, "", ""


class DriverUnloadingSysfs(KernelSysfs):
    """The sriov_numvfs store is accepted, then the driver is unbound before any VF appears."""

    def write(self, rel, value):
        if not (rel.endswith("/sriov_numvfs") and str(value) != "0"):
            super().write(rel, value)
            return
        Sysfs.write(self, rel, value)
        (self.node.dir(rel.split("/")[-2]) / "driver").unlink()


@pytest.mark.parametrize("method,pf", [("sriov_manage", GPU_A), ("sysfs", NIC)])
def test_a_pf_that_loses_its_driver_fails_at_once_naming_it(node, method, pf):
    sysfs, runner = DriverUnloadingSysfs(node), DriverUnloadingSriovManage(node)
    the_plan = plan(sysfs, runner, node, devices=[pf], method=method)
    with pytest.raises(sriov.SriovError) as err:
        sriov.apply_vfs(sysfs, runner, the_plan, timeout=3600, poll_interval=0.01, retries=3, retry_delay=3600)
    assert str(err.value).startswith("%s: lost its driver (no driver link) during " % pf)
    assert len(runner.calls) == (1 if method == "sriov_manage" else 0)


def test_driver_without_sriov_configure_suggests_sriov_manage(node):
    sysfs, runner = KernelSysfs(node, no_sriov_configure=[GPU_A]), FakeSriovManage(node)
    the_plan = plan(sysfs, runner, node, devices=[GPU_A], method="sysfs")
    with pytest.raises(sriov.SriovError) as err:
        sriov.apply_vfs(sysfs, runner, the_plan, timeout=1)
    assert str(err.value) == ("%s: its driver cannot set VFs through sysfs (no sriov_configure); "
                              "use method sriov_manage for NVIDIA GPUs" % GPU_A)


def test_one_failing_pf_does_not_stop_the_others_and_is_named(node):
    sysfs, runner = KernelSysfs(node, no_sriov_configure=[GPU_B]), FakeSriovManage(node)
    the_plan = plan(sysfs, runner, node, devices=[GPU_B, NIC], method="sysfs")
    with pytest.raises(sriov.SriovError) as err:
        sriov.apply_vfs(sysfs, runner, the_plan, timeout=1, poll_interval=0.01)
    assert str(err.value).startswith(GPU_B + ": its driver cannot set VFs") and NIC not in str(err.value)
    assert node.numvfs(NIC) == 8


def test_vfs_that_never_get_their_nvidia_directory_time_out(tmp_path):
    node = FakeNode(tmp_path)
    node.pf(GPU_A, total=4, vf_style="plain")      # NVIDIA PF whose VFs never become vGPU-ready
    sysfs, runner = make(node)
    the_plan = plan(sysfs, runner, node, devices=[GPU_A], method="sysfs")
    with pytest.raises(sriov.SriovError) as err:
        sriov.apply_vfs(sysfs, runner, the_plan, timeout=0.2, poll_interval=0.05)
    assert str(err.value) == ("%s: VFs not ready after 0.2 s: 4 of 4 VFs (first 0000:41:00.4) have neither "
                              "nvidia/ nor mdev_supported_types" % GPU_A)


def test_mdev_sriov_vfs_are_ready_with_mdev_supported_types(tmp_path):
    node = FakeNode(tmp_path)
    node.pf(GPU_A, total=4, vf_style="mdev", device="0x25b6")
    sysfs, runner = make(node)
    sriov.apply_vfs(sysfs, runner, plan(sysfs, runner, node, devices=[GPU_A]), timeout=1, poll_interval=0.01)
    assert node.numvfs(GPU_A) == 4


# --- readiness: what is checked, in which order, how often ------------------------------------------

def enabled_plan(node, pf=GPU_A, total=32):
    """A plan for `pf` whose apply has already happened (current = desired = total)."""
    return sriov.PfPlan(pf, "10de", "26b9", total, total, total, "sriov_manage", FakeSriovManage.PATH)


def test_readiness_follows_the_virtfn_links_not_vf_addresses(node):
    vfs = node.set_numvfs(GPU_A, 4)
    sysfs, the_plan = Sysfs(str(node.sys)), enabled_plan(node, total=4)
    assert sriov.not_ready(sysfs, the_plan) is None
    # virtfn2 now points to a VF elsewhere that has no nvidia/ yet; the VF at the "usual" address keeps its own
    node.device("0000:41:07.2", physfn=GPU_A)
    link = node.dir(GPU_A) / "virtfn2"
    link.unlink()
    link.symlink_to("../0000:41:07.2")
    assert sriov.not_ready(sysfs, the_plan) == (
        "1 of 4 VFs (first 0000:41:07.2) have neither nvidia/ nor mdev_supported_types")
    (node.dir("0000:41:07.2") / "nvidia").mkdir()
    shutil.rmtree(node.dir(vfs[2]) / "nvidia")      # no longer a VF of this PF: not looked at
    assert sriov.not_ready(sysfs, the_plan) is None


def test_a_dangling_virtfn_link_is_not_ready(node):
    vfs = node.set_numvfs(GPU_A, 4)
    shutil.rmtree(node.dir(vfs[1]))
    sysfs, the_plan = Sysfs(str(node.sys)), enabled_plan(node, total=4)
    assert sriov.not_ready(sysfs, the_plan) == (
        "1 of 4 VFs (first %s) have neither nvidia/ nor mdev_supported_types" % vfs[1])


def test_a_quick_look_checks_the_last_vf_first_and_stops_at_the_first_not_ready(node):
    vfs = node.set_numvfs(GPU_A, 4)
    for vf in (vfs[0], vfs[3]):
        shutil.rmtree(node.dir(vf) / "nvidia")
    sysfs, the_plan = Sysfs(str(node.sys)), enabled_plan(node, total=4)
    assert sriov.not_ready(sysfs, the_plan, first_only=True) == (
        "VF %s (virtfn3) has neither nvidia/ nor mdev_supported_types yet" % vfs[3])
    assert sriov.not_ready(sysfs, the_plan) == (
        "2 of 4 VFs (first %s) have neither nvidia/ nor mdev_supported_types" % vfs[0])
    (node.dir(vfs[3]) / "nvidia").mkdir()
    assert sriov.not_ready(sysfs, the_plan, first_only=True) == (
        "VF %s (virtfn0) has neither nvidia/ nor mdev_supported_types yet" % vfs[0])


def test_not_ready_counts_links_and_trusts_a_given_numvfs(node):
    node.set_numvfs(GPU_A, 4)
    os.unlink(node.dir(GPU_A) / "virtfn3")
    sysfs, the_plan = Sysfs(str(node.sys)), enabled_plan(node, total=4)
    assert sriov.not_ready(sysfs, the_plan) == "3 of 4 virtfn links present"
    assert sriov.not_ready(sysfs, the_plan, numvfs=2) == "sriov_numvfs is 2, expected 4"


class ReadCountingSysfs(KernelSysfs):
    def __init__(self, node):
        super().__init__(node)
        self.reads = []

    def read(self, rel):
        self.reads.append(rel)
        return super().read(rel)


def test_sriov_numvfs_is_read_once_after_sriov_manage(node):
    sysfs, runner = ReadCountingSysfs(node), FakeSriovManage(node)
    the_plan = plan(sysfs, runner, node, devices=[GPU_A])
    del sysfs.reads[:]
    sriov.apply_vfs(sysfs, runner, the_plan, timeout=2, poll_interval=0.01)
    assert sysfs.reads.count("bus/pci/devices/%s/sriov_numvfs" % GPU_A) == 1 and node.numvfs(GPU_A) == 32


class LateVfsSriovManage(FakeSriovManage):
    """sriov-manage that returns before the last VF has its nvidia/ (the test adds it after
    `late_polls` sleeps of the wait)."""

    def __init__(self, node, late_polls):
        super().__init__(node)
        self.late_polls = late_polls

    def _execute(self, argv):
        result = super()._execute(argv)
        vf = self.node.dir(argv[2]) / ("virtfn%d" % (self.node.numvfs(argv[2]) - 1))
        self.missing = vf / "nvidia"
        shutil.rmtree(self.missing)
        return result


def test_the_wait_polls_from_a_short_first_sleep_doubling_to_poll_interval(node, monkeypatch):
    runner = LateVfsSriovManage(node, late_polls=5)
    sysfs = KernelSysfs(node)
    sleeps = []

    def sleep(seconds):
        if not seconds:
            return          # the fake tool's own sleep(latency=0): time.sleep is patched for everyone
        sleeps.append(round(seconds, 3))
        if len(sleeps) == runner.late_polls:
            runner.missing.mkdir()
    monkeypatch.setattr(sriov.time, "sleep", sleep)
    sriov.apply_vfs(sysfs, runner, plan(sysfs, runner, node, devices=[GPU_A]), timeout=60, poll_interval=0.05)
    assert sleeps == [0.01, 0.02, 0.04, 0.05, 0.05] and node.numvfs(GPU_A) == 32


def test_vfs_ready_by_the_deadline_are_not_a_timeout(node, monkeypatch):
    runner, sysfs = LateVfsSriovManage(node, late_polls=0), KernelSysfs(node)
    driver_check = sriov._fail_without_driver

    def ready_while_checking_the_driver(*args):
        driver_check(*args)
        if not runner.missing.exists():
            runner.missing.mkdir()
    monkeypatch.setattr(sriov, "_fail_without_driver", ready_while_checking_the_driver)
    assert sriov.apply_vfs(sysfs, runner, plan(sysfs, runner, node, devices=[GPU_A]), timeout=0) == [GPU_A]
    assert runner.missing.is_dir()
