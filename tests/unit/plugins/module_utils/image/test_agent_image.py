import hashlib

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.image import agent_image
from ansible_collections.accelops.vgpu.plugins.module_utils.image.agent_image import (
    AgentImage, agent_containerfile)
from ansible_collections.accelops.vgpu.plugins.module_utils.image.image_build import HASH_LABEL, ImageError

from test_image_build import FakePodman, FakeRegistry


@pytest.fixture
def params(tmp_path):
    cli = tmp_path / "accelops-vgpu.pyz"
    cli.write_bytes(b"#!/usr/bin/env python3\nPK...")
    return dict(name="registry.example.com:5000/accelops/vgpu-node-agent", tag="0.1.0", node_cli=str(cli),
                base_image="localhost/accelops-debian:bookworm", packages=[], labels={"owner": "tests"},
                pull="never", push=True, force=False, registry_username="builder", registry_password="s3cret",
                tls_verify=True, work_dir=str(tmp_path), executable="podman")


def make(params, remote=None, local=None):
    registry = FakeRegistry(remote)
    podman = FakePodman(registry, local)
    return AgentImage(podman, params, registry), podman, registry


def test_containerfile_runs_the_agent_verb_and_checks_the_cli_at_build_time():
    text = agent_containerfile([])
    assert 'ENTRYPOINT ["/usr/local/bin/accelops-vgpu", "agent"]' in text
    assert "RUN /usr/local/bin/accelops-vgpu --help" in text and "apt-get" not in text
    assert "apt-get install -y --no-install-recommends python3 ca-certificates" in agent_containerfile(
        ["python3", "ca-certificates"])


def test_build_puts_the_cli_into_the_context_and_pushes(params):
    image, podman, registry = make(params)
    result = image.apply()
    assert result["actions"] == ["build", "push"] and result["image"].endswith("vgpu-node-agent:0.1.0")
    build = [call for call in podman.calls if call[1] == "build"][0]
    assert "BASE_IMAGE=localhost/accelops-debian:bookworm" in build
    assert registry.labels[HASH_LABEL] == result["input_hash"]


def test_unchanged_inputs_do_nothing_and_the_cli_content_changes_the_hash(params, tmp_path):
    wanted = make(params)[0].input_hash()
    image, podman, _registry = make(params, remote={HASH_LABEL: wanted})
    assert image.apply()["actions"] == [] and not [c for c in podman.calls if c[1] in ("build", "push")]
    with open(params["node_cli"], "ab") as handle:
        handle.write(b"another engine")
    assert make(params)[0].input_hash() != wanted


@pytest.mark.parametrize("change, message", [
    ({"node_cli": "/nonexistent/accelops-vgpu.pyz"}, "node CLI /nonexistent/accelops-vgpu.pyz: no such file"),
    ({"packages": ["python3; rm -rf /"]}, "is not a Debian package name"),
    ({"tag": "0.1 beta"}, "is not a valid image tag"),
    ({"name": "registry.example.com/Agent"}, "not a valid image name"),
])
def test_bad_input_fails_in_one_line_before_any_command(params, change, message):
    params.update(change)
    registry = FakeRegistry()
    podman = FakePodman(registry)
    with pytest.raises(ImageError, match=message) as err:
        AgentImage(podman, params, registry).apply()
    assert "\n" not in str(err.value) and podman.calls == [] and registry.reads == []


def test_public_registry_is_allowed_nothing_licensed_inside(params):
    params["name"] = "quay.io/acme/vgpu-node-agent"
    assert make(params)[0].ref == "quay.io/acme/vgpu-node-agent:0.1.0"


def test_without_node_cli_the_module_builds_it_names_the_tag_after_it_and_leaves_no_file(params, tmp_path):
    """Issue 24: one way to build the node CLI: the module builds it (cli_zipapp), no controller-side step;
    the bytes go only into the private build context (node_cli_file.py, shared with the manager image)."""
    del params["node_cli"], params["tag"]
    (tmp_path / "accelops-vgpu.pyz").unlink()
    data = b"#!/usr/bin/env python3\nPK-built"
    registry = FakeRegistry()
    podman = FakePodman(registry)
    image = AgentImage(podman, params, registry, build_cli=lambda: data)
    assert image.tag == hashlib.sha256(data).hexdigest()[:16] == agent_image.shipped_tag(lambda: data)
    result = image.apply()
    assert result["node_cli_sha256"] == hashlib.sha256(data).hexdigest() and result["tag"] == image.tag
    assert result["actions"] == ["build", "push"] and podman.context["accelops-vgpu.pyz"] == data
    assert list(tmp_path.iterdir()) == []   # work_dir: the build context is gone, no other file was made
    checked = AgentImage(FakePodman(registry), params, registry, build_cli=lambda: data).apply(check_mode=True)
    assert checked["input_hash"] == result["input_hash"] and list(tmp_path.iterdir()) == []


def test_the_shipped_zipapp_is_the_checkouts_and_a_bad_input_leaves_no_file(params, tmp_path):
    from ansible_collections.accelops.vgpu.plugins.module_utils import cli_zipapp
    agent_cli = cli_zipapp.shipped(agent=True)     # the image runs `agent`: the agent CLI, not the node CLI
    assert agent_image.shipped_tag() == hashlib.sha256(agent_cli).hexdigest()[:16]
    del params["node_cli"]
    assert AgentImage(FakePodman(FakeRegistry()), params, FakeRegistry()).node_cli.data == agent_cli
    params["tag"] = "0.1 beta"
    (tmp_path / "accelops-vgpu.pyz").unlink()
    with pytest.raises(ImageError, match="is not a valid image tag"):
        AgentImage(FakePodman(FakeRegistry()), params, FakeRegistry(), build_cli=lambda: b"x")
    assert list(tmp_path.iterdir()) == []
