"""The tree bind-mounted into a podman container behaves like on the host (Molecule nodes)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
IMAGE = os.environ.get("ACCELOPS_BASE_IMAGE", "localhost/accelops-debian:bookworm")


@pytest.fixture(scope="module")
def podman_env():
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed")
    env = dict(os.environ)
    env.setdefault("CONTAINERS_CONF", os.path.join(REPO, "tests", "containers.conf"))
    if subprocess.run(["podman", "image", "exists", IMAGE], env=env, check=False).returncode != 0:
        build = subprocess.run([os.path.join(REPO, "tests/images/build-base.sh")], env=env,
                               capture_output=True, text=True, check=False)
        if build.returncode != 0:
            pytest.skip("base image %s missing and build-base.sh failed: %s" % (IMAGE, build.stdout[-300:]))
    probe = subprocess.run(["podman", "run", "--rm", "--pull=never", IMAGE, "true"], env=env,
                           capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        pytest.skip("podman cannot run containers here: %s" % probe.stderr.strip()[-300:])
    return env


SCRIPT = r"""
set -u
cd /host/sys/bus/pci/devices
/opt/gpusim/sriov-manage -e 0000:41:00.0
ls -d 0000:41:00.0/virtfn* | wc -l
readlink 0000:41:00.4/physfn
echo 1155 > 0000:41:00.4/nvidia/current_vgpu_type
cat 0000:41:00.4/nvidia/current_vgpu_type
echo 99 > 0000:41:00.4/nvidia/current_vgpu_type || echo "refused-99"
echo 1 > 0000:41:00.0/sriov_totalvfs || echo "refused-totalvfs"
sleep 30 < /host/sys/.gpusim/dev/vfio/devices/vfio0 &
holder=$!
sleep 0.3
echo 0 > 0000:41:00.4/nvidia/current_vgpu_type || echo "refused-held"
python3 -c "import os; print(os.readlink('/proc/$holder/fd/0'))"
kill $holder; wait $holder 2>/dev/null
sleep 0.3
echo 0 > 0000:41:00.4/nvidia/current_vgpu_type && echo "cleared"
/opt/gpusim/nvidia-smi vgpu -i 0000:41:00.0 -shm 1
"""


def test_bind_mounted_tree_behaves_identically(gpusim_node, podman_env):
    node = gpusim_node("l40s:1")
    result = subprocess.run(
        ["podman", "run", "--rm", "--pull=never", "-v", "%s:/host/sys" % node.root,
         "-v", "%s:/opt/gpusim:ro" % node.tools_dir, "-e", "GPUSIM_ROOT=/host/sys", IMAGE,
         "bash", "-c", SCRIPT], env=podman_env, capture_output=True, text=True, timeout=120, check=False)
    lines = result.stdout.splitlines()
    assert lines[:4] == ["Enabling VFs on 0000:41:00.0", "32", "../0000:41:00.0", "1155"], result.stderr
    assert "echo: write error: Invalid argument" in result.stderr
    assert "sriov_totalvfs: Permission denied" in result.stderr        # refused at open, as kernfs does
    assert "echo: write error: Device or resource busy" in result.stderr
    assert lines[4:9] == ["refused-99", "refused-totalvfs", "refused-held",
                          "/host/sys/.gpusim/dev/vfio/devices/vfio0", "cleared"], result.stdout
    assert "vGPU heterogeneous mode enabled" in lines[9]
    assert node.state()["pfs"][0]["mixed_size"] is True
    errors = [(e["path"], e.get("errno")) for e in node.log() if e["result"] == "error"]
    assert errors == [("bus/pci/devices/0000:41:00.4/nvidia/current_vgpu_type", "EINVAL"),
                      ("bus/pci/devices/0000:41:00.0/sriov_totalvfs", "EACCES"),
                      ("bus/pci/devices/0000:41:00.4/nvidia/current_vgpu_type", "EBUSY")]
