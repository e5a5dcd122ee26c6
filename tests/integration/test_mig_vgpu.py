"""MIG-backed vGPU on simulated H100 / H200 nodes: vgpu_profile in playbooks, vgpu_facts, the node CLI
after a reboot (as accelops-vgpu.service runs it)."""

import json
import subprocess

import pytest

# pyz: the built node CLI, a fixture shared with test_node_cli
from test_node_cli import NODE_PYTHON, pyz  # noqa: F401 pylint: disable=unused-import

H100_1_20C, H100_3_40C = "1120", "1122"


def vdm(profiles, device_filter=None):
    entry = {"devices": "all", "vgpu-devices": profiles}
    if device_filter:
        entry["device-filter"] = device_filter
    return {"version": "v1", "vgpu-configs": {"mig": [entry]}}


def apply_task(profiles, name="profiles", device_filter=None, **options):
    args = {"config": vdm(profiles, device_filter), "selected": "mig"}
    args.update(options)
    return {"name": name, "accelops.vgpu.vgpu_profile": args}


ENABLE = {"name": "vfs", "accelops.vgpu.sriov_vfs": {"devices": "all"}}


def gpu_state(node, index=0):
    return node.state()["pfs"][index]


def types_of(node, pf, count):
    vfs = node.vfs(pf)[:count]
    return [node.read("bus/pci/devices/%s/nvidia/current_vgpu_type" % vf) for vf in vfs]


def test_h100_1_20c_x4_mig_mode_gis_and_vfs_then_no_writes(gpusim_node, run_playbook):
    node = gpusim_node("h100-pcie:1")
    pf = node.pfs()[0]
    assert run_playbook([ENABLE], node).rc == 0
    node.clear_log()
    check = run_playbook([apply_task({"H100-1-20C": 4})], node, check=True, diff=True)
    assert check.rc == 0, check
    planned = check.task("profiles")
    assert planned["changed"] and node.log() == [] and not gpu_state(node)["mig_mode"]
    assert planned["diff"]["before"][pf]["mig"] == {"mode": "disabled", "gpu_instances": []}
    assert planned["diff"]["after"][pf]["mig"] == {"mode": "enabled", "gpu_instances": ["1g.20gb"] * 4}
    assert [planned["diff"]["after"][pf][vf] for vf in node.vfs(pf)[:4]] == ["H100-1-20C"] * 4

    run = run_playbook([apply_task({"H100-1-20C": 4})], node)
    assert run.rc == 0, run
    result = run.task("profiles")
    assert result["changed"] and result["gpus"][0]["mig"] == {"mode": "enabled", "gpu_instances": ["1g.20gb"] * 4}
    assert result["resources"] == [{"profile": "H100-1-20C", "type_name": "NVIDIA H100-1-20C",
                                    "resource_name": "nvidia.com/NVIDIA_H100-1-20C",
                                    "pci_vendor_selector": "10DE:2331", "framework": "vendor-vfio", "count": 4}]
    state = gpu_state(node)
    assert state["mig_mode"] and [gi["name"] for gi in state["gis"]] == ["1g.20gb"] * 4
    assert sorted(gi["vf"] for gi in state["gis"]) == node.vfs(pf)[:4]
    assert types_of(node, pf, 5) == [H100_1_20C] * 4 + ["0"]
    assert len(set(node.read("bus/pci/devices/%s/nvidia/gpu_instance_id" % vf) for vf in node.vfs(pf)[:4])) == 4

    node.clear_log()
    again = run_playbook([apply_task({"H100-1-20C": 4})], node)
    assert again.rc == 0 and not again.task("profiles")["changed"]
    assert node.log() == [] and gpu_state(node)["gis"] == state["gis"]


def test_change_to_3_40c_blocked_by_a_held_vf_then_converges(gpusim_node, run_playbook):
    node = gpusim_node("h100-pcie:1")
    pf = node.pfs()[0]
    assert run_playbook([ENABLE, apply_task({"H100-1-20C": 4})], node).rc == 0
    before = gpu_state(node)["gis"]
    held = node.vfs(pf)[2]
    node.hold(held)
    node.clear_log()
    blocked = run_playbook([apply_task({"H100-3-40C": 2}, name="resize")], node)
    assert blocked.rc != 0
    assert ("VF %s of GPU %s is held by a VM" % (held, pf)) in blocked.task("resize")["msg"]
    assert node.log() == [] and gpu_state(node)["gis"] == before

    node.release(held)
    resized = run_playbook([apply_task({"H100-3-40C": 2}, name="resize")], node, diff=True)
    assert resized.rc == 0, resized
    diff = resized.task("resize")["diff"]
    assert diff["before"][pf]["mig"]["gpu_instances"] == ["1g.20gb"] * 4
    assert diff["after"][pf]["mig"]["gpu_instances"] == ["3g.40gb"] * 2
    state = gpu_state(node)
    assert [(gi["name"], gi["start"]) for gi in state["gis"]] == [("3g.40gb", 4), ("3g.40gb", 0)]
    assert types_of(node, pf, 4) == [H100_3_40C] * 2 + ["0", "0"]
    assert run_playbook([apply_task({"H100-3-40C": 2}, name="resize")], node).task("resize")["changed"] is False


def test_mixing_kinds_and_gis_that_do_not_fit_fail_before_any_write(gpusim_node, run_playbook):
    node = gpusim_node("h100-pcie:1")
    assert run_playbook([ENABLE], node).rc == 0
    node.clear_log()
    mixed = run_playbook([apply_task({"H100-3-40C": 1, "H100-40C": 1})], node)
    assert "mixes MIG-backed H100-3-40C and time-sliced H100-40C" in mixed.task("profiles")["msg"]
    assert run_playbook([apply_task({"H100-7-80C": 1})], node).rc == 0
    node.clear_log()
    too_many = run_playbook([apply_task({"H100-3-40C": 2, "H100-2-20C": 2})], node)
    assert "do not fit" in too_many.task("profiles")["msg"]
    assert node.log() == [] and [gi["name"] for gi in gpu_state(node)["gis"]] == ["7g.80gb"]


# ---- across MIG mode in one run (issue 24) ----------------------------------------------------------

H100_20C, H100_40C = "1115", "1116"


def test_mig_to_time_sliced_is_one_plan_in_check_mode_then_one_run_and_back(gpusim_node, run_playbook):
    node = gpusim_node("h100-pcie:1")
    pf = node.pfs()[0]
    assert run_playbook([ENABLE, apply_task({"H100-1-20C": 4})], node).rc == 0
    vfs_before = node.vfs(pf)
    node.clear_log()
    check = run_playbook([apply_task({"H100-20C": 4})], node, check=True, diff=True)
    assert check.rc == 0, check
    planned = check.task("profiles")
    assert planned["changed"] and node.log() == [] and gpu_state(node)["mig_mode"]
    assert planned["diff"]["before"][pf]["mig"] == {"mode": "enabled", "gpu_instances": ["1g.20gb"] * 4}
    assert planned["diff"]["after"][pf]["mig"] == {"mode": "disabled", "gpu_instances": []}
    assert [(planned["diff"]["before"][pf][vf], planned["diff"]["after"][pf][vf]) for vf in vfs_before[:4]] == [
        ("H100-1-20C", "H100-20C")] * 4

    run = run_playbook([apply_task({"H100-20C": 4})], node, diff=True)
    assert run.rc == 0, run
    result = run.task("profiles")
    assert result["changed"] and result["vfs_enabled"] == [pf]
    assert result["gpus"][0]["mig"] == {"mode": "disabled", "gpu_instances": []}
    assert result["diff"]["before"][pf]["mig"]["mode"] == "enabled"
    assert [result["diff"]["after"][pf][vf] for vf in vfs_before[:4]] == ["H100-20C"] * 4
    state = gpu_state(node)
    assert not state["mig_mode"] and state["gis"] == [] and node.vfs(pf) == vfs_before
    assert types_of(node, pf, 5) == [H100_20C] * 4 + ["0"]
    # the order the driver needs, each step once: clears, GIs gone, VFs off, MIG off (gpusim refuses
    # -mig 0 while VFs or GIs exist), VFs on, the types
    paths = [e["path"] for e in node.writes()]
    numvfs = "bus/pci/devices/%s/sriov_numvfs" % pf
    first_set = next(i for i, p in enumerate(paths) if p.endswith("current_vgpu_type") and i > paths.index(numvfs))
    assert paths.index(numvfs) < first_set

    node.clear_log()
    again = run_playbook([apply_task({"H100-20C": 4})], node)
    assert again.rc == 0 and not again.task("profiles")["changed"] and node.log() == []
    back = run_playbook([apply_task({"H100-1-20C": 4})], node)
    assert back.rc == 0, back
    assert gpu_state(node)["mig_mode"] and types_of(node, pf, 5) == [H100_1_20C] * 4 + ["0"]


def test_mig_to_time_sliced_with_a_held_vf_is_refused_naming_it_before_any_write(gpusim_node, run_playbook):
    node = gpusim_node("h100-pcie:1")
    pf = node.pfs()[0]
    assert run_playbook([ENABLE, apply_task({"H100-1-20C": 2})], node).rc == 0
    typed, free = node.vfs(pf)[1], node.vfs(pf)[3]
    pid = node.hold(free)   # a VM holding even a VF without a vGPU keeps the VFs (and so MIG mode) in place
    before = node.state()["pfs"]
    node.clear_log()
    for check in (True, False):
        run = run_playbook([apply_task({"H100-40C": 2})], node, check=check)
        assert run.rc != 0
        assert run.task("profiles")["msg"] == (
            "GPU %s is in MIG mode; time-sliced H100-40C needs it off, which needs its VFs disabled, but VF %s is "
            "held by a VM (pid %s)" % (pf, free, pid))
    node.release(free)
    pid = node.hold(typed)
    run = run_playbook([apply_task({"H100-40C": 2})], node)
    assert run.task("profiles")["msg"] == ("VF %s of GPU %s is held by a VM (pid %s) and has H100-1-20C; the layout "
                                           "needs it changed" % (typed, pf, pid))
    assert node.log() == [] and node.state()["pfs"] == before


def test_l40s_cannot_take_a_mig_backed_profile(gpusim_node, run_playbook):
    node = gpusim_node("l40s:1")
    assert run_playbook([ENABLE], node).rc == 0
    run = run_playbook([{"name": "profiles", "accelops.vgpu.vgpu_profile": {
        "layout": [{"profiles": {"L40S-1-24C": 1}}]}}], node)
    assert "profile L40S-1-24C is MIG-backed, but the GPU has no MIG mode" in run.task("profiles")["msg"]


def test_gis_of_released_types_are_kept_when_asked(gpusim_node, run_playbook):
    node = gpusim_node("h100-pcie:1")
    assert run_playbook([ENABLE, apply_task({"H100-1-10C": 3}, mig_compute_instances=False)], node).rc == 0
    assert [gi["compute_instance"] for gi in gpu_state(node)["gis"]] == [False] * 3
    kept = run_playbook([apply_task({"H100-1-10C": 1}, mig_gi_cleanup="keep")], node)
    assert kept.rc == 0, kept
    assert [gi["name"] for gi in gpu_state(node)["gis"]] == ["1g.10gb"] * 3
    destroyed = run_playbook([apply_task({"H100-1-10C": 1})], node)
    assert destroyed.rc == 0 and [gi["name"] for gi in gpu_state(node)["gis"]] == ["1g.10gb"]


def test_vgpu_facts_report_mig_mode_and_gpu_instances(gpusim_node, run_playbook):
    node = gpusim_node("h100-pcie:1,l40s:1")
    h100, l40s = node.pfs()
    assert run_playbook([ENABLE, apply_task({"H100-2-20C": 2}, device_filter="0x233110DE")], node).rc == 0
    run = run_playbook([{"name": "facts", "accelops.vgpu.vgpu_facts": {}}], node)
    assert run.rc == 0, run
    facts = run.task("facts")["ansible_facts"]["vgpu"]
    gpus = dict((g["address"], g) for g in facts["gpus"])
    assert gpus[h100]["mig_mode"] == "enabled" and gpus[l40s]["mig_mode"] is None
    assert [(gi["name"], gi["profile_id"], gi["placement"]) for gi in gpus[h100]["gpu_instances"]] == [
        ("2g.20gb", 14, "4:2"), ("2g.20gb", 14, "2:2")]
    vfs = dict((v["address"], v) for v in facts["vfs"])
    first = vfs[node.vfs(h100)[0]]
    assert first["vgpu_type"] == "NVIDIA H100-2-20C" and first["gpu_instance_id"] == gpus[h100]["gpu_instances"][0]["id"]


# ---- the node CLI, as accelops-vgpu.service runs it --------------------------------------------------

def write_layout(tmp_path, profiles, name="layout.json"):
    path = str(tmp_path / name)
    with open(path, "w") as handle:
        json.dump(vdm(profiles), handle)
    return path


@pytest.mark.parametrize("spec,mig_profiles,sliced,gi_names", [
    ("h100-pcie:1", {"H100-1-20C": 4}, {"H100-20C": 4}, ["1g.20gb"] * 4),
    ("h200:1", {"H200X-1-18C": 7}, {"H200X-35C": 4}, ["1g.18gb"] * 7),
])
def test_the_node_cli_goes_from_mig_to_time_sliced_and_back_in_one_apply_each(
        gpusim_node, pyz, tmp_path, spec, mig_profiles, sliced, gi_names):
    node = gpusim_node(spec)
    pf = node.pfs()[0]
    mig_layout, sliced_layout = write_layout(tmp_path, mig_profiles, "mig.json"), write_layout(tmp_path, sliced)
    assert cli(pyz, node, mig_layout, "apply").returncode == 0
    assert sorted(gi["name"] for gi in gpu_state(node)["gis"]) == sorted(gi_names)
    node.clear_log()
    planned = cli(pyz, node, sliced_layout, "apply", "--check", "--json")
    assert planned.returncode == 0, planned.stderr
    assert json.loads(planned.stdout)["diff"]["after"][pf]["mig"] == {"mode": "disabled", "gpu_instances": []}
    assert node.log() == [] and gpu_state(node)["mig_mode"]
    assert cli(pyz, node, sliced_layout, "assert").returncode == 1

    done = cli(pyz, node, sliced_layout, "apply", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["vfs_enabled"] == [pf]
    state = gpu_state(node)
    assert not state["mig_mode"] and state["gis"] == []
    assert cli(pyz, node, sliced_layout, "assert").returncode == 0

    back = cli(pyz, node, mig_layout, "apply")
    assert back.returncode == 0, back.stderr
    assert sorted(gi["name"] for gi in gpu_state(node)["gis"]) == sorted(gi_names)
    assert cli(pyz, node, mig_layout, "assert").returncode == 0


def test_the_node_cli_refuses_to_leave_mig_mode_while_a_vm_holds_a_vf(gpusim_node, pyz, tmp_path):
    node = gpusim_node("h200:1")
    pf = node.pfs()[0]
    assert cli(pyz, node, write_layout(tmp_path, {"H200X-1-18C": 2}, "mig.json"), "apply").returncode == 0
    held = node.vfs(pf)[5]   # no vGPU on it, but a VM has it open: the VFs cannot be disabled
    node.hold(held)
    node.clear_log()
    refused = cli(pyz, node, write_layout(tmp_path, {"H200X-35C": 2}), "apply")
    assert refused.returncode != 0
    assert ("GPU %s is in MIG mode; time-sliced H200X-35C needs it off, which needs its VFs disabled, but VF %s is "
            "held by a VM" % (pf, held)) in refused.stderr
    assert node.log() == [] and gpu_state(node)["mig_mode"] and len(gpu_state(node)["gis"]) == 2


def cli(pyz, node, config, *args):
    argv = [NODE_PYTHON, pyz, args[0], "--config", config, "--selected", "mig", "--sysfs-root", node.root,
            "--dev-root", node.dev_root] + list(args[1:])
    return subprocess.run(argv, env=node.env, capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.parametrize("spec,profiles,gi_names,order", [
    ("h100-pcie:1", {"H100-1-20C": 4}, ["1g.20gb"] * 4, "after-vfs"),
    ("h200:1", {"H200X-1-18C": 7}, ["1g.18gb"] * 7, "before-vfs"),
    ("h200-nvl:1", {"H200-3-71C": 1, "H200-4-71C": 1}, ["3g.71gb", "4g.71gb"], "after-vfs"),
])
def test_reboot_then_the_boot_command_restores_mig_mode_gis_and_types(
        gpusim_node, pyz, tmp_path, spec, profiles, gi_names, order):
    node = gpusim_node(spec)
    config = str(tmp_path / "layout.json")
    with open(config, "w") as handle:
        json.dump(vdm(profiles), handle)
    first = cli(pyz, node, config, "apply", "--mig-mode-order", order)
    assert first.returncode == 0, first.stderr
    assert cli(pyz, node, config, "assert").returncode == 0
    applied = gpu_state(node)

    node.ctl("reboot")
    after_reboot = cli(pyz, node, config, "assert")
    assert after_reboot.returncode == 1 and "SR-IOV VFs are not enabled" in after_reboot.stdout
    assert not gpu_state(node)["mig_mode"] and gpu_state(node)["gis"] == []

    restored = cli(pyz, node, config, "apply", "--json", "--mig-mode-order", order)
    assert restored.returncode == 0, restored.stderr
    assert json.loads(restored.stdout)["vfs_enabled"] == [node.pfs()[0]]
    state = gpu_state(node)
    assert state["mig_mode"] and sorted(gi["name"] for gi in state["gis"]) == sorted(gi_names)
    assert state["gis"] == applied["gis"]
    assert cli(pyz, node, config, "assert").returncode == 0
    node.clear_log()
    assert json.loads(cli(pyz, node, config, "apply", "--json").stdout)["changed"] is False
    assert node.log() == []


def test_a_gpu_left_in_mig_mode_without_vfs_gets_a_time_sliced_layout_in_one_apply(gpusim_node, pyz, tmp_path):
    """A run stopped half-way (VFs disabled, MIG mode still on), or MIG mode set before the VFs: the next
    apply enables the VFs, then takes the GPU out of MIG mode in a second round, then types the VFs. The
    creatable lists in MIG mode name no time-sliced type, so they complete no type catalog."""
    node = gpusim_node("h100-pcie:1")
    pf = node.pfs()[0]
    node.ctl("mig", pf, "1")
    assert gpu_state(node)["mig_mode"] and node.vfs(pf) == []
    layout = write_layout(tmp_path, {"H100-20C": 4})
    done = cli(pyz, node, layout, "apply", "--json", "--lock-timeout", "60")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["vfs_enabled"] == [pf, pf]   # enabled, then enabled again around -mig 0
    assert not gpu_state(node)["mig_mode"] and types_of(node, pf, 5) == [H100_20C] * 4 + ["0"]
    assert cli(pyz, node, layout, "assert").returncode == 0
