"""vgpu_node_agent role, entry point `image` (module agent_image): the node CLI zipapp built on the
controller, a real podman build on the local Debian base, pushed to a real registry on 127.0.0.1."""

import json
import os

import pytest

from test_vgpu_manager_image import OWNER, podman, registry  # noqa: F401 pylint: disable=unused-import

BASE = "localhost/accelops-debian:bookworm"
REPO = "accelops/vgpu-node-agent"
TASK = "accelops.vgpu.vgpu_node_agent : Build and push the node agent image"
pytestmark = pytest.mark.skipif(not os.path.exists("/usr/bin/docker-registry"), reason="needs docker-registry")


@pytest.fixture
def build(registry, tmp_path, run_playbook):  # noqa: F811 (pytest fixture argument)
    def run(check=False, **overrides):
        role_vars = dict(vgpu_node_agent_image_registry=registry.host, vgpu_node_agent_image_base=BASE,
                         vgpu_node_agent_image_packages=[], vgpu_node_agent_image_pull="never",
                         vgpu_node_agent_image_tls_verify=False,
                         vgpu_node_agent_image_registry_username=registry.username,
                         vgpu_node_agent_image_registry_password=registry.password,
                         vgpu_node_agent_image_labels={"owner": OWNER},
                         vgpu_node_agent_image_work_dir=str(tmp_path),
                         vgpu_node_agent_cli_cache_dir=str(tmp_path / "cli-cache"))
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
    assert len(tag) == 16  # the engine digest, which also names the cached zipapp
    assert result["image"] == "%s/%s:%s" % (registry.host, REPO, tag) and registry.tags(REPO) == [tag]
    built = [p.name for p in (tmp_path / "cli-cache").glob("*.pyz")]
    assert len(built) == 1 and built[0].startswith("accelops-vgpu-%s" % tag)
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
