"""accelops.vgpu.sriov_vfs against a simulated node: two L40S (sriov-manage) and a NIC (sysfs)."""

import os

from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import inuse
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import sriov
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders.node_lock import lock_path, node_lock
from ansible_collections.accelops.vgpu.plugins.module_utils.runner import CommandRunner
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import Sysfs
from ansible_collections.accelops.vgpu.tests.integration.dra_claims import prepare_claim, prepare_whole_claim
from ansible_collections.accelops.vgpu.tests.unit.plugins.module_utils.node.fake_node import Rendezvous

SPEC = "l40s:2,nic:1"


def enable_tasks(nic):
    return [
        {"name": "gpus", "accelops.vgpu.sriov_vfs": {"devices": "all"}},
        {"name": "nic", "accelops.vgpu.sriov_vfs": {"devices": [nic], "num_vfs": 8, "method": "sysfs"}},
    ]


def numvfs(node, pf):
    return int(node.read("bus/pci/devices/%s/sriov_numvfs" % pf))


def sysfs_writes(node):
    """Write attempts the simulated kernel saw (fake tools included), ok or failed."""
    return node.log()


def test_enable_check_diff_idempotence_and_the_nic_is_never_in_all(gpusim_node, run_playbook):
    node = gpusim_node(SPEC)
    gpus, nic = node.pfs("l40s"), node.pfs("nic")[0]

    check = run_playbook(enable_tasks(nic), node, check=True, diff=True)
    assert check.rc == 0, check
    assert sysfs_writes(node) == []
    assert [check.task(t)["changed"] for t in ("gpus", "nic")] == [True, True]
    assert check.task("gpus")["diff"] == {"before": dict((pf, {"num_vfs": 0}) for pf in gpus),
                                          "after": dict((pf, {"num_vfs": 32}) for pf in gpus)}

    real = run_playbook(enable_tasks(nic), node, diff=True)
    assert real.rc == 0, real
    assert [real.task(t)["changed"] for t in ("gpus", "nic")] == [True, True]
    assert real.task("gpus")["diff"] == check.task("gpus")["diff"]
    assert [(p["address"], p["method"], p["after"]) for p in real.task("gpus")["pfs"]] == \
        [(pf, "sriov_manage", {"num_vfs": 32}) for pf in gpus]
    assert real.task("nic")["pfs"] == [{"address": nic, "before": {"num_vfs": 0}, "after": {"num_vfs": 8},
                                        "method": "sysfs", "changed": True, "discarded_profiles": []}]
    assert [numvfs(node, pf) for pf in gpus + [nic]] == [32, 32, 8]
    assert all(os.path.isdir(node.device_path(vf, "nvidia")) for pf in gpus for vf in node.vfs(pf))
    nic_writes = [w for w in node.writes() if nic in w["path"] or w["value"] == nic]
    assert nic_writes == [dict(nic_writes[0], path="bus/pci/devices/%s/sriov_numvfs" % nic, value="8")]

    node.clear_log()
    again = run_playbook(enable_tasks(nic), node, diff=True)
    assert again.rc == 0, again
    assert [again.task(t)["changed"] for t in ("gpus", "nic")] == [False, False]
    assert again.task("gpus")["diff"] == {"before": {}, "after": {}}
    assert sysfs_writes(node) == []


def test_n_to_m_with_a_held_vf_fails_naming_it_even_with_force(gpusim_node, run_playbook):
    node = gpusim_node("nic:1")
    nic = node.pfs("nic")[0]
    node.write("bus/pci/devices/%s/sriov_numvfs" % nic, 4)
    vf = node.vfs(nic)[2]
    pid = node.hold(vf)
    node.clear_log()
    tasks = [{"name": "resize", "block": [
        {"name": "n to m", "accelops.vgpu.sriov_vfs": {"devices": [nic], "num_vfs": 6, "force": True}}],
        "rescue": [{"name": "failed as expected", "ansible.builtin.debug": {"msg": "{{ ansible_failed_result.msg }}"}}]}]
    run = run_playbook(tasks, node)
    result = run.task("n to m")
    assert result["failed"] and result["msg"] == (
        "%s: VF %s is held by a VM (pid %d); refusing to change 4 -> 6 VFs" % (nic, vf, pid))
    assert sysfs_writes(node) == [] and numvfs(node, nic) == 4


def test_a_vf_a_dra_claim_uses_under_another_kubelet_dir_is_never_discarded(gpusim_node, run_playbook, tmp_path):
    node = gpusim_node("l40s:1")
    pf = node.pfs("l40s")[0]
    run_playbook([{"name": "enable", "accelops.vgpu.sriov_vfs": {"devices": "all"}}], node)
    vf = node.vfs(pf)[3]
    node.write("bus/pci/devices/%s/nvidia/current_vgpu_type" % vf, 1155)
    kubelet_dir = tmp_path / "var/snap/microk8s/common/var/lib/kubelet"
    claim = prepare_claim(kubelet_dir, vf, 1155)
    node.clear_log()
    run = run_playbook([{"name": "disable", "accelops.vgpu.sriov_vfs": {
        "devices": [pf], "state": "absent", "force": True, "kubelet_dir": str(kubelet_dir)}}], node)
    assert run.task("disable")["msg"] == "%s: VF %s is held by a VM (%s); refusing to change 32 -> 0 VFs" % (
        pf, vf, claim)
    assert sysfs_writes(node) == []


def test_a_gpu_a_dra_claim_holds_whole_is_never_given_vfs_nor_called_reserved(gpusim_node, run_playbook, tmp_path):
    """After a reboot a GPU given whole (issue 42) is back on nvidia without VFs until the kubelet prepares its claim
    again: `devices: all` must not enable them, a named entry is refused even with take_over, and vgpu_facts says who
    holds it (on vfio-pci too: held, not an operator's reservation)."""
    node = gpusim_node("l40s:2")
    whole, other = node.pfs("l40s")
    kubelet_dir = tmp_path / "kubelet"
    claim = prepare_whole_claim(kubelet_dir, whole)
    options = {"kubelet_dir": str(kubelet_dir)}
    run = run_playbook([
        {"name": "all", "accelops.vgpu.sriov_vfs": dict(options, devices="all")},
        {"name": "named", "accelops.vgpu.sriov_vfs": dict(options, devices=[whole], take_over=[whole]),
         "ignore_errors": True}], node)
    assert (numvfs(node, whole), numvfs(node, other)) == (0, 32)
    [skipped] = run.task("all")["reserved"]
    assert skipped["address"] == whole and "given whole to %s (step bound)" % claim in skipped["reason"]
    assert run.task("named")["msg"].startswith("devices: %s is given whole to %s" % (whole, claim))
    node.bind(whole, "vfio-pci")            # prepared again by the kubelet
    run = run_playbook([{"name": "facts", "accelops.vgpu.vgpu_facts": options},
                        {"name": "absent", "accelops.vgpu.sriov_vfs": dict(options, devices="all", state="absent")}],
                       node)
    [gpu] = [g for g in run.task("facts")["ansible_facts"]["vgpu"]["gpus"] if g["address"] == whole]
    assert gpu["reserved"] is None and gpu["held_whole"] == {"by": claim, "step": "bound"}
    assert [s["address"] for s in run.task("absent")["reserved"]] == [whole] and numvfs(node, other) == 0


def test_force_discards_profiles_but_not_held_vfs(gpusim_node, run_playbook):
    node = gpusim_node("l40s:2")
    first, second = node.pfs("l40s")
    run_playbook([{"name": "enable", "accelops.vgpu.sriov_vfs": {"devices": "all"}}], node)
    typed_first, typed_second = node.vfs(first)[0], node.vfs(second)[0]
    for vf in (typed_first, typed_second):
        node.write("bus/pci/devices/%s/nvidia/current_vgpu_type" % vf, 1155)
    pid = node.hold(node.vfs(second)[5])
    node.clear_log()

    def disable(pf, force):
        return {"name": "disable %s force %s" % (pf, force), "block": [
            {"name": "disable", "accelops.vgpu.sriov_vfs": {"devices": [pf], "state": "absent", "force": force}}],
            "rescue": [{"name": "rescued %s %s" % (pf, force), "ansible.builtin.debug": {"msg": "refused"}}]}

    run = run_playbook([disable(first, False), disable(second, True)], node)
    refused_profile, refused_held = [r for r in run.results if r["task"] == "disable"]
    assert refused_profile["msg"] == ("%s: VF %s has vGPU type 1155 that changing 32 -> 0 VFs would discard; "
                                      "set force to allow it" % (first, typed_first))
    assert refused_held["msg"] == ("%s: VF %s is held by a VM (pid %d); refusing to change 32 -> 0 VFs"
                                   % (second, node.vfs(second)[5], pid))
    assert sysfs_writes(node) == []

    forced = run_playbook([{"name": "disable", "accelops.vgpu.sriov_vfs": {
        "devices": [first], "state": "absent", "force": True}}], node)
    assert forced.rc == 0, forced
    assert forced.task("disable")["pfs"][0]["discarded_profiles"] == [typed_first]
    assert node.writes()[0]["path"] == "bus/pci/devices/%s/nvidia/current_vgpu_type" % typed_first
    assert (numvfs(node, first), numvfs(node, second)) == (0, 32)


def test_sriov_manage_path_runs_the_tool_where_the_gpu_operator_mounts_it(gpusim_node, run_playbook, tmp_path):
    node = gpusim_node("l40s:1", fresh=True)
    calls = tmp_path / "calls"
    tool = tmp_path / "run/nvidia/driver/usr/lib/nvidia/sriov-manage"
    tool.parent.mkdir(parents=True)
    tool.write_text('#!/bin/sh\necho "$@" >> %s\nexec %s "$@"\n'
                    % (calls, os.path.join(node.tools_dir, "sriov-manage")))
    tool.chmod(0o755)
    run = run_playbook([{"name": "enable", "accelops.vgpu.sriov_vfs": {
        "devices": "all", "sriov_manage_path": str(tool)}}], node)
    assert run.rc == 0, run
    assert run.task("enable")["pfs"][0]["method"] == "sriov_manage"
    assert calls.read_text() == "-e %s\n" % node.pfs()[0] and numvfs(node, node.pfs()[0]) == 32


def test_bad_inputs_fail_in_one_line_naming_the_object_with_zero_writes(gpusim_node, run_playbook):
    node = gpusim_node(SPEC)
    gpu, nic = node.pfs("l40s")[0], node.pfs("nic")[0]
    cases = {
        "unknown address": ({"devices": ["0000:99:00.0"]}, "devices: no PCI device 0000:99:00.0 on this node"),
        "filter matching nothing": ({"devices": ["0x2BB510DE"]},
                                    "devices: 0x2BB510DE match no SR-IOV physical function on this node"),
        "duplicate": ({"devices": [gpu, "10de:26b9"]},
                      "devices: %s is selected twice (by '%s' and '10de:26b9')" % (gpu, gpu)),
        "too many vfs": ({"devices": [nic], "num_vfs": 65, "method": "sysfs"},
                         "%s: num_vfs 65 exceeds sriov_totalvfs 64" % nic),
        "sriov-manage path missing": ({"devices": "all", "sriov_manage_path": "/run/nvidia/driver/none"},
                                      "sriov_manage_path /run/nvidia/driver/none: no executable file there"),
        "partial with sriov-manage": ({"devices": [gpu], "num_vfs": 4, "method": "sriov_manage"},
                                      "%s: sriov-manage always enables all 32 VFs; num_vfs 4 needs method sysfs" % gpu),
        "not a number": ({"devices": "all", "num_vfs": "lots"}, "num_vfs 'lots' is not a number of VFs or 'max'"),
    }
    tasks = [{"name": "case " + name, "block": [{"name": name, "accelops.vgpu.sriov_vfs": args}],
              "rescue": [{"name": "rescued " + name, "ansible.builtin.debug": {"msg": "failed"}}]}
             for name, (args, dummy) in cases.items()]
    run = run_playbook(tasks, node)
    for name, (dummy, message) in cases.items():
        result = run.task(name)
        assert result["failed"] and result["msg"] == message and "\n" not in result["msg"]
    assert sysfs_writes(node) == []


class MeetingRunner(CommandRunner):
    """The real fake tools, but every `sriov-manage -e` first waits for the other enables."""

    def __init__(self, rendezvous):
        super().__init__()
        self.rendezvous = rendezvous

    def _execute(self, argv):
        if argv[1:2] == ["-e"]:
            self.rendezvous.enable()
        return super()._execute(argv)


class MeetingSysfs(Sysfs):
    def __init__(self, root, rendezvous):
        super().__init__(root)
        self.rendezvous = rendezvous

    def write(self, rel, value):
        if rel.endswith("/sriov_numvfs") and str(value) != "0":
            self.rendezvous.enable()
        super().write(rel, value)


def test_pfs_are_enabled_in_parallel(gpusim_node, monkeypatch):
    """No wall clock: the three enables (two sriov-manage, one sysfs) only return once all three are
    in flight together; one after another they break the rendezvous and the apply fails."""
    node = gpusim_node("l40s:2,nic:1", latency_ms=200)
    monkeypatch.setenv("GPUSIM_ROOT", node.root)
    monkeypatch.setenv("PATH", node.env["PATH"])
    rendezvous = Rendezvous(3)
    sysfs, runner = MeetingSysfs(node.root, rendezvous), MeetingRunner(rendezvous)
    plan = sriov.plan_vfs(sysfs, runner, [node.pfs("nic")[0], "10de:26b9"], method="auto",
                          held=lambda: inuse.held_devices(sysfs, node.dev_root))
    assert sorted(p.method for p in plan.pfs) == ["sriov_manage", "sriov_manage", "sysfs"]
    sriov.apply_vfs(sysfs, runner, plan, timeout=30)
    assert [numvfs(node, pf) for pf in node.pfs()] == [32, 32, 64]
    assert rendezvous.most_in_flight == 3 and not rendezvous.barrier.broken


def test_a_failed_sriov_manage_is_retried_and_enoent_suggests_sriov_manage(gpusim_node, run_playbook):
    node = gpusim_node("l40s:2")
    first, second = node.pfs("l40s")
    node.ctl("fail-next", "bus/pci/devices/%s/sriov_numvfs" % first, "EIO")
    node.ctl("fail-next", "bus/pci/devices/%s/sriov_numvfs" % second, "ENOENT")
    run = run_playbook([
        {"name": "retried", "accelops.vgpu.sriov_vfs": {"devices": [first], "method": "sriov_manage"}},
        {"name": "no sriov_configure", "block": [
            {"name": "sysfs", "accelops.vgpu.sriov_vfs": {"devices": [second], "method": "sysfs"}}],
         "rescue": [{"name": "rescued", "ansible.builtin.debug": {"msg": "refused"}}]}], node)
    assert run.task("retried")["changed"] and numvfs(node, first) == 32
    numvfs_writes = [(w["result"], w.get("errno")) for w in node.log()
                     if w["path"] == "bus/pci/devices/%s/sriov_numvfs" % first]
    assert numvfs_writes == [("error", "EIO"), ("ok", None)]
    assert run.task("sysfs")["msg"] == ("%s: its driver cannot set VFs through sysfs (no sriov_configure); "
                                        "use method sriov_manage for NVIDIA GPUs" % second)
    assert numvfs(node, second) == 0


def test_a_second_apply_on_the_node_waits_for_the_lock_then_names_its_holder(gpusim_node, run_playbook):
    node = gpusim_node("nic:1")
    with node_lock(node.root, timeout=1):
        run = run_playbook([{"name": "locked out", "accelops.vgpu.sriov_vfs": {
            "devices": node.pfs("nic"), "num_vfs": 2, "wait_timeout": 1}}], node)
    assert run.task("locked out")["msg"] == "another accelops-vgpu apply holds the node lock %s (pid %d)" % (
        lock_path(node.root), os.getpid())
    assert node.log() == []
