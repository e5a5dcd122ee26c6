"""The fake sriov-manage and nvidia-smi, and `gpusim models`."""

from __future__ import annotations

import json
import os
import re
import subprocess

from simhelpers import gpusim_cli, read, sriov_manage


def test_sriov_manage_enables_all_vfs_and_is_idempotent(gpusim_node):
    node = gpusim_node("l40s:1")
    pf = node.pfs()[0]
    first = sriov_manage(node, "-e", pf)
    assert first.stdout == "Enabling VFs on %s\n" % pf
    assert read(node.device_path(pf, "sriov_numvfs")) == "32"
    assert os.path.basename(os.readlink(node.device_path(pf, "driver"))) == "nvidia"
    node.clear_log()
    second = sriov_manage(node, "-e", pf)
    assert second.returncode == 0 and "already has VFs enabled" in second.stdout
    assert node.log() == []                                   # nothing written the second time


def test_sriov_manage_all_covers_sriov_gpus_only(gpusim_node):
    node = gpusim_node("l40s:2,t4:1,nic:1")
    result = sriov_manage(node, "-e", "ALL")
    assert result.stdout.splitlines() == ["Enabling VFs on 0000:41:00.0", "Enabling VFs on 0000:42:00.0"]
    assert read(node.device_path("0000:44:00.0", "sriov_numvfs")) == "0"     # the NIC is not NVIDIA
    sriov_manage(node, "-d", "ALL")
    assert node.vfs("0000:41:00.0") == [] and node.vfs("0000:42:00.0") == []


def test_sriov_manage_disable_blocks_at_a_held_vf(gpusim_node):
    """On a host it hangs there until the VM lets go (gpusim gives up after block-timeout)."""
    node = gpusim_node("l40s:1")
    pf = node.pfs()[0]
    sriov_manage(node, "-e", pf)
    held = node.vfs(pf)[3]
    node.hold(held)
    node.ctl("block-timeout", "0.5")
    result = sriov_manage(node, "-d", pf, check=False)
    assert result.returncode == 1 and "%s to bus/pci/drivers/nvidia/unbind failed: Connection timed out" % held \
        in result.stderr
    assert len(node.vfs(pf)) == 32


def test_sriov_manage_rejects_bad_targets(gpusim_node):
    node = gpusim_node("t4:1,nic:1")
    assert "does not support SR-IOV" in sriov_manage(node, "-e", "0000:41:00.0", check=False).stderr
    assert "is not a GPU" in sriov_manage(node, "-e", "0000:42:00.0", check=False).stderr
    assert "not found" in sriov_manage(node, "-e", "0000:99:00.0", check=False).stderr
    assert sriov_manage(node, "-x", check=False).returncode == 1


def test_nvidia_smi_query_lists_every_gpu_and_its_mode(gpusim_node):
    node = gpusim_node("l40s:1,t4:1")
    l40s, t4 = node.pfs()
    node.ctl("mixed", l40s, "1")
    out = subprocess.run(["nvidia-smi", "-q"], env=node.env, capture_output=True, text=True, check=False).stdout
    assert re.search(r"^Attached GPUs +: 2$", out, re.M)
    modes = [line.split(":")[1].strip() for line in out.splitlines() if "vGPU Heterogeneous Mode" in line]
    assert modes == ["Enabled", "Disabled"]
    refused = subprocess.run(["nvidia-smi", "vgpu", "-i", t4, "-shm", "1"], env=node.env,
                             capture_output=True, text=True, check=False)
    assert refused.returncode == 3 and "Not Supported" in refused.stdout       # Turing has no mixed mode
    assert subprocess.run(["nvidia-smi", "vgpu", "-i", "7", "-ghm"], env=node.env, check=False).returncode == 6


def test_nvidia_smi_lists_supported_types(gpusim_node):
    node = gpusim_node("l40s:1,t4:1")
    verbose = subprocess.run(["nvidia-smi", "vgpu", "-s", "-v", "-i", node.pfs()[0]], env=node.env,
                             capture_output=True, text=True, check=True).stdout.splitlines()
    ids = [int(line.split(":")[1], 16) for line in verbose if line.strip().startswith("vGPU Type ID")]
    names = [line.split(":")[1].strip() for line in verbose if line.strip().startswith("Name")]
    assert dict(zip(ids, names))[1155] == "NVIDIA L40S-24Q" and len(ids) == 23
    short = subprocess.run(["nvidia-smi", "vgpu", "-s", "-i", "1"], env=node.env, capture_output=True, text=True,
                           check=True).stdout.splitlines()
    assert short[0] == "GPU 00000000:42:00.0" and short[1].strip() == "GRID T4-1B"


def test_models_catalogue(tmp_path):
    table = gpusim_cli("models").stdout
    assert table.splitlines()[0].split()[:3] == ["MODEL", "PCI", "ID"]
    catalogue = json.loads(gpusim_cli("models", "--json").stdout)
    for key in ("l40s", "l40", "h100-pcie", "h200", "a16", "a2", "t4", "nic"):
        assert key in catalogue
    l40s = catalogue["l40s"]
    assert (l40s["pci_id"], l40s["total_vfs"], l40s["vf_offset"], l40s["framebuffer_gib"]) == ("10de:26b9", 32, 4, 48)
    names = {t["id"]: (t["name"], t["max_instances"]) for t in l40s["types"]}
    assert names[1155] == ("NVIDIA L40S-24Q", 2) and names[1147] == ("NVIDIA L40S-1Q", 32)
    assert names[2164][0] == "NVIDIA L40S-3B"
    assert {t["id"]: t["name"] for t in catalogue["h200"]["types"]}[1428] == "NVIDIA H200X-141C"
    assert catalogue["nic"]["pci_id"] == "8086:1572" and catalogue["t4"]["total_vfs"] == 0


def test_tools_are_standalone_files(tmp_path):
    out = gpusim_cli("tools", str(tmp_path)).stdout.split()
    assert sorted(os.path.basename(path) for path in out) == ["nvidia-smi", "sriov-manage"]
    for path in out:
        assert os.access(path, os.X_OK)
        source = open(path).read()
        assert source.startswith("#!/usr/bin/env python3")
        assert "import gpusim" not in source and "from gpusim" not in source     # copies into containers
    env = dict(os.environ, GPUSIM_ROOT=str(tmp_path / "nothing"))
    assert subprocess.run([str(tmp_path / "nvidia-smi"), "-q"], env=env, capture_output=True, check=False).returncode == 9
