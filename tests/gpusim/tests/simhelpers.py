"""Small helpers shared by the gpusim tests."""

from __future__ import annotations

import contextlib
import errno
import io
import os
import subprocess

import pytest

from gpusim import cli


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
    got = errno.errorcode.get(info.value.errno)
    assert info.value.errno == code, "expected %s, got %s" % (errno.errorcode[code], got)


def read(path):
    with open(path) as handle:
        return handle.read().rstrip("\n")


def sriov_manage(node, *args, check=True):
    return subprocess.run(["sriov-manage", *args], env=node.env, capture_output=True, text=True, check=check)


def enable_vfs(node, pf):
    """Enable all VFs with the writes NVIDIA's sriov-manage makes (in-process: no interpreter start
    per call; test_tools.py runs the fake script itself) and return the VF addresses."""
    rebind(node, pf, "nvidia", "pci-pf-stub")
    write(node.device_path(pf, "sriov_numvfs"), read(node.device_path(pf, "sriov_totalvfs")))
    rebind(node, pf, "pci-pf-stub", "nvidia")
    return node.vfs(pf)


def rebind(node, address, old, new):
    write(node.path("bus/pci/drivers", old, "unbind"), address)
    write(node.device_path(address, "driver_override"), new if new == "pci-pf-stub" else "\n")
    write(node.path("bus/pci/drivers", new, "bind"), address)


def typed_vf(node, index, type_id):
    """Enable the first PF's VFs, give VF `index` a type; returns (VF address, current_vgpu_type path)."""
    vf = enable_vfs(node, node.pfs()[0])[index]
    path = node.device_path(vf, "nvidia/current_vgpu_type")
    write(path, type_id)
    return vf, path


def creatable_ids(node, vf):
    lines = read(node.device_path(vf, "nvidia/creatable_vgpu_types")).splitlines()[1:]
    return [int(line.split(":")[0]) for line in lines]


def gpusim_cli(*args):
    """The gpusim CLI in this process (no interpreter start per call): returncode, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            cli.main(list(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
            err.write(exc.code if isinstance(exc.code, str) else "")
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())
