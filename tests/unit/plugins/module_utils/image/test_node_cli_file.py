"""The node CLI zipapp in the images (node_cli_file.py through ContainerImage): the vGPU manager image with
include_node_cli / node_cli, the same mechanism as the agent image (test_agent_image.py)."""

import hashlib
import os

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.image.image_build import HASH_LABEL, ImageBuild, ImageError
from ansible_collections.accelops.vgpu.plugins.module_utils.image.node_cli_file import NodeCliFile
from ansible_collections.accelops.vgpu.plugins.module_utils import cli_zipapp

from test_image_build import FakePodman, FakeRegistry

CLI = "accelops-vgpu.pyz"


def not_built():
    raise AssertionError("the node CLI must not be built here")


def manager(params, build_cli=None, remote=None, local=None):
    registry = FakeRegistry(remote)
    podman = FakePodman(registry, local)
    return ImageBuild(podman, params, registry, build_cli), podman, registry


def leftovers(params):
    """Files in work_dir besides the runfile: the build context and anything else the run made."""
    return sorted(name for name in os.listdir(params["work_dir"]) if not name.endswith(".run"))


def test_included_without_a_path_the_context_holds_the_shipped_zipapp_and_nothing_is_left(params):
    """The review finding: an installed collection has no tools/, so the module builds the CLI itself."""
    params["include_node_cli"] = True
    image, podman, registry = manager(params)
    result = image.apply()
    shipped = cli_zipapp.shipped()
    assert result["actions"] == ["build", "push"] and podman.context[CLI] == shipped
    assert result["node_cli_sha256"] == hashlib.sha256(shipped).hexdigest()
    assert registry.labels[HASH_LABEL] == result["input_hash"] and leftovers(params) == []


def test_the_cli_bytes_change_the_input_hash_so_a_new_engine_rebuilds(params):
    params["include_node_cli"] = True
    old = manager(params, build_cli=lambda: b"PK engine 1")[0].input_hash()
    image, podman, _registry = manager(params, build_cli=lambda: b"PK engine 2", remote={HASH_LABEL: old},
                                       local={HASH_LABEL: old})
    result = image.apply()
    assert result["input_hash"] != old and result["actions"] == ["build", "push"]
    assert podman.context[CLI] == b"PK engine 2" and podman.local[HASH_LABEL] == result["input_hash"]
    again = manager(params, build_cli=lambda: b"PK engine 2", remote={HASH_LABEL: result["input_hash"]})[0]
    assert again.apply()["actions"] == []


def test_a_given_path_is_used_as_is_and_nothing_is_built(params, tmp_path):
    cli = tmp_path / "cli-from-a-checkout.pyz"
    cli.write_bytes(b"#!/usr/bin/env python3\nPK given")
    params["node_cli"] = str(cli)          # include_node_cli left out: a given path includes it
    image, podman, _registry = manager(params, build_cli=not_built)
    result = image.apply()
    assert podman.context[CLI] == cli.read_bytes() and result["node_cli_sha256"] == hashlib.sha256(
        cli.read_bytes()).hexdigest()
    params["include_node_cli"] = True
    assert manager(params, build_cli=not_built)[0].input_hash() == result["input_hash"]
    # the same bytes built or given: the same image
    del params["node_cli"]
    assert manager(params, build_cli=cli.read_bytes)[0].input_hash() == result["input_hash"]


@pytest.mark.parametrize("change, message", [
    ({"include_node_cli": True, "node_cli": "/nonexistent/accelops-vgpu.pyz"},
     "image registry.example.com:5000/nvidia/vgpu-manager: node CLI /nonexistent/accelops-vgpu.pyz: no such file"),
    ({"node_cli": "/nonexistent/accelops-vgpu.pyz"}, "node CLI /nonexistent/accelops-vgpu.pyz: no such file"),
    ({"include_node_cli": False, "node_cli": "/tmp"}, "node_cli /tmp is given but include_node_cli is false"),
    ({"include_node_cli": True, "context_paths": {CLI: "/tmp"}}, "must be a plain file name other than"),
    ({"include_node_cli": True, "name": "quay.io/acme/vgpu-manager"}, "is a public registry"),
])
def test_bad_input_is_one_line_before_any_build_or_read(params, change, message):
    params.update(change)
    registry = FakeRegistry()
    podman = FakePodman(registry)
    with pytest.raises(ImageError, match=message) as err:
        ImageBuild(podman, params, registry, not_built if "context_paths" not in change else None).apply()
    assert "\n" not in str(err.value) and podman.calls == [] and registry.reads == []
    assert leftovers(params) == []


def test_without_include_the_image_is_as_before(params, tmp_path):
    """No CLI unless asked: the context, the hash and the result stay what they were (context_paths may carry one)."""
    image, podman, _registry = manager(params, build_cli=not_built)
    result = image.apply()
    assert CLI not in podman.context and "node_cli_sha256" not in result
    cli = tmp_path / "own.pyz"
    cli.write_bytes(b"PK own")
    params["context_paths"] = {CLI: str(cli)}
    image, podman, _registry = manager(params, build_cli=not_built)
    image.apply()
    assert podman.context[CLI] == b"PK own"


def test_check_mode_builds_no_image_and_reports_the_real_runs_plan(params):
    params["include_node_cli"] = True
    checked, podman, registry = manager(params, build_cli=lambda: b"PK built")
    planned = checked.apply(check_mode=True)
    assert not [c for c in podman.calls if c[1] in ("build", "push")] and registry.labels is None
    assert leftovers(params) == []
    real = manager(params, build_cli=lambda: b"PK built")[0].apply()
    assert (planned["changed"], planned["actions"], planned["input_hash"], planned["node_cli_sha256"]) == (
        real["changed"], real["actions"], real["input_hash"], real["node_cli_sha256"])


def test_node_cli_file_reads_a_given_file_or_builds_the_shipped_one(tmp_path):
    given = tmp_path / "cli.pyz"
    given.write_bytes(b"PK")
    assert NodeCliFile(str(given), not_built).data == b"PK"
    shipped = NodeCliFile()
    assert shipped.data == cli_zipapp.shipped() and shipped.sha256 == hashlib.sha256(shipped.data).hexdigest()
