"""vgpu_manager_image role + module: real podman build from a fake runfile on the local base image,
pushed to a real registry (docker-registry with htpasswd) on 127.0.0.1, checked over its HTTP API.
"""

import json
import os
import subprocess

import pytest

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
