"""accelops.vgpu.vgpu_profile in playbooks against gpusim nodes (vendor-VFIO L40S, mdev T4 and A16)."""

import hashlib
import json
import os
import subprocess
import sys

import yaml

from ansible_collections.accelops.vgpu.tests.integration.dra_claims import prepare_claim
from ansible_collections.accelops.vgpu.tests.integration.pod_allocations import allocate_to_pod

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
CONFIGS = os.path.join(DATA, "vgpu-configs.yaml")


def vdm(selected, **options):
    """A vgpu_profile task applying one config of the VDM file, read on the controller."""
    args = {"config": "{{ lookup('ansible.builtin.file', '%s') | from_yaml }}" % CONFIGS, "selected": selected}
    args.update(options)
    return args


def enable_and_apply(profile_args):
    return [{"name": "vfs", "accelops.vgpu.sriov_vfs": {"devices": "all"}},
            {"name": "profiles", "accelops.vgpu.vgpu_profile": profile_args}]


def type_writes(node):
    """Write attempts on current_vgpu_type / mdev create+remove, as (VF or parent, value, result)."""
    found = []
    for entry in node.log():
        parts = entry["path"].split("/")
        if parts[-1] in ("current_vgpu_type", "create", "remove"):
            found.append((parts[3], entry["value"], entry["result"]))
    return found


def vgpus(result, gpu):
    return [(v["address"], v["before"], v["after"]) for g in result["gpus"] if g["address"] == gpu
            for v in g["vgpus"] if v["before"] or v["after"]]


def test_l40s_profiles_are_applied_once_and_then_left_alone(gpusim_node, run_playbook):
    node = gpusim_node("l40s:2")
    first = run_playbook(enable_and_apply(vdm("default")), node)
    assert first.rc == 0, first
    result = first.task("profiles")
    assert result["changed"]
    assert vgpus(result, "0000:41:00.0") == [("0000:41:00.4", None, "L40S-24Q"), ("0000:41:00.5", None, "L40S-24Q")]
    assert result["resources"] == [{"profile": "L40S-24Q", "type_name": "NVIDIA L40S-24Q",
                                    "resource_name": "nvidia.com/NVIDIA_L40S-24Q",
                                    "pci_vendor_selector": "10DE:26B9", "framework": "vendor-vfio", "count": 4}]
    assert [node.read("bus/pci/devices/0000:42:00.%d/nvidia/current_vgpu_type" % f) for f in (4, 5, 6)] == \
        ["1155", "1155", "0"]

    node.clear_log()
    again = run_playbook(enable_and_apply(vdm("default")), node)
    assert again.rc == 0, again
    assert [again.task(t)["changed"] for t in ("vfs", "profiles")] == [False, False]
    assert node.log() == []


def test_a_vf_a_dra_claim_uses_under_another_kubelet_dir_blocks_the_resize_in_check_mode_too(
        gpusim_node, run_playbook, tmp_path):
    node = gpusim_node("l40s:2")
    assert run_playbook(enable_and_apply(vdm("default")), node).rc == 0
    kubelet_dir = tmp_path / "var/lib/k0s/kubelet"                  # k0s keeps the kubelet's files there
    claim = prepare_claim(kubelet_dir, "0000:42:00.4", 1155)
    node.clear_log()
    for check in (True, False):
        task = {"name": "resize", "accelops.vgpu.vgpu_profile": vdm("L40S-12Q", kubelet_dir=str(kubelet_dir))}
        blocked = run_playbook([dict(task, check_mode=check)], node)
        msg = blocked.task("resize")["msg"]
        assert blocked.rc != 0 and "\n" not in msg and "0000:42:00.4" in msg and claim in msg, msg
    missing = run_playbook([{"name": "typo", "accelops.vgpu.vgpu_profile": vdm(
        "L40S-12Q", kubelet_dir=str(tmp_path / "var/lib/k0s/kublet"))}], node)
    assert missing.task("typo")["msg"] == "kubelet_dir %s: no such directory" % (tmp_path / "var/lib/k0s/kublet")
    assert node.log() == []                                          # three refusals, not one write
    assert node.read("bus/pci/devices/0000:42:00.4/nvidia/current_vgpu_type") == "1155"


def test_a_vf_the_device_plugin_allocated_to_a_pod_blocks_the_resize(gpusim_node, run_playbook, tmp_path):
    node = gpusim_node("l40s:2")
    assert run_playbook(enable_and_apply(vdm("default")), node).rc == 0
    kubelet_dir = tmp_path / "kubelet"
    pod = allocate_to_pod(kubelet_dir, "0000:42:00.4")               # allocated, its VM not started yet
    node.clear_log()
    for check in (True, False):
        task = {"name": "resize", "accelops.vgpu.vgpu_profile": vdm("L40S-12Q", kubelet_dir=str(kubelet_dir))}
        blocked = run_playbook([dict(task, check_mode=check)], node)
        msg = blocked.task("resize")["msg"]
        assert blocked.rc != 0 and "\n" not in msg and "0000:42:00.4" in msg and pod in msg, msg
    assert node.log() == []
    assert node.read("bus/pci/devices/0000:42:00.4/nvidia/current_vgpu_type") == "1155"


def test_resize_writes_only_what_changes_and_a_held_vf_blocks_it(gpusim_node, run_playbook):
    node = gpusim_node("l40s:2")
    assert run_playbook(enable_and_apply(vdm("default")), node).rc == 0
    node.hold("0000:42:00.4")
    node.clear_log()
    blocked = run_playbook([{"name": "resize", "accelops.vgpu.vgpu_profile": vdm("L40S-12Q")}], node)
    assert blocked.rc != 0 and blocked.task("resize")["failed"]
    assert "VF 0000:42:00.4 of GPU 0000:42:00.0 is held by a VM" in blocked.task("resize")["msg"]
    assert node.log() == []

    node.release("0000:42:00.4")
    resized = run_playbook([{"name": "resize", "accelops.vgpu.vgpu_profile": vdm("L40S-12Q")}], node)
    assert resized.rc == 0, resized
    assert vgpus(resized.task("resize"), "0000:41:00.0") == [
        ("0000:41:00.4", "L40S-24Q", "L40S-12Q"), ("0000:41:00.5", "L40S-24Q", "L40S-12Q"),
        ("0000:41:00.6", None, "L40S-12Q"), ("0000:41:00.7", None, "L40S-12Q")]
    writes = type_writes(node)
    for gpu in ("41", "42"):
        mine = [(vf, value) for vf, value, result in writes if vf.startswith("0000:%s:" % gpu) and result == "ok"]
        assert mine == [("0000:%s:00.4" % gpu, "0"), ("0000:%s:00.5" % gpu, "0")] + [
            ("0000:%s:00.%d" % (gpu, f), "1153") for f in (4, 5, 6, 7)]
    assert len(writes) == 12


def test_mixed_sizes_fail_without_mixed_size_and_work_with_it(gpusim_node, run_playbook):
    node = gpusim_node("l40s:1")
    assert run_playbook([{"name": "vfs", "accelops.vgpu.sriov_vfs": {"devices": "all"}}], node).rc == 0
    node.clear_log()
    refused = run_playbook([{"name": "mixed", "accelops.vgpu.vgpu_profile": vdm("first-gpu-mixed")}], node)
    assert refused.rc != 0
    assert refused.task("mixed")["msg"] == ("GPU 0000:41:00.0: profiles L40S-12Q and L40S-24Q have different "
                                            "framebuffer sizes; set mixed_size to allow that")
    assert node.log() == []
    mixed = run_playbook([{"name": "mixed", "accelops.vgpu.vgpu_profile": vdm("first-gpu-mixed", mixed_size=True)}],
                         node)
    assert mixed.rc == 0, mixed
    assert node.state()["pfs"][0]["mixed_size"] is True
    assert sorted(v["after"] for v in mixed.task("mixed")["gpus"][0]["vgpus"] if v["after"]) == \
        ["L40S-12Q", "L40S-12Q", "L40S-24Q"]


def test_t4_and_a16_through_the_same_module_with_check_and_diff(gpusim_node, run_playbook):
    node = gpusim_node("t4:1,a16:1")
    assert run_playbook([{"name": "vfs", "accelops.vgpu.sriov_vfs": {"devices": "all"}}], node).rc == 0
    node.clear_log()
    tasks = [{"name": "profiles", "accelops.vgpu.vgpu_profile": vdm("default")}]
    check = run_playbook(tasks, node, check=True, diff=True)
    assert check.rc == 0, check
    assert node.log() == []
    real = run_playbook(tasks, node, diff=True)
    assert real.rc == 0, real
    assert check.task("profiles")["changed"] is real.task("profiles")["changed"] is True
    assert check.task("profiles")["diff"] == real.task("profiles")["diff"]
    after = real.task("profiles")["diff"]["after"]
    t4, a16 = node.pfs("t4")[0], node.pfs("a16")[0]
    assert list(after[t4].values()) == ["T4-8Q", "T4-8Q"]
    assert all(key.startswith(t4 + "/") for key in after[t4])
    assert sorted(after[a16].values()) == ["A16-8Q", "A16-8Q"]
    assert sorted(key.split("/")[0] for key in after[a16]) == node.vfs(a16)[:2]
    resources = dict((r["profile"], r) for r in real.task("profiles")["resources"])
    assert resources["T4-8Q"]["count"] == 2 and resources["T4-8Q"]["framework"] == "mdev"
    assert resources["A16-8Q"]["count"] == 8 and resources["A16-8Q"]["pci_vendor_selector"] == "10DE:25B6"
    assert len(os.listdir(node.path("bus/mdev/devices"))) == 10

    node.clear_log()
    again = run_playbook(tasks, node, check=True)
    assert again.rc == 0 and not again.task("profiles")["changed"] and node.log() == []


def test_config_file_on_the_node_then_absent_removes_all(gpusim_node, run_playbook, tmp_path):
    node = gpusim_node("l40s:1")
    config = tmp_path / "vgpu.json"
    config.write_text(json.dumps({"version": "v1", "vgpu-configs": {"small": [
        {"devices": [0], "vgpu-devices": {"L40S-8Q": 6}}]}}))
    tasks = [{"name": "vfs", "accelops.vgpu.sriov_vfs": {"devices": "all"}},
             {"name": "file", "accelops.vgpu.vgpu_profile": {"config_file": str(config), "selected": "small"}},
             {"name": "absent", "accelops.vgpu.vgpu_profile": {"layout": [{"profiles": {}}], "state": "absent"}}]
    run = run_playbook(tasks, node)
    assert run.rc == 0, run
    assert run.task("file")["resources"][0]["count"] == 6
    assert [v["before"] for v in run.task("absent")["gpus"][0]["vgpus"] if v["before"]] == ["L40S-8Q"] * 6
    assert run.task("absent")["changed"] and run.task("absent")["resources"] == []
    assert all(node.read("bus/pci/devices/%s/nvidia/current_vgpu_type" % vf) == "0" for vf in node.vfs(node.pfs()[0]))


def test_enable_vfs_then_program_in_one_run_with_check_mode_first(gpusim_node, run_playbook):
    """enable_vfs: check mode on a node without VFs predicts the real run (changed, diff) and writes
    nothing; the real run enables the VFs and programs the layout; a re-run changes nothing."""
    node = gpusim_node("l40s:2")
    task = [{"name": "apply", "accelops.vgpu.vgpu_profile": vdm("default", enable_vfs=True)}]
    check = run_playbook(task, node, check=True, diff=True)
    assert check.rc == 0, check
    predicted = check.task("apply")
    assert predicted["changed"] and predicted["vfs_enabled"] == []
    assert predicted["diff"]["after"]["0000:41:00.0"] == {"vfs": "enabled", "profiles": {"L40S-24Q": 2}}
    assert node.writes() == []

    real = run_playbook(task, node)
    assert real.rc == 0, real
    assert real.task("apply")["changed"]
    assert real.task("apply")["vfs_enabled"] == ["0000:41:00.0", "0000:42:00.0"]
    for gpu in ("41", "42"):
        assert node.read("bus/pci/devices/0000:%s:00.0/sriov_numvfs" % gpu) == "32"
        assert [node.read("bus/pci/devices/0000:%s:00.%d/nvidia/current_vgpu_type" % (gpu, f)) for f in (4, 5, 6)] \
            == ["1155", "1155", "0"]
    node.clear_log()
    again = run_playbook(task, node)
    assert again.rc == 0 and not again.task("apply")["changed"]
    assert node.log() == []


def test_enable_vfs_refuses_a_layout_that_cannot_fit_before_any_write(gpusim_node, run_playbook):
    node = gpusim_node("l40s:1")
    args = {"layout": [{"profiles": {"L40S-24Q": 3}}], "enable_vfs": True}
    for check in (True, False):
        run = run_playbook([{"name": "apply", "accelops.vgpu.vgpu_profile": args}], node, check=check)
        assert run.rc != 0
        assert "L40S-24Q need 72 GB of framebuffer, the GPU has 48 GB" in run.task("apply")["msg"]
        assert node.writes() == []


def test_boot_files_are_installed_by_the_module_and_the_cli_is_the_tools_build(gpusim_node, run_playbook, tmp_path):
    """content and node_cli entries are written when missing or different (check mode: only reported);
    the node CLI is built on the node with the same bytes as tools/build-node-cli.py; checksum-only
    entries are looked at, never written."""
    node = gpusim_node("l40s:1")
    root = tmp_path / "root"
    built = tmp_path / "built.pyz"
    subprocess.run([sys.executable, os.path.join(os.path.dirname(DATA), "..", "..", "tools", "build-node-cli.py"),
                    "--without-agent", str(built)], check=True, stdout=subprocess.DEVNULL)
    files = [{"path": str(root / "etc/layout.json"), "mode": "0644", "content": "{}\n"},
             {"path": str(root / "bin/accelops-vgpu"), "mode": "0755", "node_cli": True},
             {"path": str(root / "etc/other"), "mode": "0644", "checksum": "0" * 40},
             {"path": str(root / "etc/applied.json"), "mode": "0644", "layout": True}]
    task = [{"name": "apply", "accelops.vgpu.vgpu_profile": vdm("default", enable_vfs=True, boot_files=files)}]
    check = run_playbook(task, node, check=True, diff=True)
    assert check.rc == 0, check
    assert check.task("apply")["boot_files_installed"] == [files[0]["path"], files[1]["path"], files[3]["path"]]
    assert check.task("apply")["diff"]["after"]["boot_files"][files[0]["path"]] == hashlib.sha1(b"{}\n").hexdigest()
    assert not root.exists()

    real = run_playbook(task, node)
    assert real.rc == 0, real
    result = real.task("apply")
    assert result["boot_files_outdated"] == [f["path"] for f in files]
    assert result["boot_files_installed"] == [files[0]["path"], files[1]["path"], files[3]["path"]]
    assert (root / "etc/layout.json").read_text() == "{}\n"
    with open(CONFIGS) as handle:   # the document the module applied, as JSON
        assert json.loads((root / "etc/applied.json").read_text()) == yaml.safe_load(handle)
    assert (root / "bin/accelops-vgpu").read_bytes() == built.read_bytes()
    assert oct(os.stat(root / "bin/accelops-vgpu").st_mode & 0o777) == "0o755"
    assert oct(os.stat(root / "bin").st_mode & 0o777) == "0o755"
    assert not (root / "etc/other").exists()
    assert subprocess.run([str(root / "bin/accelops-vgpu"), "--help"], capture_output=True, check=False).returncode == 0

    again = run_playbook(task, node)
    assert again.rc == 0 and not again.task("apply")["changed"]
    assert again.task("apply")["boot_files_outdated"] == [files[2]["path"]]
    assert again.task("apply")["boot_files_installed"] == []


def test_the_unit_entry_is_built_from_the_modules_options_below_the_boot_files_root(gpusim_node, run_playbook, tmp_path):
    """boot_files_root takes the files below it and leaves node-absolute paths in the unit; the unit's
    ExecStart is this run's apply (the layout and node_cli entries' paths, roots, options); a unit entry
    without its layout entry is refused before any write."""
    node = gpusim_node("l40s:1")
    root = tmp_path / "root"
    files = [{"path": "/etc/accelops-vgpu/layout.json", "mode": "0644", "layout": True},
             {"path": "/usr/local/bin/accelops-vgpu", "mode": "0755", "node_cli": True},
             {"path": "/etc/systemd/system/accelops-vgpu.service", "mode": "0644",
              "unit": {"manager_units": ["nvidia-vgpu-mgr.service"], "before_units": [], "retry_for": 30}}]
    task = [{"name": "apply", "accelops.vgpu.vgpu_profile": vdm("default", enable_vfs=True, mixed_size=True,
                                                                boot_files=files, boot_files_root=str(root))}]
    real = run_playbook(task, node)
    assert real.rc == 0, real
    assert real.task("apply")["boot_files_installed"] == [str(root) + f["path"] for f in files]
    unit = (root / "etc/systemd/system/accelops-vgpu.service").read_text().splitlines()
    command = next(line for line in unit if line.startswith("ExecStart="))[len("ExecStart="):].split()
    assert command[:6] == ["/usr/local/bin/accelops-vgpu", "apply", "--config", "/etc/accelops-vgpu/layout.json",
                           "--selected", "default"]
    assert command[command.index("--sysfs-root") + 1] == node.root and "--mixed-size" in command
    assert ["PartOf=nvidia-vgpu-mgr.service", "TimeoutStartSec=330"] == [
        line for line in unit if line.startswith(("PartOf=", "TimeoutStartSec=", "Before="))]
    assert "ConditionPathExists=/etc/accelops-vgpu/layout.json" in unit
    assert not run_playbook(task, node).task("apply")["changed"]

    node.clear_log()
    lonely = [{"path": str(tmp_path / "other/unit.service"), "mode": "0644", "unit": {}}]
    run = run_playbook([{"name": "apply", "accelops.vgpu.vgpu_profile": vdm("default", boot_files=lonely)}], node)
    assert run.rc != 0
    assert run.task("apply")["msg"] == ("boot_files: %s: the unit needs one layout entry, one node_cli entry and the "
                                        "selected option (missing or more than one: layout, node_cli)" % lonely[0]["path"])
    assert node.writes() == [] and not (tmp_path / "other").exists()

    # a value the unit cannot carry for systemd (issue 40): one line naming it, before the apply writes anything
    odd = {"version": "v1", "vgpu-configs": {"l40s-50%x": [{"devices": "all", "vgpu-devices": {"L40S-24Q": 2}}]}}
    bad = run_playbook([{"name": "apply", "accelops.vgpu.vgpu_profile": dict(
        config=odd, selected="l40s-50%x", enable_vfs=True, boot_files=files, boot_files_root=str(tmp_path / "bad"))}],
        node)
    assert bad.rc != 0 and bad.task("apply")["msg"].startswith(
        "boot unit: selected l40s-50%x is not a vgpu-device-manager config name")
    assert node.writes() == [] and not (tmp_path / "bad").exists()


def test_a_bad_boot_files_root_writes_nothing(gpusim_node, run_playbook, tmp_path):
    """A relative boot_files_root, or one that is a file, is refused naming it before the apply writes anything:
    a file there failed only when the boot files were installed, after the vGPUs; a relative one was reported
    as relative boot file paths that the task never named."""
    node = gpusim_node("l40s:1")
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    files = [{"path": "/etc/accelops-vgpu/layout.json", "mode": "0644", "layout": True}]
    for root, message in (("relative/root", "boot_files_root: 'relative/root' is not an absolute path"),
                          (str(a_file), "boot_files_root: %s is not a directory" % a_file)):
        node.clear_log()
        run = run_playbook([{"name": "apply", "accelops.vgpu.vgpu_profile": vdm(
            "default", enable_vfs=True, boot_files=files, boot_files_root=root)}], node)
        assert run.rc != 0
        assert run.task("apply")["msg"] == message
        assert node.writes() == []
    assert a_file.read_text() == "" and not (tmp_path / "relative").exists()


def test_a_bad_boot_file_entry_writes_nothing(gpusim_node, run_playbook, tmp_path):
    node = gpusim_node("l40s:1")
    files = [{"path": str(tmp_path / "layout.json"), "mode": "0644", "content": "{}"},
             {"path": str(tmp_path / "cli"), "mode": "0755", "node_cli": True, "checksum": "0" * 40}]
    run = run_playbook([{"name": "apply", "accelops.vgpu.vgpu_profile": vdm("default", enable_vfs=True,
                                                                            boot_files=files)}], node)
    assert run.rc != 0
    assert run.task("apply")["msg"] == ("boot_files: %s needs exactly one of content, layout, node_cli, unit, checksum "
                                        "(has node_cli, checksum)" % files[1]["path"])
    assert node.writes() == [] and not (tmp_path / "layout.json").exists()


def test_a_boot_file_to_remove_takes_no_content_and_a_bad_one_writes_nothing(gpusim_node, run_playbook, tmp_path):
    node = gpusim_node("l40s:1")
    handover = tmp_path / "agent-applied.json"
    handover.write_text("{}\n")
    for bad, message in (({"content": "{}"}, "boot_files: %s is to be removed, it takes none of content, layout, "
                                             "node_cli, unit, checksum (has content)" % handover),
                         ({"path": "relative.json"}, "boot_files: 'relative.json' is not an absolute path")):
        entry = dict({"path": str(handover), "mode": "0644", "remove": True}, **bad)
        run = run_playbook([{"name": "apply", "accelops.vgpu.vgpu_profile": vdm("default", enable_vfs=True,
                                                                                boot_files=[entry])}], node)
        assert run.rc != 0 and run.task("apply")["msg"] == message
        assert node.writes() == [] and handover.exists()
    # state absent checks its entries before the vGPUs are removed, too
    assert run_playbook([{"name": "apply", "accelops.vgpu.vgpu_profile": vdm("default", enable_vfs=True)}], node).rc == 0
    node.clear_log()
    bad = [{"path": str(handover), "mode": "0644", "remove": True}, {"path": "relative.json", "mode": "0644", "remove": True}]
    run = run_playbook([{"name": "apply", "accelops.vgpu.vgpu_profile": vdm("default", state="absent", boot_files=bad)}],
                       node)
    assert run.rc != 0 and run.task("apply")["msg"] == "boot_files: 'relative.json' is not an absolute path"
    assert node.writes() == [] and handover.exists()
