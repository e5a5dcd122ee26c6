import base64
import http.server
import json
import os
import stat
import threading

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.image import image_build
from ansible_collections.accelops.vgpu.plugins.module_utils.image.image_build import (
    HASH_LABEL, ImageBuild, ImageError, RegistryClient, is_public_registry, split_name)
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine.nvdriver import DriverError

VERSION = "570.124.03"


class FakeRegistry:
    def __init__(self, labels=None):
        self.labels, self.reads = labels, []

    def image_labels(self, repository, tag):
        self.reads.append((repository, tag))
        return self.labels


class FakePodman:
    """Answers `image inspect` from `local` labels; a build sets them (and keeps the build context's files,
    `context`: {name: bytes}), a push copies them to the registry."""

    def __init__(self, registry, local=None):
        self.registry, self.local, self.calls, self.context = registry, local, [], None

    def which(self, name, extra_paths=()):
        return name

    def run(self, argv, check=True):
        self.calls.append(list(argv))
        if argv[1:3] == ["image", "inspect"]:
            return (0, json.dumps(self.local), "") if self.local is not None else (125, "", "no such image")
        if argv[1] == "build":
            labels = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--label"]
            self.local = dict(label.split("=", 1) for label in labels)
            self.context = {}
            for name in os.listdir(argv[-1]):
                with open(os.path.join(argv[-1], name), "rb") as handle:
                    self.context[name] = handle.read()
        if argv[1] == "push":
            authfile = argv[argv.index("--authfile") + 1] if "--authfile" in argv else None
            self.authfile = (authfile, oct(stat.S_IMODE(os.stat(authfile).st_mode)),
                             json.load(open(authfile, encoding="utf-8"))) if authfile else None
            self.registry.labels = dict(self.local)
        return 0, "", ""


def make(params, remote=None, local=None):
    registry = FakeRegistry(remote)
    podman = FakePodman(registry, local)
    return ImageBuild(podman, params, registry), podman, registry


@pytest.mark.parametrize("name, host, repository", [
    ("registry.example.com:5000/nvidia/vgpu-manager", "registry.example.com:5000", "nvidia/vgpu-manager"),
    ("localhost/vgpu-manager", "localhost", "vgpu-manager"),
    ("acme/vgpu-manager", "docker.io", "acme/vgpu-manager"),
    ("vgpu-manager", "docker.io", "library/vgpu-manager"),
])
def test_split_name_defaults_to_docker_hub(name, host, repository):
    assert split_name(name) == (host, repository)


@pytest.mark.parametrize("host, public", [
    ("docker.io", True), ("registry-1.docker.io", True), ("nvcr.io", True), ("QUAY.IO", True),
    ("eu.gcr.io", True), ("ghcr.io:443", True), ("public.ecr.aws", True),
    ("registry.example.com", False), ("127.0.0.1:5000", False), ("harbor.gcr.io.example.com", False),
])
def test_public_registries(host, public):
    assert is_public_registry(host) is public


@pytest.mark.parametrize("name", ["docker.io/acme/vgpu-manager", "acme/vgpu-manager", "quay.io/acme/x"])
def test_public_target_is_refused_before_any_command(params, name):
    params["name"] = name
    with pytest.raises(ImageError, match="is a public registry") as err:
        make(params)
    assert name in str(err.value) and "\n" not in str(err.value)


def test_public_target_can_be_allowed(params):
    params.update(name="quay.io/acme/vgpu-manager", allow_public_registry=True)
    assert make(params)[0].ref == "quay.io/acme/vgpu-manager:%s-ubuntu24.04" % VERSION


@pytest.mark.parametrize("change, error, message", [
    ({"name": "registry.example.com/Nvidia/VGPU"}, ImageError, "not a valid image name"),
    ({"os_tag": "ubuntu 24.04"}, ImageError, "is not a valid image tag"),
    ({"driver_version": "550.54.16"}, ImageError, "driver_version 550.54.16 does not match"),
    ({"context_files": {"../x": ""}}, ImageError, "must be a plain file name"),
    ({"context_files": {"Containerfile": ""}}, ImageError, "must be a plain file name"),
    ({"context_paths": {"cli.pyz": "/nonexistent/cli.pyz"}}, ImageError, "no such file"),
    ({"runfile": "/nonexistent/NVIDIA-Linux-x86_64-570.124.03-vgpu-kvm.run"}, DriverError, "no such file"),
])
def test_bad_input_fails_in_one_line(params, change, error, message):
    params.update(change)
    with pytest.raises(error, match=message) as err:
        make(params)
    assert "\n" not in str(err.value)


def test_fresh_build_and_push_with_a_private_authfile(params):
    build, podman, registry = make(params)
    result = build.apply()
    assert result["actions"] == ["build", "push"] and result["changed"]
    assert registry.labels[HASH_LABEL] == result["input_hash"] and registry.labels["owner"] == "tests"
    build_argv = [call for call in podman.calls if call[1] == "build"][0]
    assert "--pull=never" in build_argv and "DRIVER_VERSION=%s" % VERSION in build_argv
    assert "RUNFILE=NVIDIA-Linux-x86_64-%s-vgpu-kvm.run" % VERSION in build_argv
    path, mode, content = podman.authfile
    assert mode == "0o600" and not os.path.exists(path)  # removed with the work dir
    assert base64.b64decode(content["auths"]["registry.example.com:5000"]["auth"]) == b"builder:s3cret"
    assert not [call for call in podman.calls if any("s3cret" in arg for arg in call)]


def test_unchanged_inputs_neither_build_nor_push(params):
    wanted = make(params)[0].input_hash()
    build, podman, _registry = make(params, remote={HASH_LABEL: wanted})
    assert build.apply()["actions"] == [] and not [c for c in podman.calls if c[1] in ("build", "push")]


def test_local_image_current_but_registry_stale_pushes_only(params):
    wanted = make(params)[0].input_hash()
    build, podman, _registry = make(params, remote={HASH_LABEL: "old"}, local={HASH_LABEL: wanted})
    assert build.apply()["actions"] == ["push"]
    assert [c[1] for c in podman.calls if c[1] in ("build", "push")] == ["push"]


def test_check_mode_runs_no_build_or_push(params):
    build, podman, registry = make(params)
    result = build.apply(check_mode=True)
    assert result["actions"] == ["build", "push"] and result["before"]["registry_input_hash"] is None
    assert not [c for c in podman.calls if c[1] in ("build", "push")] and registry.labels is None


def test_without_push_the_registry_is_not_read(params):
    params["push"] = False
    build, _podman, registry = make(params)
    assert build.apply()["actions"] == ["build"] and registry.reads == []


def test_force_rebuilds(params):
    params["force"] = True
    wanted = make(params)[0].input_hash()
    assert make(params, remote={HASH_LABEL: wanted}, local={HASH_LABEL: wanted})[0].apply()["actions"] == [
        "build", "push"]


@pytest.mark.parametrize("change", [
    {"containerfile": "FROM other\n"}, {"context_files": {"entrypoint.sh": "#!/bin/sh\necho\n"}},
    {"build_args": {"BASE_IMAGE": "c"}}, {"labels": {"owner": "x"}}, {"os_tag": "debian12"}])
def test_every_input_changes_the_hash(params, change):
    before = make(params)[0].input_hash()
    params.update(change)
    assert make(params)[0].input_hash() != before


def test_runfile_content_changes_the_hash(params):
    before = make(params)[0].input_hash()
    with open(params["runfile"], "a", encoding="utf-8") as handle:
        handle.write("# another build\n")
    assert make(params)[0].input_hash() != before


class TokenRegistry(http.server.BaseHTTPRequestHandler):
    """A registry that wants a bearer token from /token (basic auth), like Harbor or GitLab."""
    config = {"config": {"Labels": {HASH_LABEL: "abc"}}}

    def log_message(self, *args):
        pass

    def reply(self, code, body=b"", headers=()):
        self.send_response(code)
        for key, value in headers:
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):  # noqa: N802 (http.server's name)
        auth = self.headers.get("Authorization", "")
        if self.path.startswith("/token"):
            good = auth == "Basic " + base64.b64encode(b"builder:s3cret").decode()
            assert "scope=repository%3Anvidia%2Fvgpu-manager%3Apull" in self.path
            return self.reply(200 if good else 401, json.dumps({"token": "T"}).encode() if good else b"")
        if auth != "Bearer T":
            return self.reply(401, headers=[("WWW-Authenticate", 'Bearer realm="http://%s/token",service="r",'
                                             'scope="repository:nvidia/vgpu-manager:pull"' % self.headers["Host"])])
        if self.path == "/v2/nvidia/vgpu-manager/manifests/1-os":
            return self.reply(200, json.dumps({"config": {"digest": "sha256:c"}}).encode())
        if self.path == "/v2/nvidia/vgpu-manager/blobs/sha256:c":
            return self.reply(200, json.dumps(self.config).encode())
        return self.reply(404)


@pytest.fixture
def token_registry():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), TokenRegistry)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield "127.0.0.1:%d" % server.server_address[1]
    server.shutdown()
    server.server_close()


def test_registry_client_bearer_token_flow_over_plain_http(token_registry):
    client = RegistryClient(token_registry, "builder", "s3cret", tls_verify=False, timeout=5)
    assert client.image_labels("nvidia/vgpu-manager", "1-os") == {HASH_LABEL: "abc"}
    assert client.image_labels("nvidia/vgpu-manager", "missing") is None


def test_registry_client_wrong_password_is_one_line(token_registry):
    client = RegistryClient(token_registry, "builder", "wrong", tls_verify=False, timeout=5)
    with pytest.raises(ImageError, match="token request failed") as err:
        client.image_labels("nvidia/vgpu-manager", "1-os")
    assert "wrong" not in str(err.value) and "\n" not in str(err.value)


def test_registry_client_with_tls_verify_does_not_fall_back_to_http(token_registry):
    client = RegistryClient(token_registry, tls_verify=True, timeout=5)
    with pytest.raises(ImageError, match="cannot reach it"):
        client.image_labels("nvidia/vgpu-manager", "1-os")


def test_module_utils_stays_standard_library():
    with open(image_build.__file__, encoding="utf-8") as handle:
        assert "import ansible" not in handle.read().replace("ansible_collections", "")
