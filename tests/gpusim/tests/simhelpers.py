"""Small helpers shared by the gpusim tests."""

from __future__ import annotations

import errno
import os
import subprocess

import pytest


def write(path, value):
    """One write(2), as the engine does; returns nothing, raises OSError with the simulated errno."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, str(value).encode())
    finally:
        os.close(fd)


def write_fails(path, value, code):
    with pytest.raises(OSError) as info:
        write(path, value)
    assert info.value.errno == code, "expected %s, got %s" % (errno.errorcode[code],
                                                             errno.errorcode.get(info.value.errno))


def read(path):
    with open(path) as handle:
        return handle.read().rstrip("\n")


def sriov_manage(node, *args, check=True):
    return subprocess.run(["sriov-manage", *args], env=node.env, capture_output=True, text=True, check=check)


def enable_vfs(node, pf):
    """Enable all VFs the way NVIDIA's script does and return the VF addresses."""
    sriov_manage(node, "-e", pf)
    return node.vfs(pf)


def creatable_ids(node, vf):
    lines = read(node.device_path(vf, "nvidia/creatable_vgpu_types")).splitlines()[1:]
    return [int(line.split(":")[0]) for line in lines]
