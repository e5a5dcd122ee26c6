# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node agent image: python3 and the node CLI zipapp on a Debian-family base, entrypoint
`accelops-vgpu agent` (build-host side, standard library).

Same engine as the vGPU manager image (image_build.ContainerImage: input hash label, registry check,
private authfile); only the Containerfile is fixed here, because the image has one job. The zipapp is
run once during the build, so an image whose python3 cannot run it never reaches the registry.

The zipapp (node_cli_file.py, as for the manager image): a given file (`node_cli`), or by default the agent
CLI built by the module itself from the sources Ansible shipped it with (cli_zipapp.py, `agent=True`: the
same bytes tools/build-node-cli.py makes from the same sources); the default tag is the start of its
sha256, so a changed engine gets a new tag.
"""

from __future__ import annotations

import re
import typing

from ansible_collections.accelops.vgpu.plugins.module_utils.image.image_build import ContainerImage, ImageError
from ansible_collections.accelops.vgpu.plugins.module_utils.image.node_cli_file import CONTEXT_NAME, NodeCliFile
from ansible_collections.accelops.vgpu.plugins.module_utils import cli_zipapp

# Ships the agent CLI's further sources (cli_zipapp.AGENT) with the module that builds the agent image, and
# with no other: Ansible's module packer follows these imports (cli_zipapp.py says why); never imported here.
if typing.TYPE_CHECKING:
    from ansible_collections.accelops.vgpu.plugins.module_utils.agent import agent  # noqa: F401  pylint: disable=unused-import
    from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet import vgpu_device_plugin  # noqa: F401  pylint: disable=unused-import
    from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import agent_plugin  # noqa: F401  pylint: disable=unused-import

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
    return CONTAINERFILE.format(packages=step, cli_name=CONTEXT_NAME, cli_path=CLI_PATH)


def agent_cli():
    """The agent CLI built from the running collection's sources (what the image runs: `agent`)."""
    return cli_zipapp.shipped(agent=True)


class AgentImage(ContainerImage):
    """`params`: the agent_image module's options (name, tag, node_cli, base_image, packages, ...)."""

    def __init__(self, runner, params, registry_client=None, build_cli=agent_cli):
        for package in params["packages"]:
            if not PACKAGE_PATTERN.match(package):
                raise ImageError("image %s: %r is not a Debian package name" % (params["name"], package))
        full = dict(params, containerfile=agent_containerfile(params["packages"]), context_files={},
                    context_paths={}, build_args={"BASE_IMAGE": params["base_image"]})
        super().__init__(runner, full, registry_client, build_cli)

    def carries_node_cli(self):
        return True

    def _tag(self):
        return self.params.get("tag") or self.node_cli.sha256[:TAG_DIGITS]

    def result_fields(self):
        return dict(super().result_fields(), containerfile=self.params["containerfile"])


def shipped_tag(build_cli=agent_cli):
    """The default tag of the zipapp the running collection builds (the role's default image tag)."""
    return NodeCliFile(build=build_cli).sha256[:TAG_DIGITS]
