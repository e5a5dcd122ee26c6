# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Build and push container images with podman (build-host side, standard library): the engine of
the image modules (`ContainerImage`), the private vGPU manager image (`ImageBuild`) on it; the node
agent image is in agent_image.py. An image that carries the node CLI zipapp gets it from
node_cli_file.py (a given file or the one built from the shipped sources), in one place for both.

Idempotency: every input (Containerfile, context files, runfile and node CLI checksums, build args, labels, tag)
goes into one sha256, stored in the image label `io.accelops.vgpu.input-hash`. A run compares it
with the image already in the registry (manifest + config through the registry's HTTP API), then
with the local image: equal hashes mean no build and no push.

The runfile is licensed: a registry anyone can pull from is refused unless explicitly allowed, and
the registry password only ever goes into a 0600 auth file in a private temp dir (never argv).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import ssl
import tempfile
import urllib.error
import urllib.parse
import urllib.request

from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError, shown
from ansible_collections.accelops.vgpu.plugins.module_utils.image.node_cli_file import NodeCliFile
from ansible_collections.accelops.vgpu.plugins.module_utils.node.module_glue import engine_errors, exit_with_diff
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine.nvdriver import Runfile
from ansible_collections.accelops.vgpu.plugins.module_utils.runner import FunctionRunner

HASH_LABEL = "io.accelops.vgpu.input-hash"
DOCKER_HUB = "docker.io"
# Hosts anyone can pull from (a push there publishes the licensed runfile); suffixes cover regional mirrors.
PUBLIC_REGISTRIES = frozenset((
    "docker.io", "registry-1.docker.io", "index.docker.io", "registry.hub.docker.com", "nvcr.io", "quay.io",
    "ghcr.io", "gcr.io", "k8s.gcr.io", "registry.k8s.io", "public.ecr.aws", "mcr.microsoft.com",
    "registry.gitlab.com", "docker.pkg.github.com", "registry.access.redhat.com", "registry.redhat.io",
    "docker.elastic.co", "cgr.dev"))
PUBLIC_SUFFIXES = (".gcr.io", ".docker.io", ".quay.io")
MANIFEST_TYPES = ("application/vnd.oci.image.manifest.v1+json",
                  "application/vnd.docker.distribution.manifest.v2+json")
# \Z, not $: `$` also matches before a final newline.
NAME_PATTERN = re.compile(r"^[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*\Z")
TAG_PATTERN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}\Z")


class ImageError(EngineError):
    """The image cannot be built or pushed; the message names the image or the registry."""


def split_name(name):
    """(registry host, repository) of an image name; no host means Docker Hub, as podman resolves it."""
    first, _sep, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return first, rest
    return DOCKER_HUB, name if "/" in name else "library/" + name


def is_public_registry(host):
    bare = host.lower().rsplit(":", 1)[0] if not host.startswith("[") else host.lower()
    return bare in PUBLIC_REGISTRIES or bare.endswith(PUBLIC_SUFFIXES)


def sha256_file(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class RegistryClient:
    """Reads manifests and configs over the registry v2 API (basic or bearer-token auth).

    With tls_verify=False it skips certificate checks and falls back to plain HTTP, as podman's
    `--tls-verify=false` does.
    """

    def __init__(self, host, username=None, password=None, tls_verify=True, timeout=30):
        self.host, self.username, self.password = host, username, password
        self.tls_verify, self.timeout = tls_verify, timeout
        self._auth_header = None
        self._scheme = None
        self.api_host = "registry-1.docker.io" if host == DOCKER_HUB else host

    def _basic(self):
        token = base64.b64encode(("%s:%s" % (self.username, self.password)).encode()).decode()
        return "Basic " + token

    def _opener(self):
        # Standard library on purpose: the module runs on the build host, without Ansible's module_utils.urls.
        context = ssl.create_default_context()
        if not self.tls_verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return urllib.request.build_opener(urllib.request.HTTPSHandler(context=context))

    def _open(self, url, headers):
        request = urllib.request.Request(url, headers=headers)
        if self._auth_header:
            # unredirected: blob downloads may redirect to storage that rejects our credentials
            request.add_unredirected_header("Authorization", self._auth_header)
        return self._opener().open(request, timeout=self.timeout)

    def _authenticate(self, challenge):
        scheme, _sep, params = challenge.partition(" ")
        if scheme.lower() == "basic":
            if not self.username:
                raise ImageError("registry %s: needs credentials (registry_username/registry_password)" % self.host)
            self._auth_header = self._basic()
            return
        fields = dict(re.findall(r'(\w+)="([^"]*)"', params))
        query = urllib.parse.urlencode({k: v for k, v in fields.items() if k in ("service", "scope")})
        headers = {"Authorization": self._basic()} if self.username else {}
        try:
            with self._opener().open(urllib.request.Request(fields["realm"] + "?" + query, headers=headers),
                                     timeout=self.timeout) as response:
                answer = json.load(response)
        except (KeyError, OSError, ValueError) as exc:
            raise ImageError("registry %s: token request failed: %s" % (self.host, exc)) from exc
        self._auth_header = "Bearer " + (answer.get("token") or answer.get("access_token", ""))

    def get(self, path, accept=()):
        """(status, headers, body bytes) of GET /v2/<path>; 404 is returned, other errors raise."""
        headers = {"Accept": ", ".join(accept)} if accept else {}
        for attempt in (1, 2):
            try:
                with self._open_v2(path, headers) as response:
                    return response.status, response.headers, response.read()
            except urllib.error.HTTPError as exc:
                if exc.code == 404:
                    return 404, exc.headers, b""
                if exc.code == 401 and attempt == 1 and exc.headers.get("WWW-Authenticate"):
                    self._authenticate(exc.headers["WWW-Authenticate"])
                    continue
                who = " as %s" % self.username if self.username else ""
                raise ImageError("registry %s: GET /v2/%s%s: HTTP %s %s"
                                 % (self.host, path, who, exc.code, exc.reason)) from exc
        raise AssertionError("unreachable: the second attempt returns or raises")

    def _open_v2(self, path, headers):
        """Open /v2/<path>, finding the scheme once: https, or http too without tls_verify."""
        schemes = [self._scheme] if self._scheme else ["https"] if self.tls_verify else ["https", "http"]
        for scheme in schemes:
            try:
                response = self._open("%s://%s/v2/%s" % (scheme, self.api_host, path), headers)
            except urllib.error.HTTPError:
                self._scheme = scheme  # the server answered: right scheme, wrong request
                raise
            except (urllib.error.URLError, OSError) as exc:
                if scheme == schemes[-1]:
                    raise ImageError("registry %s: cannot reach it: %s"
                                     % (self.host, getattr(exc, "reason", exc))) from exc
                continue
            self._scheme = scheme
            return response
        raise AssertionError("unreachable: the last scheme returns or raises")

    def image_labels(self, repository, tag):
        """Labels of repository:tag in the registry, or None when the tag is not there."""
        status, _headers, body = self.get("%s/manifests/%s" % (repository, tag), MANIFEST_TYPES)
        if status == 404:
            return None
        manifest = json.loads(body)
        digest = manifest.get("config", {}).get("digest")
        if not digest:  # an index/list: not something this module pushed
            return {}
        status, _headers, body = self.get("%s/blobs/%s" % (repository, digest))
        return {} if status == 404 else (json.loads(body).get("config") or {}).get("Labels") or {}


class ContainerImage:
    """Plan and run one podman build + push of `<name>:<tag>`; `params` as the image modules' options.

    The shared engine of the image modules: subclasses say how the tag comes about (`_tag`), what
    else goes into the context (`own_paths`), whether the image carries the node CLI zipapp
    (`carries_node_cli`: then `self.node_cli`, a NodeCliFile from `params["node_cli"]` or `build_cli`,
    goes in as accelops-vgpu.pyz), the build args and extra result fields.
    """

    def __init__(self, runner, params, registry_client=None, build_cli=None):
        self.runner, self.params = runner, params
        name = params["name"]
        self.host, self.repository = split_name(name)
        if not NAME_PATTERN.match(self.repository):
            raise ImageError("image %s: not a valid image name (registry/path/name, lower case)" % shown(name))
        self._check_source(name)
        self.node_cli = self._node_cli(name, build_cli) if self.carries_node_cli() else None
        self.tag = self._tag()
        if not TAG_PATTERN.match(self.tag):
            raise ImageError("image %s: tag %s is not a valid image tag%s"
                             % (name, shown(self.tag), self.tag_hint))
        self.ref = "%s:%s" % (name, self.tag)
        reserved = ("Containerfile",) + tuple(self.own_paths()) + tuple(self.own_data())
        for file_name in list(params["context_files"]) + list(params["context_paths"]):
            if "/" in file_name or file_name.startswith(".") or file_name in reserved:
                raise ImageError("image %s: context file name %r must be a plain file name other than %s"
                                 % (self.ref, file_name, " or ".join(reserved)))
        for file_name, path in params["context_paths"].items():
            if not os.path.isfile(path):
                raise ImageError("image %s: context file %s (%s): no such file" % (self.ref, file_name, path))
        self.registry = registry_client or RegistryClient(
            self.host, params.get("registry_username"), params.get("registry_password"), params["tls_verify"])

    tag_hint = ""

    def _check_source(self, name):
        """Refuse inputs that must not be built or pushed (before anything else is read)."""

    def carries_node_cli(self):
        return False

    def _node_cli(self, name, build_cli):
        given = self.params.get("node_cli")
        if given and not os.path.isfile(given):
            raise ImageError("image %s: node CLI %s: no such file (leave node_cli out: the module builds it)"
                             % (name, given))
        try:
            return NodeCliFile(given, build_cli)
        except OSError as exc:
            if not given:
                raise
            raise ImageError("image %s: node CLI %s: %s" % (name, given, exc.strerror or exc)) from exc

    def _tag(self):
        return self.params["tag"]

    def own_paths(self):
        """Context files the image kind adds itself: {file name: path on the build host}."""
        return {}

    def own_data(self):
        """Context files the image kind adds as bytes (the node CLI): {file name: content}."""
        return {self.node_cli.context_name: self.node_cli.data} if self.node_cli else {}

    def build_args(self):
        return dict(self.params["build_args"])

    def result_fields(self):
        return {"node_cli_sha256": self.node_cli.sha256} if self.node_cli else {}

    def input_hash(self):
        digest = hashlib.sha256()
        paths = dict(self.params["context_paths"], **self.own_paths())
        checksums = {name: sha256_file(path) for name, path in paths.items()}
        checksums.update((name, hashlib.sha256(data).hexdigest()) for name, data in self.own_data().items())
        parts = {"containerfile": self.params["containerfile"], "files": self.params["context_files"],
                 "paths": checksums,
                 "build_args": self.build_args(), "labels": self.params["labels"], "ref": self.ref}
        digest.update(json.dumps(parts, sort_keys=True).encode())
        return digest.hexdigest()

    def local_labels(self):
        rc, out, _err = self.runner.run([self.params["executable"], "image", "inspect", "--format",
                                         "{{json .Labels}}", self.ref], check=False)
        return (json.loads(out or "null") or {}) if rc == 0 else None

    def remote_labels(self):
        return self.registry.image_labels(self.repository, self.tag)

    def plan(self):
        """(before, after, actions): actions is a list of 'build' / 'push'."""
        wanted = self.input_hash()
        force = self.params["force"]
        remote = self.remote_labels() if self.params["push"] else None
        remote_hash = (remote or {}).get(HASH_LABEL)
        local = self.local_labels()
        local_hash = (local or {}).get(HASH_LABEL)
        if self.params["push"] and remote_hash == wanted and not force:
            actions = []
        else:
            actions = ["build"] if force or local_hash != wanted else []
            actions += ["push"] if self.params["push"] else []
        before = {"image": self.ref, "local_input_hash": local_hash,
                  "registry_input_hash": remote_hash if self.params["push"] else None}
        after = {"image": self.ref, "local_input_hash": wanted if "build" in actions else local_hash,
                 "registry_input_hash": wanted if self.params["push"] else None}
        return before, after, actions, wanted

    def apply(self, check_mode=False):
        before, after, actions, wanted = self.plan()
        result = {"changed": bool(actions), "image": self.ref, "tag": self.tag, "input_hash": wanted,
                  "built": "build" in actions, "pushed": "push" in actions, "actions": list(actions),
                  "before": before, "after": after}
        result.update(self.result_fields())
        if check_mode or not actions:
            return result
        workdir = tempfile.mkdtemp(prefix="accelops-vgpu-image-", dir=self.params.get("work_dir"))
        try:
            if "build" in actions:
                self._build(os.path.join(workdir, "context"), wanted)
            if "push" in actions:
                self._push(workdir, wanted)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        return result

    def _build(self, context, wanted):
        os.makedirs(context)
        for name, content in list(self.params["context_files"].items()) + [("Containerfile",
                                                                           self.params["containerfile"])]:
            with open(os.path.join(context, name), "w", encoding="utf-8") as handle:
                handle.write(content)
        for name, path in dict(self.params["context_paths"], **self.own_paths()).items():
            _link_or_copy(path, os.path.join(context, name))
        for name, data in self.own_data().items():
            with open(os.path.join(context, name), "wb") as handle:
                handle.write(data)
        argv = [self.params["executable"], "build", "--pull=%s" % self.params["pull"],
                "-f", os.path.join(context, "Containerfile"), "-t", self.ref]
        for key, value in sorted(self.build_args().items()):
            argv += ["--build-arg", "%s=%s" % (key, value)]
        for key, value in sorted(dict(self.params["labels"], **{HASH_LABEL: wanted}).items()):
            argv += ["--label", "%s=%s" % (key, value)]
        self.runner.run(argv + [context])
        if (self.local_labels() or {}).get(HASH_LABEL) != wanted:
            raise ImageError("image %s: built, but the local image lacks the input hash label" % self.ref)

    def _push(self, workdir, wanted):
        argv = [self.params["executable"], "push", "--tls-verify=%s" % str(self.params["tls_verify"]).lower()]
        if self.params.get("registry_username"):
            argv += ["--authfile", self._write_authfile(workdir)]
        self.runner.run(argv + [self.ref])
        if (self.remote_labels() or {}).get(HASH_LABEL) != wanted:
            raise ImageError("image %s: pushed, but the registry does not serve it with the new input hash"
                             % self.ref)

    def _write_authfile(self, workdir):
        """containers-auth.json for the registry, 0600 in the private (0700) work dir."""
        path = os.path.join(workdir, "auth.json")
        token = base64.b64encode(("%s:%s" % (self.params["registry_username"],
                                             self.params["registry_password"] or "")).encode()).decode()
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            json.dump({"auths": {self.host: {"auth": token}}}, handle)
        return path


class ImageBuild(ContainerImage):
    """The vGPU manager image: the licensed runfile goes in, the tag is `<driver version>-<os_tag>`."""

    tag_hint = " (check os_tag)"

    def _check_source(self, name):
        if is_public_registry(self.host) and not self.params["allow_public_registry"]:
            raise ImageError("image %s: %s is a public registry and the image contains the licensed NVIDIA "
                             "runfile; push to a private registry (or set allow_public_registry)"
                             % (name, self.host))
        self.runfile = Runfile.from_file(self.params["runfile"])
        if self.params.get("driver_version") and self.params["driver_version"] != self.runfile.version:
            raise ImageError("image %s: driver_version %s does not match runfile %s (%s)"
                             % (name, self.params["driver_version"], self.params["runfile"], self.runfile.version))
        if self.params.get("include_node_cli") is False and self.params.get("node_cli"):
            raise ImageError("image %s: node_cli %s is given but include_node_cli is false (drop one)"
                             % (name, self.params["node_cli"]))

    def carries_node_cli(self):
        """With include_node_cli, or a given node_cli (include_node_cli left out)."""
        return bool(self.params.get("include_node_cli") or self.params.get("node_cli"))

    def _tag(self):
        return "%s-%s" % (self.runfile.version, self.params["os_tag"])

    def own_paths(self):
        return {os.path.basename(self.runfile.path): self.runfile.path}

    def build_args(self):
        args = dict(self.params["build_args"])
        args.update(DRIVER_VERSION=self.runfile.version, DRIVER_ARCH=self.runfile.arch,
                    RUNFILE=os.path.basename(self.runfile.path))
        return args

    def result_fields(self):
        return dict(super().result_fields(), driver_version=self.runfile.version)


# The options every image module shares (their documentation stays in each module).
IMAGE_OPTIONS = dict(
    name=dict(type="str", required=True),
    labels=dict(type="dict", default={}),
    pull=dict(type="str", choices=["always", "missing", "never", "newer"], default="missing"),
    push=dict(type="bool", default=True),
    force=dict(type="bool", default=False),
    registry_username=dict(type="str"),
    registry_password=dict(type="str", no_log=True),
    tls_verify=dict(type="bool", default=True),
    work_dir=dict(type="path"),
    executable=dict(type="str", default="podman"),
)


def image_argspec(**own):
    """The shared image options plus the module's own, as an AnsibleModule argument_spec."""
    return dict(json.loads(json.dumps(IMAGE_OPTIONS)), **own)


def run_image_module(module, image_class):
    """The image modules' main(): plan, build and push (not in check mode), diff with the planned actions."""
    with engine_errors(module) as result:
        result.update(image_class(FunctionRunner(module.run_command), module.params).apply(module.check_mode))
    before, after = result.pop("before"), result.pop("after")
    exit_with_diff(module, result.pop("changed"), {"before": before, "after": dict(after, actions=result["actions"])},
                   **result)


def _link_or_copy(source, target):
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)
