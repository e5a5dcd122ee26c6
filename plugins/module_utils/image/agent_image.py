# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node agent image: python3 and the node CLI zipapp on a Debian-family base, entrypoint
`accelops-vgpu agent` (build-host side, standard library).

Same engine as the vGPU manager image (image_build.ContainerImage: input hash label, registry check,
private authfile); only the Containerfile is fixed here, because the image has one job. The zipapp is
run once during the build, so an image whose python3 cannot run it never reaches the registry.
"""

from __future__ import annotations

import os
import re

from ansible_collections.accelops.vgpu.plugins.module_utils.image.image_build import ContainerImage, ImageError

CLI_NAME = "accelops-vgpu.pyz"
CLI_PATH = "/usr/local/bin/accelops-vgpu"
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

    def __init__(self, runner, params, registry_client=None):
        for package in params["packages"]:
            if not PACKAGE_PATTERN.match(package):
                raise ImageError("image %s: %r is not a Debian package name" % (params["name"], package))
        full = dict(params, containerfile=agent_containerfile(params["packages"]), context_files={},
                    context_paths={}, build_args={"BASE_IMAGE": params["base_image"]})
        super().__init__(runner, full, registry_client)

    def _check_source(self, name):
        if not os.path.isfile(self.params["node_cli"]):
            raise ImageError("image %s: node CLI %s: no such file (build it with tools/build-node-cli.py)"
                             % (name, self.params["node_cli"]))

    def own_paths(self):
        return {CLI_NAME: self.params["node_cli"]}

    def result_fields(self):
        return {"containerfile": self.params["containerfile"]}
