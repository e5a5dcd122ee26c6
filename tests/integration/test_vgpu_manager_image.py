"""vgpu_manager_image role + module: real podman build from a fake runfile on the local base image,
pushed to a real registry (docker-registry with htpasswd) on 127.0.0.1, checked over its HTTP API.
"""

import json
import os
import subprocess
import time
import zipapp

import pytest

from ansible_collections.accelops.vgpu.tests.fakes.driver_tools import make_fake_node, read_calls
from ansible_collections.accelops.vgpu.tests.fakes.registry import LocalRegistry
from ansible_collections.accelops.vgpu.tests.fakes.runfile import write_runfile

BASE = "localhost/accelops-debian:bookworm"
VERSION = "570.124.03"
OWNER = "accelops-tests"
REPO = "accelops/vgpu-manager"
pytestmark = pytest.mark.skipif(not os.path.exists("/usr/bin/docker-registry"), reason="needs docker-registry")


CONTAINERS_CONF = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "containers.conf")


def podman(*args):
    env = dict(os.environ, CONTAINERS_CONF=os.environ.get("CONTAINERS_CONF", CONTAINERS_CONF))
    return subprocess.run(["podman"] + list(args), capture_output=True, text=True, env=env, check=False)


@pytest.fixture
def registry(tmp_path, monkeypatch):
    monkeypatch.setenv("CONTAINERS_CONF", os.environ.get("CONTAINERS_CONF", CONTAINERS_CONF))  # for the playbooks
    if podman("image", "exists", BASE).returncode != 0:
        pytest.fail("base image %s missing: run tests/images/build-base.sh" % BASE)
    with LocalRegistry(tmp_path / "registry") as reg:
        yield reg
    for ref in podman("images", "--filter", "label=owner=%s" % OWNER, "--format", "{{.ID}}").stdout.split():
        podman("rmi", "-f", ref)


@pytest.fixture
def build(registry, tmp_path, run_playbook):
    runfile = write_runfile(tmp_path, VERSION)

    def run(check=False, **overrides):
        role_vars = dict(vgpu_manager_image_runfile=runfile, vgpu_manager_image_registry=registry.host,
                         vgpu_manager_image_path="accelops", vgpu_manager_image_os_tag="debian12",
                         vgpu_manager_image_base_image=BASE, vgpu_manager_image_packages=[],
                         vgpu_manager_image_pull="never", vgpu_manager_image_tls_verify=False,
                         vgpu_manager_image_registry_username=registry.username,
                         vgpu_manager_image_registry_password=registry.password,
                         vgpu_manager_image_labels={"owner": OWNER}, vgpu_manager_image_work_dir=str(tmp_path))
        role_vars.update(overrides)
        return run_playbook([{"name": "image", "ansible.builtin.include_role": {
            "name": "accelops.vgpu.vgpu_manager_image"}}], check=check, extra_vars=role_vars)

    run.runfile = runfile
    return run


def result_of(run):
    return run.task("accelops.vgpu.vgpu_manager_image : Build and push the vGPU manager image")


def test_build_push_then_no_change(build, registry):
    first = build()
    assert first.rc == 0, first
    result = result_of(first)
    tag = "%s-debian12" % VERSION
    assert result["changed"] and result["built"] and result["pushed"]
    assert result["image"] == "%s/%s:%s" % (registry.host, REPO, tag)
    assert registry.tags(REPO) == [tag]
    labels = json.loads(podman("image", "inspect", "--format", "{{json .Labels}}", result["image"]).stdout)
    assert labels["io.accelops.vgpu.input-hash"] == result["input_hash"] and labels["owner"] == OWNER
    # the runfile and the entrypoint are in the image, the entrypoint parses
    checked = podman("run", "--rm", "--pull=never", "--entrypoint", "bash", "--label", "owner=" + OWNER,
                     result["image"], "-c", "bash -n /usr/local/bin/vgpu-manager-entrypoint && "
                     "sh $RUNFILE --version && echo $DRIVER_VERSION")
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.split()[-1] == VERSION and "version %s" % VERSION in checked.stdout
    assert registry.password not in first.stdout + first.stderr

    image_id = podman("image", "inspect", "--format", "{{.Id}}", result["image"]).stdout
    again = build()
    assert again.rc == 0 and not result_of(again)["changed"] and result_of(again)["actions"] == []
    assert podman("image", "inspect", "--format", "{{.Id}}", result["image"]).stdout == image_id

    # a changed input (the retry count is in the entrypoint's environment) rebuilds; check mode first
    checked_run = build(check=True, vgpu_manager_image_sriov_retries=9)
    assert result_of(checked_run)["changed"] and result_of(checked_run)["actions"] == ["build", "push"]
    assert podman("image", "inspect", "--format", "{{.Id}}", result["image"]).stdout == image_id
    changed = build(vgpu_manager_image_sriov_retries=9)
    assert result_of(changed)["built"] and result_of(changed)["pushed"]
    assert podman("image", "inspect", "--format", "{{.Id}}", result["image"]).stdout != image_id


@pytest.mark.parametrize("target", ["docker.io/acme", "quay.io/acme", "nvcr.io/acme", "acme-without-host"])
def test_public_registry_is_refused_before_building(build, target):
    host, _sep, path = target.partition("/")
    run = build(vgpu_manager_image_registry=host, vgpu_manager_image_path=path,
                vgpu_manager_image_labels={"owner": OWNER, "case": "public"})
    result = result_of(run)
    assert run.rc != 0 and result.get("failed") and "public registry" in result["msg"]
    assert podman("images", "--filter", "label=case=public", "--format", "{{.ID}}").stdout.strip() == ""


def test_wrong_password_fails_before_building(build):
    run = build(vgpu_manager_image_registry_password="wrong", vgpu_manager_image_labels={"owner": OWNER,
                                                                                         "case": "badpw"})
    result = result_of(run)
    assert run.rc != 0 and "HTTP 401" in result["msg"] and "wrong" not in result["msg"]
    assert podman("images", "--filter", "label=case=badpw", "--format", "{{.ID}}").stdout.strip() == ""


def test_wrong_runfile_name_fails_in_the_first_task(build, tmp_path):
    bad = write_runfile(tmp_path, VERSION, name="NVIDIA-Linux-x86_64-%s-grid.run" % VERSION)
    run = build(vgpu_manager_image_runfile=bad)
    assert run.rc != 0
    assert run.task("accelops.vgpu.vgpu_manager_image : Check the runfile name "
                    "(NVIDIA-Linux-<arch>-<version>-vgpu-kvm[-aie].run)").get("failed")


FAKE_CLI = """import os, sys
with open(os.path.join(os.environ["FAKE_NODE"], "calls.log"), "a") as log:
    log.write("accelops-vgpu %s\\n" % " ".join(sys.argv[1:]))
"""

FAKE_SRIOV_MANAGE = """#!/bin/sh
# Like the real one on a bad day: the first `-e ALL` exits 0 without enabling anything.
echo "sriov-manage $*" >> "$FAKE_NODE/calls.log"
pf=$SYSFS_ROOT/bus/pci/devices/0000:41:00.0
case "$1" in
  -e) [ "$(grep -c '^sriov-manage -e' "$FAKE_NODE/calls.log")" -ge 2 ] && cat "$pf/sriov_totalvfs" > "$pf/sriov_numvfs" ;;
  -d) echo 0 > "$pf/sriov_numvfs" ;;
esac
exit 0
"""


def wait_for(predicate, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.5)
    return False


def test_entrypoint_installs_loads_enables_vfs_applies_layout_and_stops_cleanly(build, tmp_path):
    """Run the built image's entrypoint against a plain-directory node with the fake tools."""
    cli_src = tmp_path / "cli"
    cli_src.mkdir()
    (cli_src / "__main__.py").write_text(FAKE_CLI)
    zipapp.create_archive(str(cli_src), str(tmp_path / "accelops-vgpu.pyz"), interpreter="/usr/bin/env python3")
    run = build(vgpu_manager_image_push=False, vgpu_manager_image_os_tag="entrypoint",
                vgpu_manager_image_node_cli=str(tmp_path / "accelops-vgpu.pyz"))
    assert run.rc == 0, run
    image = result_of(run)["image"]

    fake = tmp_path / "fake"
    pf = fake / "sys/bus/pci/devices/0000:41:00.0"
    pf.mkdir(parents=True)
    (fake / "sys/module").mkdir()
    for name, value in (("vendor", "0x10de"), ("sriov_totalvfs", "4"), ("sriov_numvfs", "0")):
        (pf / name).write_text(value + "\n")
    make_fake_node(fake / "node", "/fake/sys")
    (fake / "node/bin/sriov-manage").write_text(FAKE_SRIOV_MANAGE)
    (fake / "node/bin/sriov-manage").chmod(0o755)
    (fake / "layout.json").write_text("{}\n")
    name = "accelops-tests-entrypoint-%d" % os.getpid()
    started = podman("run", "-d", "--name", name, "--label", "owner=" + OWNER, "--pull=never",
                     "-v", "%s:/fake" % fake, "-v", "%s:/etc/accelops-vgpu/layout.json:ro" % (fake / "layout.json"),
                     "-e", "FAKE_NODE=/fake/node", "-e", "GPUSIM_ROOT=/fake/sys", "-e", "SYSFS_ROOT=/fake/sys",
                     "-e", "SRIOV_MANAGE=/fake/node/bin/sriov-manage", "-e", "SRIOV_RETRY_DELAY=0",
                     "-e", "INSTALL_KERNEL_HEADERS=false",
                     "-e", "PATH=/fake/node/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", image)
    try:
        assert started.returncode == 0, started.stderr
        ready = wait_for(lambda: "vgpu-manager: ready" in podman("logs", name).stderr)
        assert ready, podman("logs", name).stderr
        assert (fake / "sys/module/nvidia/version").read_text().strip() == VERSION
        assert (pf / "sriov_numvfs").read_text().strip() == "4"
        stopped = podman("stop", "-t", "20", name)
        assert stopped.returncode == 0, stopped.stderr
        assert podman("inspect", "--format", "{{.State.ExitCode}}", name).stdout.strip() == "0"
    finally:
        podman("rm", "-f", "-t", "0", name)
    calls = [" ".join(call) for call in read_calls(fake / "node")]
    install = "runfile %s --ui=none --no-questions --silent --no-systemd --skip-module-load" % VERSION
    expected = [install, "modprobe nvidia", "modprobe nvidia_vgpu_vfio", "nvidia-vgpud", "nvidia-vgpu-mgr",
                "sriov-manage -e ALL", "sriov-manage -e ALL", "nvidia-vgpud",
                "accelops-vgpu apply --config /etc/accelops-vgpu/layout.json",
                "sriov-manage -d ALL", "modprobe -r nvidia_vgpu_vfio", "modprobe -r nvidia"]
    assert [call.strip() for call in calls] == expected
    assert (pf / "sriov_numvfs").read_text().strip() == "0" and not (fake / "sys/module/nvidia").exists()
