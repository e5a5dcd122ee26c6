"""vgpu_node_agent role, entry point `image` (module agent_image): the node CLI zipapp built by the module
from its own sources (no controller-side build), a real podman build on the local Debian base, pushed to a
real registry on 127.0.0.1."""

import hashlib
import json
import os
import pathlib

import pytest

from test_vgpu_manager_image import OWNER, podman, registry  # noqa: F401 pylint: disable=unused-import

ROOT = pathlib.Path(__file__).resolve().parents[2]
BASE = "localhost/accelops-debian:bookworm"
REPO = "accelops/vgpu-node-agent"
TASK = "accelops.vgpu.vgpu_node_agent : Build and push the node agent image"
pytestmark = pytest.mark.skipif(not os.path.exists("/usr/bin/docker-registry"), reason="needs docker-registry")


def node_cli_bytes():
    from ansible_collections.accelops.vgpu.plugins.module_utils import cli_zipapp
    return cli_zipapp.build(*cli_zipapp.from_directory(str(ROOT / "plugins" / "module_utils")), agent=True)


@pytest.fixture
def build(registry, tmp_path, run_playbook):  # noqa: F811 (pytest fixture argument)
    def run(check=False, **overrides):
        role_vars = dict(vgpu_node_agent_image_registry=registry.host, vgpu_node_agent_image_base=BASE,
                         vgpu_node_agent_image_packages=[], vgpu_node_agent_image_pull="never",
                         vgpu_node_agent_image_tls_verify=False,
                         vgpu_node_agent_image_registry_username=registry.username,
                         vgpu_node_agent_image_registry_password=registry.password,
                         vgpu_node_agent_image_labels={"owner": OWNER},
                         vgpu_node_agent_image_work_dir=str(tmp_path))
        role_vars.update(overrides)
        return run_playbook([{"name": "agent image", "ansible.builtin.include_role": {
            "name": "accelops.vgpu.vgpu_node_agent", "tasks_from": "image"}}], check=check, extra_vars=role_vars)
    return run


def test_agent_image_is_built_from_the_node_cli_pushed_then_unchanged(build, registry, tmp_path):  # noqa: F811
    first = build()
    assert first.rc == 0, first
    result = first.task(TASK)
    assert result["changed"] and result["built"] and result["pushed"]
    tag = result["tag"]
    # the default tag: the start of the sha256 of the zipapp the module built, the same bytes this checkout's
    # builder makes (and the role's lookup names), and the module left no file behind
    assert tag == result["node_cli_sha256"][:16] == hashlib.sha256(node_cli_bytes()).hexdigest()[:16]
    assert result["image"] == "%s/%s:%s" % (registry.host, REPO, tag) and registry.tags(REPO) == [tag]
    assert not list(tmp_path.glob("*.pyz"))
    inspect = json.loads(podman("image", "inspect", result["image"]).stdout)[0]
    assert inspect["Config"]["Entrypoint"] == ["/usr/local/bin/accelops-vgpu", "agent"]
    assert inspect["Config"]["Labels"]["io.accelops.vgpu.input-hash"] == result["input_hash"]
    # the entrypoint is the agent verb of this checkout's node CLI, on the base image's python3
    ran = podman("run", "--rm", "--pull=never", "--label", "owner=" + OWNER, result["image"], "--help")
    assert ran.returncode == 0 and "NODE_NAME" in ran.stdout and "DEFAULT_VGPU_CONFIG" in ran.stdout, ran.stderr
    # without its required settings it stops at once with one line (exit 2), never a crash loop of tracebacks
    bare = podman("run", "--rm", "--pull=never", "--label", "owner=" + OWNER, result["image"])
    assert bare.returncode == 2 and "Traceback" not in bare.stderr and len(bare.stderr.strip().splitlines()) == 1
    assert registry.password not in first.stdout + first.stderr

    image_id = inspect["Id"]
    again = build()
    assert again.rc == 0 and not again.task(TASK)["changed"] and again.task(TASK)["actions"] == []

    # a changed input in check mode: planned, nothing built
    planned = build(check=True, vgpu_node_agent_image_labels={"owner": OWNER, "team": "gpu"})
    assert planned.task(TASK)["changed"] and planned.task(TASK)["actions"] == ["build", "push"]
    assert podman("image", "inspect", "--format", "{{.Id}}", result["image"]).stdout.strip() == image_id


def test_the_roles_default_tag_is_the_tag_the_module_gives_its_image(run_playbook):
    """Deploy without building: the lookup names the same zipapp digest (no controller-side build, no file)."""
    run = run_playbook([{"name": "tag", "ansible.builtin.debug": {"msg": "{{ lookup('accelops.vgpu.node_cli_tag') }}"}}])
    assert run.rc == 0, run
    assert run.task("tag")["msg"] == hashlib.sha256(node_cli_bytes()).hexdigest()[:16]
