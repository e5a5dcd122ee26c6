"""NVIDIA vendor-specific VFIO framework: nvidia/ on VFs, typing rules, holds, mixed-size mode."""

from __future__ import annotations

import errno
import os
import re
import subprocess

import pytest

from gpusim import daemon
from simhelpers import creatable_ids, enable_vfs, read, typed_vf, write, write_fails

L40S_24Q, L40S_24A, L40S_12Q, L40S_1Q, L40S_48Q = 1155, 1165, 1153, 1147, 1156


def test_vf_has_nvidia_dir_and_pf_has_none(gpusim_node):
    node = gpusim_node("l40s:1")
    pf = node.pfs()[0]
    vf = enable_vfs(node, pf)[0]
    assert not os.path.exists(node.device_path(pf, "nvidia"))
    assert sorted(os.listdir(node.device_path(vf, "nvidia"))) == [
        "creatable_vgpu_types", "current_vgpu_type", "gpu_instance_id", "placement_id", "vgpu_params",
        "warm_update"]
    text = read(node.device_path(vf, "nvidia/creatable_vgpu_types")).splitlines()
    assert text[0] == "ID    : vGPU Name"
    assert "1155  : NVIDIA L40S-24Q" in text and "2164  : NVIDIA L40S-3B" in text
    assert read(node.device_path(vf, "nvidia/current_vgpu_type")) == "0"


def test_homogeneous_siblings_shrink_to_the_same_size(gpusim_node):
    node = gpusim_node("l40s:1")
    vfs = enable_vfs(node, node.pfs()[0])
    write(node.device_path(vfs[0], "nvidia/current_vgpu_type"), L40S_24Q)
    assert read(node.device_path(vfs[0], "nvidia/current_vgpu_type")) == str(L40S_24Q)
    assert creatable_ids(node, vfs[1]) == [L40S_24Q, L40S_24A]
    write_fails(node.device_path(vfs[1], "nvidia/current_vgpu_type"), L40S_12Q, errno.EINVAL)
    write(node.device_path(vfs[1], "nvidia/current_vgpu_type"), L40S_24A)   # same size, other series
    assert creatable_ids(node, vfs[2]) == []                                 # 48 GB / 24 GB = 2 used
    write_fails(node.device_path(vfs[2], "nvidia/current_vgpu_type"), L40S_24Q, errno.EINVAL)
    write(node.device_path(vfs[0], "nvidia/current_vgpu_type"), "0")
    assert creatable_ids(node, vfs[2]) == [L40S_24Q, L40S_24A]


def test_max_count_for_1q_is_32(gpusim_node):
    node = gpusim_node("l40s:1")
    vfs = enable_vfs(node, node.pfs()[0])
    for vf in vfs:
        write(node.device_path(vf, "nvidia/current_vgpu_type"), L40S_1Q)
    assert [read(node.device_path(vf, "nvidia/current_vgpu_type")) for vf in vfs] == [str(L40S_1Q)] * 32


def test_bad_values_are_einval_and_change_nothing(gpusim_node):
    node = gpusim_node("l40s:1")
    vf = enable_vfs(node, node.pfs()[0])[0]
    path = node.device_path(vf, "nvidia/current_vgpu_type")
    for value in ("abc", "99999", "1155x", "-1"):
        write_fails(path, value, errno.EINVAL)
    assert read(path) == "0"


def test_held_vf_refuses_type_changes_with_ebusy(gpusim_node):
    node = gpusim_node("l40s:1")
    vf, path = typed_vf(node, 0, L40S_24Q)
    pid = node.hold(vf)
    fds = [os.readlink("/proc/%d/fd/%s" % (pid, fd)) for fd in os.listdir("/proc/%d/fd" % pid)]
    assert os.path.join(node.dev_root, "vfio/devices/vfio0") in fds
    write_fails(path, "0", errno.EBUSY)
    write_fails(path, L40S_24A, errno.EBUSY)
    write_fails(node.device_path(vf, "nvidia/vgpu_params"), "x=1", errno.EBUSY)
    assert node.state()["held"] == {vf: 1}
    node.release(vf)
    write(path, "0")
    assert read(path) == "0"


def test_any_open_of_the_group_node_holds_the_vf(gpusim_node):
    node = gpusim_node("l40s:1")
    vf, path = typed_vf(node, 1, L40S_24Q)
    with open(os.path.join(node.dev_root, "vfio/101"), "rb"):        # legacy group node of 41:00.5
        assert node.state()["held"] == {vf: 1}
        write_fails(path, "0", errno.EBUSY)
    daemon.wait_unheld(node.root, vf)                                # FUSE release is asynchronous
    write(path, "0")
    assert read(path) == "0"


def test_mixed_size_mode_through_fake_nvidia_smi(gpusim_node):
    node = gpusim_node("l40s:1")
    pf = node.pfs()[0]
    vfs = enable_vfs(node, pf)

    def smi(*args):
        return subprocess.run(["nvidia-smi", *args], env=node.env, capture_output=True, text=True, check=False)

    assert re.search(r"vGPU Heterogeneous Mode +: Disabled", smi("-q").stdout)
    assert smi("vgpu", "-i", pf, "-shm", "1").returncode == 0
    assert "Enabled" in smi("vgpu", "-i", "0", "-ghm").stdout
    write(node.device_path(vfs[0], "nvidia/current_vgpu_type"), L40S_24Q)
    assert L40S_12Q in creatable_ids(node, vfs[1]) and L40S_48Q not in creatable_ids(node, vfs[1])
    write(node.device_path(vfs[1], "nvidia/current_vgpu_type"), L40S_12Q)
    write(node.device_path(vfs[2], "nvidia/current_vgpu_type"), L40S_12Q)
    assert creatable_ids(node, vfs[3]) == []                 # 24 + 12 + 12 = 48 GB used
    result = smi("vgpu", "-i", pf, "-shm", "0")              # not while types are set
    assert result.returncode == 1 and "In use" in result.stdout
    for vf in vfs[:3]:
        write(node.device_path(vf, "nvidia/current_vgpu_type"), "0")
    subprocess.run(["sriov-manage", "-d", pf], env=node.env, check=True, capture_output=True)
    enable_vfs(node, pf)
    assert re.search(r"vGPU Heterogeneous Mode +: Disabled", smi("-q").stdout)   # reset by re-enable


def test_a_handle_on_a_vanished_vf_gets_enodev(gpusim_node):
    node = gpusim_node("l40s:1")
    pf = node.pfs()[0]
    vf = enable_vfs(node, pf)[0]
    fd = os.open(node.device_path(vf, "nvidia/current_vgpu_type"), os.O_RDWR)
    try:
        subprocess.run(["sriov-manage", "-d", pf], env=node.env, check=True, capture_output=True)
        with pytest.raises(OSError) as read_error:
            os.read(fd, 64)
        with pytest.raises(OSError) as write_error:
            os.write(fd, b"1155")
        assert read_error.value.errno == write_error.value.errno == errno.ENODEV     # as kernfs does
    finally:
        os.close(fd)
