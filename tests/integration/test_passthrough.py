"""Issue 32 item 1: a GPU passed through whole (bound to vfio-pci, held by its VM) on a node whose other GPUs
are vGPU hosts. Every path that enables VFs (sriov_vfs, vgpu_profile, vgpu_facts, the node CLI, the boot unit's
apply) programs the vGPU GPU and leaves the passthrough one as it is: gpusim's driver link stays vfio-pci and
the write log has no write naming it. Naming it is a one-line error; `take_over` is refused while its VM runs."""

import json
import os
import subprocess

from ansible_collections.accelops.vgpu.tests.integration.test_node_cli import cli, pyz  # noqa: F401 pylint: disable=unused-import

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
CONFIGS = os.path.join(DATA, "vgpu-configs.yaml")
VGPU, PASSED = "0000:41:00.0", "0000:42:00.0"
REASON = "bound to vfio-pci, not to the vGPU host driver nvidia (reserved for whole-GPU passthrough)"
SKIPPED = [{"address": PASSED, "driver": "vfio-pci", "reason": REASON}]


def passthrough_node(gpusim_node):
    """l40s:2 with the second GPU bound to vfio-pci (driverctl's writes) and held by its VM; log cleared."""
    node = gpusim_node("l40s:2")
    node.bind(PASSED, "vfio-pci")
    pid = node.hold(PASSED)
    node.clear_log()
    return node, pid


def driver(node, address):
    return os.path.basename(os.readlink(node.device_path(address, "driver")))


def touching(node, address=PASSED):
    """Every write attempt (also refused ones) to the GPU or one of its functions, or naming it in a value."""
    bus = address[:8]
    return [e for e in node.log() if bus in e["path"] or bus in str(e["value"])]


def assert_untouched(node):
    assert driver(node, PASSED) == "vfio-pci"
    assert node.read("bus/pci/devices/%s/sriov_numvfs" % PASSED) == "0"
    assert touching(node) == []


def vdm(selected="default"):
    return {"config": "{{ lookup('ansible.builtin.file', '%s') | from_yaml }}" % CONFIGS, "selected": selected}


def test_the_modules_program_the_vgpu_gpu_and_leave_the_passthrough_one_alone(gpusim_node, run_playbook):
    node, dummy = passthrough_node(gpusim_node)
    tasks = [{"name": "facts", "accelops.vgpu.vgpu_facts": {}},
             {"name": "vfs", "accelops.vgpu.sriov_vfs": {"devices": "all"}},
             {"name": "profiles", "accelops.vgpu.vgpu_profile": dict(vdm(), enable_vfs=True)}]
    checked = run_playbook(tasks, node, check=True)
    assert checked.rc == 0, checked
    assert node.log() == []
    assert checked.task("vfs")["reserved"] == SKIPPED == checked.task("profiles")["reserved"]
    assert [p["address"] for p in checked.task("vfs")["pfs"]] == [VGPU]
    run = run_playbook(tasks, node)
    assert run.rc == 0, run
    gpus = dict((g["address"], g) for g in run.task("facts")["ansible_facts"]["vgpu"]["gpus"])
    assert gpus[PASSED]["reserved"] == REASON and gpus[PASSED]["driver"] == "vfio-pci" and gpus[PASSED]["held"]
    assert gpus[VGPU]["reserved"] is None and not gpus[VGPU]["held"]
    assert run.task("vfs")["reserved"] == SKIPPED and run.task("vfs")["changed"]
    assert "%s: skipped: %s" % (PASSED, REASON) in " ".join(run.task("vfs")["warnings"])
    assert run.task("profiles")["reserved"] == SKIPPED
    assert [g["address"] for g in run.task("profiles")["gpus"]] == [VGPU]
    assert node.read("bus/pci/devices/0000:41:00.4/nvidia/current_vgpu_type") == "1155"
    assert_untouched(node)


def test_naming_the_passthrough_gpu_is_a_one_line_error_and_take_over_waits_for_its_vm(gpusim_node, run_playbook):
    node, pid = passthrough_node(gpusim_node)
    tasks = [{"name": "by address", "accelops.vgpu.sriov_vfs": {"devices": ["42:00.0"]}, "ignore_errors": True},
             {"name": "by index", "accelops.vgpu.vgpu_profile": {
                 "layout": [{"devices": [1], "profiles": {"L40S-24Q": 1}}], "enable_vfs": True}, "ignore_errors": True},
             {"name": "held", "accelops.vgpu.sriov_vfs": {"devices": [PASSED], "take_over": [PASSED]},
              "ignore_errors": True}]
    for check in (True, False):
        run = run_playbook(tasks, node, check=check)
        assert run.task("by address")["msg"] == "devices: %s is %s; it is left alone (take_over, on the CLI " \
            "--take-over, lets the engine rebind it)" % (PASSED, REASON)
        assert run.task("by index")["msg"].startswith("layout[0]: devices: GPU index 1 (%s) is %s" % (PASSED, REASON))
        assert run.task("held")["msg"] == "take_over: %s is held (pid %d); not rebinding a GPU a VM uses" % (PASSED, pid)
        assert node.log() == []
    assert_untouched(node)
    node.release(PASSED)        # the VM is gone: an explicit take-over may rebind the GPU
    taken = run_playbook([{"name": "take", "accelops.vgpu.sriov_vfs": {"devices": [PASSED], "take_over": [PASSED]}}],
                         node)
    assert taken.rc == 0 and taken.task("take")["changed"], taken
    assert driver(node, PASSED) == "nvidia" and node.read("bus/pci/devices/%s/sriov_numvfs" % PASSED) == "32"


def test_the_cli_and_the_boot_units_apply_skip_the_passthrough_gpu(gpusim_node, pyz, tmp_path):  # noqa: F811
    node, pid = passthrough_node(gpusim_node)
    config = ["--config", CONFIGS, "--selected", "default"]
    checked = cli(pyz, node, "apply", "--check", *config)
    assert checked.returncode == 0, checked.stderr
    assert "warning: GPU %s: skipped: %s" % (PASSED, REASON) in checked.stderr.splitlines()
    assert node.log() == []
    state = tmp_path / "boot-state.json"      # what accelops-vgpu.service runs (boot_files.py's unit)
    applied = cli(pyz, node, "apply", "--json", "--retry-for", "5", "--state-file", str(state), *config)
    assert applied.returncode == 0, applied.stderr
    result = json.loads(applied.stdout)
    assert result["reserved"] == SKIPPED and result["vfs_enabled"] == [VGPU]
    recorded = json.loads(state.read_text())
    assert recorded["state"] == "applied" and recorded["reserved"] == SKIPPED
    assert cli(pyz, node, "assert", *config).returncode == 0      # the layout holds: the passthrough GPU is no gap
    named = cli(pyz, node, "apply", "--config", "-", stdin=json.dumps([{"devices": [PASSED], "profiles": {"L40S-24Q": 1}}]))
    assert named.returncode == 2 and named.stderr.count("\n") == 1
    assert "devices: %s is %s" % (PASSED, REASON) in named.stderr
    assert_untouched(node)
    idle = cli(pyz, node, "idle")     # its VM does not use the vGPU stack: the manager may be restarted
    assert idle.returncode == 0, idle.stdout
    assert pid


def test_the_fake_sriov_manage_moves_a_passthrough_gpu_as_the_real_one_does(gpusim_node):
    """Why the engine must never hand such a GPU to sriov-manage: `-e` unbinds whatever driver the PF has."""
    node = gpusim_node("l40s:2")
    node.bind(PASSED, "vfio-pci")
    subprocess.run(["sriov-manage", "-e", PASSED], env=node.env, check=True, capture_output=True)
    assert driver(node, PASSED) == "nvidia"
