"""The built node CLI zipapp (what the boot unit and the vGPU manager image run) on a gpusim node."""

import json
import os
import subprocess

import pytest

from ansible_collections.accelops.vgpu.tests.integration.pod_allocations import allocate_to_pod

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = os.path.join(REPO, "tests", "integration", "data", "vgpu-configs.yaml")
# The node's Python (Debian's 3.11 in the containers), not the controller's venv.
NODE_PYTHON = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else os.path.join(REPO, ".venv", "bin", "python")


@pytest.fixture(scope="module")
def pyz(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("cli") / "accelops-vgpu.pyz")
    subprocess.run([NODE_PYTHON, os.path.join(REPO, "tools", "build-node-cli.py"), out], check=True,
                   capture_output=True)
    return out


def cli(pyz, node, *args, stdin=None):
    argv = [NODE_PYTHON, pyz] + list(args) + ["--sysfs-root", node.root, "--dev-root", node.dev_root]
    return subprocess.run(argv, env=node.env, capture_output=True, text=True, input=stdin, timeout=300, check=False)


def test_assert_fails_after_a_reboot_and_apply_restores_the_layout(gpusim_node, pyz):
    node = gpusim_node("l40s:2")
    config = ["--config", CONFIGS, "--selected", "default"]
    before = cli(pyz, node, "assert", *config)
    assert before.returncode == 1 and "SR-IOV VFs are not enabled" in before.stdout

    applied = cli(pyz, node, "apply", *config)
    assert applied.returncode == 0, applied.stderr
    assert "0000:41:00.0: enabled SR-IOV VFs" in applied.stdout
    assert cli(pyz, node, "assert", *config).returncode == 0

    node.ctl("reboot")
    after_reboot = cli(pyz, node, "assert", *config)
    assert after_reboot.returncode == 1
    assert after_reboot.stdout.splitlines() == ["GPU 0000:41:00.0: SR-IOV VFs are not enabled",
                                                "GPU 0000:42:00.0: SR-IOV VFs are not enabled"]
    restored = cli(pyz, node, "apply", "--json", *config)
    assert restored.returncode == 0, restored.stderr
    assert json.loads(restored.stdout)["vfs_enabled"] == ["0000:41:00.0", "0000:42:00.0"]
    assert cli(pyz, node, "assert", *config).returncode == 0
    assert node.read("bus/pci/devices/0000:42:00.5/nvidia/current_vgpu_type") == "1155"


def test_export_feeds_back_into_apply_through_stdin(gpusim_node, pyz):
    node = gpusim_node("l40s:1")
    assert cli(pyz, node, "apply", "--config", "-", stdin=json.dumps(
        [{"profiles": {"L40S-12Q": 3}}])).returncode == 0
    exported = cli(pyz, node, "export")
    assert json.loads(exported.stdout) == {"layout": [{"devices": ["0000:41:00.0"], "profiles": {"L40S-12Q": 3}}]}
    node.clear_log()
    again = cli(pyz, node, "apply", "--json", "--config", "-", stdin=exported.stdout)
    assert again.returncode == 0 and not json.loads(again.stdout)["changed"]
    assert node.log() == []


def test_a_vgpu_allocated_to_a_pod_but_not_opened_is_not_retyped_nor_stopped(gpusim_node, pyz, tmp_path):
    """Between the kubelet's Allocate and QEMU opening the VF no process holds it: the device plugin's record does."""
    node = gpusim_node("l40s:2")
    assert cli(pyz, node, "apply", "--config", CONFIGS, "--selected", "default").returncode == 0
    kubelet_dir = tmp_path / "kubelet"
    pod = allocate_to_pod(kubelet_dir, "0000:42:00.4")
    node.clear_log()
    relabel = cli(pyz, node, "apply", "--config", CONFIGS, "--selected", "L40S-12Q", "--kubelet-dir", str(kubelet_dir))
    assert relabel.returncode != 0 and "0000:42:00.4" in relabel.stderr + relabel.stdout
    assert pod in relabel.stderr + relabel.stdout
    idle = cli(pyz, node, "idle", "--kubelet-dir", str(kubelet_dir))     # the manager image's stop asks this
    assert idle.returncode == 1 and "in use: 0000:42:00.4 held by %s" % pod in idle.stdout
    assert node.log() == []
    assert node.read("bus/pci/devices/0000:42:00.4/nvidia/current_vgpu_type") == "1155"


def test_check_says_a_gpu_awaits_its_vfs_layout_and_claim_time_alike(gpusim_node, pyz, tmp_path):
    node = gpusim_node("l40s:2")
    kubelet = tmp_path / "kubelet"
    modes = kubelet / "plugins" / "vgpu.accelops.io" / "claim-time-gpus.json"
    modes.parent.mkdir(parents=True)
    modes.write_text(json.dumps({"gpus": ["0000:42:00.0"]}))     # the agent made GPU 1 claim-time
    node.clear_log()
    run = cli(pyz, node, "apply", "--check", "--kubelet-dir", str(kubelet), "--config", "-",
              stdin=json.dumps([{"profiles": {"L40S-24Q": 2}}]))
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == [
        "0000:41:00.0 (L40S): awaits SR-IOV VFs: would enable them, then create 2 x L40S-24Q",
        "0000:42:00.0 (L40S, claim-time): awaits SR-IOV VFs: would enable them"]   # issue 40: apply enables them
    assert node.log() == []


def test_after_a_reboot_the_boot_units_apply_enables_a_claim_time_gpus_vfs(gpusim_node, pyz, tmp_path):
    """Issue 40 item 3: the boot unit's command knows the claim-time GPUs from the agent's modes file (under the
    kubelet directory, which survives the reboot); it enables their VFs (check mode: the same verdict, no write)."""
    node = gpusim_node("l40s:2")
    record = tmp_path / "kubelet" / "plugins" / "vgpu.accelops.io" / "claim-time-gpus.json"
    record.parent.mkdir(parents=True)
    record.write_text('{"gpus": ["0000:42:00.0"]}\n')      # what the agent's last apply recorded
    config = ["--config", CONFIGS, "--selected", "default", "--kubelet-dir", str(tmp_path / "kubelet"), "--json"]
    assert cli(pyz, node, "apply", *config).returncode == 0
    node.ctl("reboot")
    node.clear_log()
    checked = cli(pyz, node, "apply", "--check", *config)
    assert checked.returncode == 0 and json.loads(checked.stdout)["changed"] is True and node.log() == []
    applied = cli(pyz, node, "apply", *config)
    assert applied.returncode == 0, applied.stderr
    result = json.loads(applied.stdout)
    assert result["vfs_enabled"] == ["0000:41:00.0", "0000:42:00.0"] and result["claim_time"][0]["vfs"] == 32
    assert {node.read("bus/pci/devices/%s/nvidia/current_vgpu_type" % vf) for vf in node.vfs("0000:42:00.0")} == {"0"}
    assert "SR-IOV VFs are not enabled" not in applied.stderr
