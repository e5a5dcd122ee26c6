# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node agent image: python3 and the node CLI zipapp on a Debian-family base, entrypoint
`accelops-vgpu agent` (build-host side, standard library).

Same engine as the vGPU manager image (image_build.ContainerImage: input hash label, registry check,
private authfile); only the Containerfile is fixed here, because the image has one job. The zipapp is
run once during the build, so an image whose python3 cannot run it never reaches the registry.

The zipapp: a given file (`node_cli`), or by default built by the module itself from the sources Ansible
shipped it with (node/cli_zipapp.py, as `vgpu_profile` builds it on the node: the same bytes from the
same sources); the default tag is the start of its sha256, so a changed engine gets a new tag.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile

from ansible_collections.accelops.vgpu.plugins.module_utils.image.image_build import ContainerImage, ImageError
from ansible_collections.accelops.vgpu.plugins.module_utils.node import cli_zipapp

CLI_NAME = "accelops-vgpu.pyz"
CLI_PATH = "/usr/local/bin/accelops-vgpu"
TAG_DIGITS = 16   # default tag: this many hex digits of the zipapp's sha256
# Debian package names (policy 5.6.1), optionally pinned `name=version`: nothing a shell would read.
PACKAGE_PATTERN = re.compile(r"^[a-z0-9][a-z0-9+.-]+(=[A-Za-z0-9.+~:-]+)?\Z")

CONTAINERFILE = """\
# accelops.vgpu node agent (accelops.vgpu.agent_image): `accelops-vgpu agent` reconciles the node's
# vGPU layout from its nvidia.com/vgpu.config label (the vgpu_node_agent role's DaemonSet runs it).
ARG BASE_IMAGE
FROM ${{BASE_IMAGE}}
{packages}COPY --chmod=0755 {cli_name} {cli_path}
# Fails the build when the base image's python3 cannot run the node CLI.
RUN {cli_path} --help > /dev/null
LABEL org.opencontainers.image.title="accelops-vgpu node agent"
ENTRYPOINT ["{cli_path}", "agent"]
"""
APT_STEP = """\
RUN export DEBIAN_FRONTEND=noninteractive && apt-get update \\
 && apt-get install -y --no-install-recommends {names} \\
 && rm -rf /var/lib/apt/lists/*
"""


def agent_containerfile(packages):
    """The Containerfile text; `packages` are installed with apt-get first (none: no apt step)."""
    step = APT_STEP.format(names=" ".join(packages)) if packages else ""
    return CONTAINERFILE.format(packages=step, cli_name=CLI_NAME, cli_path=CLI_PATH)


class AgentImage(ContainerImage):
    """`params`: the agent_image module's options (name, tag, node_cli, base_image, packages, ...)."""

    def __init__(self, runner, params, registry_client=None, build_cli=cli_zipapp.shipped):
        for package in params["packages"]:
            if not PACKAGE_PATTERN.match(package):
                raise ImageError("image %s: %r is not a Debian package name" % (params["name"], package))
        full = dict(params, containerfile=agent_containerfile(params["packages"]), context_files={},
                    context_paths={}, build_args={"BASE_IMAGE": params["base_image"]})
        self.cli_path, self._built_cli = params.get("node_cli"), None
        if not self.cli_path:   # built here, into a private file removed after apply()
            handle, self.cli_path = tempfile.mkstemp(prefix="accelops-vgpu-", suffix=".pyz", dir=params.get("work_dir"))
            self._built_cli = self.cli_path
            with os.fdopen(handle, "wb") as out:
                out.write(build_cli())
        try:
            super().__init__(runner, full, registry_client)
        except Exception:
            self.cleanup()
            raise

    def cleanup(self):
        if self._built_cli:
            try:
                os.unlink(self._built_cli)
            except OSError:
                pass
            self._built_cli = None

    def apply(self, check_mode=False):
        try:
            return super().apply(check_mode)
        finally:
            self.cleanup()

    def _check_source(self, name):
        if not os.path.isfile(self.cli_path):
            raise ImageError("image %s: node CLI %s: no such file (leave node_cli out: the module builds it)"
                             % (name, self.cli_path))

    def _tag(self):
        return self.params.get("tag") or cli_tag(self.cli_path)

    def own_paths(self):
        return {CLI_NAME: self.cli_path}

    def result_fields(self):
        return {"containerfile": self.params["containerfile"], "node_cli_sha256": _sha256(self.cli_path)}


def _sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def cli_tag(path):
    """The default image tag of a node CLI zipapp file: the first TAG_DIGITS hex digits of its sha256."""
    return _sha256(path)[:TAG_DIGITS]


def shipped_tag(build_cli=cli_zipapp.shipped):
    """The default tag of the zipapp the running collection builds (the role's default image tag)."""
    return hashlib.sha256(build_cli()).hexdigest()[:TAG_DIGITS]
