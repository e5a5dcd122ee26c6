"""Secrets (API tokens, a kubeconfig given as a dict, the registry password) never show up in
ansible-playbook -vvv output or module results, and reach the API server only where they belong: in
the Authorization header of what it received (seen there, so the check can fail), never in a body,
a query string, another header or a stored object; the registry auth file is 0600 in a private
directory and gone afterwards."""

from __future__ import annotations

import json
import os
import stat
import sys

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError
from ansible_collections.accelops.vgpu.plugins.module_utils.image.image_build import HASH_LABEL, ImageBuild
from ansible_collections.accelops.vgpu.tests.integration.cluster.cluster_helpers import (
    default_state, kubeconfig_dict)
from ansible_collections.accelops.vgpu.tests.reliability import build_host
from ansible_collections.accelops.vgpu.tests.reliability.module_runs import run_module, run_playbook_verbose

TOKEN = "kubeconfig-token-5f0b1d9e3a7c"
API_KEY = "api-key-token-8e2c4a6b0d1f"
PASSWORD = "registry-pass-3c9e7a1f5b2d"
L40S = {"pci_vendor_selector": "10de:26b9", "resource_name": "nvidia.com/NVIDIA_L40S-24Q"}


pytestmark = pytest.mark.no_failure_path("secrets cases: they observe where a secret goes, not writes")


def assert_secret_free(secret, *texts):
    for text in texts:
        assert secret not in text, "secret %r leaked: ...%s..." % (secret, text[max(0, text.find(secret) - 200):][:400])


def assert_sent_only_as_bearer_token(secret, api):
    """Every request the API server received carried `secret` as its Bearer token and nowhere else;
    no stored object holds it."""
    received = api.received()
    assert received, "the API server received nothing"
    for request in received:
        headers = dict(request["headers"])
        assert headers.pop("Authorization", None) == "Bearer " + secret, (request["method"], request["path"])
        assert_secret_free(secret, request["path"], request["body"], json.dumps(headers))
    assert_secret_free(secret, json.dumps(api.stored()))


@pytest.fixture
def api(api_server):
    api_server.reset(default_state())
    return api_server


def test_kubeconfig_dict_token_stays_out_of_verbose_output_and_results(api, tmp_path):
    kubeconfig = kubeconfig_dict(api.url, token=TOKEN)
    task = {"name": "permit L40S", "accelops.vgpu.kubevirt_hostdevices": {
        "kubeconfig": "{{ cluster_kubeconfig }}", "pci_host_devices": [L40S]}}
    run = run_playbook_verbose([task], tmp_path, play_vars={"cluster_kubeconfig": kubeconfig}, python=sys.executable)
    assert run.returncode == 0 and "changed: [localhost]" in run.stdout, run.stdout[-2000:]
    direct = run_module("kubevirt_hostdevices", {"kubeconfig": kubeconfig, "pci_host_devices": [L40S]})
    assert not direct.failed, direct.message
    assert_secret_free(TOKEN, run.stdout, run.stderr, direct.stdout, direct.stderr)
    assert_sent_only_as_bearer_token(TOKEN, api)


def test_api_key_stays_out_of_a_failure_in_verbose_output(api, tmp_path):
    api.forbid("PATCH", "kubevirts")
    task = {"name": "permit L40S", "accelops.vgpu.kubevirt_hostdevices": {
        "host": api.url, "api_key": API_KEY, "pci_host_devices": [L40S]}}
    run = run_playbook_verbose([task], tmp_path, python=sys.executable)
    assert run.returncode == 2 and "forbidden (HTTP 403)" in run.stdout, run.stdout[-2000:]
    assert_secret_free(API_KEY, run.stdout, run.stderr)
    assert_sent_only_as_bearer_token(API_KEY, api)


@pytest.mark.parametrize("registry", ["docker.io", "127.0.0.1:1"], ids=["public-registry", "unreachable-registry"])
def test_registry_password_stays_out_of_a_failed_image_role_run(registry, tmp_path):
    build_host.runfiles(tmp_path)
    play_vars = {"vgpu_manager_image_runfile": str(tmp_path / "NVIDIA-Linux-x86_64-570.172.07-vgpu-kvm.run"),
                 "vgpu_manager_image_registry": registry, "vgpu_manager_image_registry_username": "builder",
                 "vgpu_manager_image_registry_password": PASSWORD, "vgpu_manager_image_work_dir": str(tmp_path)}
    task = {"name": "image", "ansible.builtin.include_role": {"name": "accelops.vgpu.vgpu_manager_image"}}
    run = run_playbook_verbose([task], tmp_path, play_vars=play_vars)
    assert run.returncode == 2 and "registry" in run.stdout, run.stdout[-2000:]
    assert registry.split(":")[0] in run.stdout
    assert_secret_free(PASSWORD, run.stdout, run.stderr)


class AuthFileWitness(build_host.QueryOnlyRunner):
    """Answers `image inspect` with the wanted input hash (so only a push is planned) and, at the
    push, records the auth file's mode, its directory's mode and whether it holds the credentials."""

    def __init__(self, input_hash):
        super().__init__()
        self.input_hash = input_hash
        self.seen = None

    def _execute(self, argv):
        if argv[1:3] == ["image", "inspect"]:
            return 0, json.dumps({HASH_LABEL: self.input_hash}), ""
        if argv[1:2] == ["push"]:
            path = argv[argv.index("--authfile") + 1]
            with open(path, encoding="utf-8") as handle:
                auth = json.load(handle)
            self.seen = {"file": stat.S_IMODE(os.stat(path).st_mode),
                         "dir": stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode),
                         "hosts": sorted(auth["auths"]), "path": path}
        return super()._execute(argv)


def test_registry_auth_file_is_0600_in_a_private_dir_and_removed(tmp_path):
    build_host.runfiles(tmp_path)
    (tmp_path / "work").mkdir()
    options = build_host.image_params(tmp_path, registry_username="builder", registry_password=PASSWORD)
    build = ImageBuild(build_host.QueryOnlyRunner(), options, registry_client=build_host.NoRegistry())
    runner = AuthFileWitness(build.input_hash())
    build.runner = runner
    with pytest.raises(EngineError) as caught:  # NoRegistry never shows the pushed image
        build.apply()
    assert "pushed, but the registry does not serve it" in str(caught.value)
    assert runner.seen["file"] == 0o600 and runner.seen["dir"] == 0o700, runner.seen
    assert runner.seen["hosts"] == ["registry.example.com"]
    assert not os.path.exists(runner.seen["path"]) and build_host.files_below(tmp_path / "work") == []
    assert_secret_free(PASSWORD, json.dumps(runner.mutations), str(caught.value))
