"""MIG-backed vGPU on Hopper: MIG mode per GPU, GPU instances, MIG-backed types per VF (brief §11)."""

from __future__ import annotations

import errno
import subprocess

import pytest

from gpusim import daemon
from simhelpers import creatable_ids, enable_vfs, gpusim_cli, read, write, write_fails

H100_1_10C, H100_1_20C, H100_3_40C, H100_20C = 1118, 1120, 1122, 1115
H200X_1_18C = 1414


def smi(node, *args):
    return subprocess.run(["nvidia-smi", *args], env=node.env, capture_output=True, text=True, check=False)


def mig_on(node, pf):
    result = smi(node, "-i", pf, "-mig", "1")
    assert result.returncode == 0, result.stdout
    return result


def rows(text):
    """Table lines with runs of blanks squeezed (column widths are not what the tests are about)."""
    return [" ".join(line.split()) for line in text.splitlines()]


def gis(node, pf):
    return next(g for g in node.state()["pfs"] if g["address"] == pf)["gis"]


def test_mig_mode_per_gpu_and_query(gpusim_node):
    node = gpusim_node("h100-pcie:2,l40s:1")
    first, second, l40s = node.pfs()
    assert mig_on(node, first).stdout.splitlines() == ["Enabled MIG Mode for GPU 00000000:41:00.0", "All done."]
    out = smi(node, "--query-gpu=pci.bus_id,mig.mode.current", "--format=csv,noheader").stdout.splitlines()
    assert out == ["00000000:41:00.0, Enabled", "00000000:42:00.0, Disabled", "00000000:43:00.0, [N/A]"]
    refused = smi(node, "-i", l40s, "-mig", "1")
    assert refused.returncode == 3 and "Not Supported" in refused.stdout


def test_vfs_list_mig_types_only_where_a_free_gi_fits(gpusim_node):
    node = gpusim_node("h100-pcie:1")
    pf = node.pfs()[0]
    vfs = enable_vfs(node, pf)
    assert H100_20C in creatable_ids(node, vfs[0]) and H100_1_20C not in creatable_ids(node, vfs[0])
    write_fails(node.device_path(vfs[0], "nvidia/current_vgpu_type"), H100_1_20C, errno.EIO)
    mig_on(node, pf)
    assert creatable_ids(node, vfs[0]) == []                     # MIG mode, no GI yet: nothing creatable
    created = smi(node, "mig", "-i", pf, "-cgi", "15,15", "-C")
    assert created.returncode == 0, created.stdout
    assert "Successfully created GPU instance ID  1 on GPU  0 using profile MIG 1g.20gb (ID 15)" in created.stdout
    assert creatable_ids(node, vfs[0]) == [H100_1_20C]             # time-sliced types gone in MIG mode
    write_fails(node.device_path(vfs[0], "nvidia/current_vgpu_type"), H100_20C, errno.EINVAL)
    write(node.device_path(vfs[0], "nvidia/current_vgpu_type"), H100_1_20C)
    assert read(node.device_path(vfs[0], "nvidia/gpu_instance_id")) == "1"
    assert read(node.device_path(vfs[0], "nvidia/placement_id")) == "6"     # highest free start first
    write(node.device_path(vfs[1], "nvidia/current_vgpu_type"), H100_1_20C)
    assert read(node.device_path(vfs[1], "nvidia/gpu_instance_id")) == "2"
    assert creatable_ids(node, vfs[2]) == []                        # both GIs taken
    write_fails(node.device_path(vfs[2], "nvidia/current_vgpu_type"), H100_1_20C, errno.EIO)
    assert [gi["vf"] for gi in gis(node, pf)] == vfs[:2]


def test_gpu_instance_id_is_an_output(gpusim_node):
    node = gpusim_node("h100-pcie:1")
    pf = node.pfs()[0]
    vf = enable_vfs(node, pf)[0]
    mig_on(node, pf)
    smi(node, "mig", "-i", pf, "-cgi", "19", "-C")
    write_fails(node.device_path(vf, "nvidia/gpu_instance_id"), "1", errno.ENXIO)
    write(node.device_path(vf, "nvidia/current_vgpu_type"), H100_1_10C)
    write(node.device_path(vf, "nvidia/gpu_instance_id"), "1")       # the value it shows: accepted
    write_fails(node.device_path(vf, "nvidia/gpu_instance_id"), "2", errno.EINVAL)


def test_placements_and_limits(gpusim_node):
    node = gpusim_node("h100-pcie:1")
    pf = node.pfs()[0]
    mig_on(node, pf)
    assert smi(node, "mig", "-i", pf, "-cgi", "9,9", "-C").returncode == 0
    full = smi(node, "mig", "-i", pf, "-cgi", "19")
    assert full.returncode == 1 and "Insufficient Resources" in full.stdout
    listed = rows(smi(node, "mig", "-i", pf, "-lgi").stdout)
    assert "| 0 MIG 3g.40gb 9 1 4:4 |" in listed and "| 0 MIG 3g.40gb 9 2 0:4 |" in listed
    assert "GPU 0 Profile ID 9 Placements: {0,4}:4" in rows(smi(node, "mig", "-i", pf, "-lgipp").stdout)
    profiles = rows(smi(node, "mig", "-i", pf, "-lgip").stdout)
    assert "| 0 MIG 3g.40gb 9 0/2 39.50 No 60 3 0 |" in profiles
    assert "| 0 MIG 1g.10gb 19 0/7 9.75 No 16 1 0 |" in profiles
    assert smi(node, "mig", "-i", pf, "-dci", "-gi", "2").returncode == 0
    assert smi(node, "mig", "-i", pf, "-dgi", "-gi", "2").returncode == 0
    # 3g.40gb at 4:4 left: 1g fits at starts 0..3
    assert "| 0 MIG 1g.10gb 19 4/7 9.75 No 16 1 0 |" in rows(smi(node, "mig", "-i", pf, "-lgip").stdout)
    only_me = smi(node, "mig", "-i", pf, "-cgi", "20,20")              # one media-extension GI per GPU
    assert only_me.returncode == 1 and [gi["name"] for gi in gis(node, pf)] == ["3g.40gb", "1g.10gb+me"]


def test_gi_with_a_vgpu_or_compute_instance_is_not_destroyed(gpusim_node):
    node = gpusim_node("h100-pcie:1")
    pf = node.pfs()[0]
    vfs = enable_vfs(node, pf)
    mig_on(node, pf)
    smi(node, "mig", "-i", pf, "-cgi", "19", "-C")
    busy = smi(node, "mig", "-i", pf, "-dgi", "-gi", "1")
    assert busy.returncode == 1 and "In use by another client" in busy.stdout     # its compute instance first
    write(node.device_path(vfs[0], "nvidia/current_vgpu_type"), H100_1_10C)
    assert "In use by another client" in smi(node, "mig", "-i", pf, "-dci", "-gi", "1").stdout
    write(node.device_path(vfs[0], "nvidia/current_vgpu_type"), "0")              # release keeps the GI
    assert [gi["id"] for gi in gis(node, pf)] == [1]
    assert smi(node, "mig", "-i", pf, "-dci").returncode == 0
    assert smi(node, "mig", "-i", pf, "-dgi").returncode == 0 and gis(node, pf) == []


def test_mig_mode_rules(gpusim_node):
    node = gpusim_node("h100-pcie:1")
    pf = node.pfs()[0]
    vfs = enable_vfs(node, pf)
    node.hold(vfs[4])
    held = smi(node, "-i", pf, "-mig", "1")
    assert held.returncode == 1 and "In use by another client" in held.stdout
    node.release(vfs[4])
    write(node.device_path(vfs[0], "nvidia/current_vgpu_type"), H100_20C)
    assert "In use by another client" in smi(node, "-i", pf, "-mig", "1").stdout   # time-sliced vGPUs exist
    write(node.device_path(vfs[0], "nvidia/current_vgpu_type"), "0")
    mig_on(node, pf)
    refused = smi(node, "-i", pf, "-mig", "0")
    assert refused.returncode == 1 and "In use by another client" in refused.stdout   # VFs exist (cubecos)
    subprocess.run(["sriov-manage", "-d", pf], env=node.env, check=True, capture_output=True)
    assert smi(node, "-i", pf, "-mig", "0").returncode == 0


def test_sriov_manage_wipes_gis_and_reboot_resets_mig(gpusim_node):
    node = gpusim_node("h100-pcie:1")
    pf = node.pfs()[0]
    mig_on(node, pf)
    smi(node, "mig", "-i", pf, "-cgi", "15", "-C")
    subprocess.run(["sriov-manage", "-e", pf], env=node.env, check=True, capture_output=True)
    pf_state = node.state()["pfs"][0]
    assert pf_state["mig_mode"] and pf_state["gis"] == []           # mode kept, GIs gone with the PF rebind
    smi(node, "mig", "-i", pf, "-cgi", "15", "-C")
    node.ctl("reboot")
    pf_state = node.state()["pfs"][0]
    assert not pf_state["mig_mode"] and pf_state["gis"] == []       # Hopper: MIG mode is not persistent


def test_mig_off_refuses_gi_creation_and_ctl_mig(gpusim_node):
    node = gpusim_node("h100-pcie:1,l40s:1")
    h100, l40s = node.pfs()
    result = smi(node, "mig", "-i", h100, "-cgi", "19")
    assert result.returncode == 1 and "MIG mode is not enabled" in result.stdout
    assert gpusim_cli("ctl", node.root, "mig", h100, "1").returncode == 0
    assert node.state()["pfs"][0]["mig_mode"]
    with pytest.raises(daemon.GpuSimError, match="Operation not supported"):
        daemon.control(node.root, "mig %s 1" % l40s)


def test_h200_mig_profiles_and_vgpu_s_v(gpusim_node):
    node = gpusim_node("h200:1,h200-nvl:1")
    sxm, nvl = node.pfs()
    vfs = enable_vfs(node, sxm)
    mig_on(node, sxm)
    assert smi(node, "mig", "-i", sxm, "-cgi", "1g.18gb", "-C").returncode == 0
    assert creatable_ids(node, vfs[0]) == [H200X_1_18C]
    supported = smi(node, "vgpu", "-i", nvl, "-s", "-v").stdout
    assert "Name                              : NVIDIA H200-3-71C" in supported
    assert "GPU Instance Profile ID           : 9" in supported
    # MIG mode off: the profiles are listed all the same, all free (captures/nvidia-smi-mig-lgip-h100.txt)
    assert "| 1 MIG 3g.71gb 9 2/2 68.87 No 60 3 0 |" in rows(smi(node, "mig", "-i", nvl, "-lgip").stdout)
    mig_on(node, nvl)
    assert "| 1 MIG 3g.71gb 9 2/2 68.87 No 60 3 0 |" in rows(smi(node, "mig", "-i", nvl, "-lgip").stdout)


def test_a_gpu_instance_at_a_given_placement_and_the_vf_typed_on_it(gpusim_node):
    node = gpusim_node("h100-pcie:1")
    pf = node.pfs()[0]
    enable_vfs(node, pf)
    mig_on(node, pf)
    made = smi(node, "mig", "-i", pf, "-cgi", "14:2", "-C")
    assert made.returncode == 0 and "Successfully created GPU instance ID  1" in made.stdout
    assert [(gi["id"], gi["start"], gi["size"]) for gi in gis(node, pf)] == [(1, 2, 2)]
    overlap = smi(node, "mig", "-i", pf, "-cgi", "9:0")                   # 0..3 overlaps 2..3
    assert overlap.returncode == 1 and "Insufficient Resources" in overlap.stdout
    assert smi(node, "mig", "-i", pf, "-cgi", "14:1").returncode == 1     # 2g has no placement at 1
    assert len(gis(node, pf)) == 1
    vf = node.vfs(pf)[0]
    write(node.device_path(vf, "nvidia/current_vgpu_type"), "1121")      # H100-2-20C takes the free 2g GI
    assert read(node.device_path(vf, "nvidia/gpu_instance_id")) == "1"
