#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: agent_image
short_description: Build the accelops-vgpu node agent image with podman and push it
version_added: 0.1.0
description:
  - Builds C(<name>:<tag>) from O(base_image) (Debian family, with C(python3) or with O(packages) that bring it)
    and the node CLI zipapp with the node agent, which the module builds itself from the collection sources Ansible
    shipped it with (the node engine M(accelops.vgpu.vgpu_profile) installs on the nodes, and the agent), or
    O(node_cli); the entrypoint is
    C(accelops-vgpu agent), the in-cluster node agent the C(vgpu_node_agent) role deploys as a DaemonSet.
  - The build runs the zipapp once (C(--help)), so an image whose python3 cannot run it fails to build.
  - Same engine as M(accelops.vgpu.vgpu_manager_image) - idempotent through the image label
    C(io.accelops.vgpu.input-hash) (Containerfile, zipapp checksum, base image, labels, tag); equal hashes in the
    registry (or locally without O(push)) mean no build and no push; the registry password only goes to a 0600
    auth file. The image holds nothing licensed, so public registries are not refused.
author:
  - accelops.vgpu contributors (@accelops)
extends_documentation_fragment:
  - accelops.vgpu.image_build
options:
  name:
    description:
      - Image name without tag, with the registry host, for example C(registry.example.com/accelops/vgpu-node-agent).
    type: str
    required: true
  tag:
    description:
      - Image tag. Default - the first 16 hex digits of the node CLI zipapp's sha256 (what the lookup
        C(accelops.vgpu.node_cli_tag) gives on the controller), so a changed engine gets a new tag.
    type: str
  node_cli:
    description:
      - Path of a node CLI zipapp on the build host (for example one C(tools/build-node-cli.py) made from a checkout).
        It must carry the node agent (C(tools/build-node-cli.py) without C(--without-agent)); the image runs its
        C(agent) verb.
        Default - the module builds it, agent included, from its own sources into a private file it removes again.
    type: path
  base_image:
    description:
      - Base image, C(FROM). It must have C(python3) (3.7 or later) unless O(packages) installs it with apt-get.
    type: str
    required: true
  packages:
    description:
      - Debian packages installed with apt-get on top of the base image (for example V(python3) on a slim base).
        Empty - no apt-get step.
    type: list
    elements: str
    default: []
"""

EXAMPLES = r"""
- name: Build and push the node agent image
  accelops.vgpu.agent_image:
    name: registry.example.com/accelops/vgpu-node-agent
    base_image: docker.io/library/debian:bookworm-slim
    packages: [python3]
    registry_username: builder
    registry_password: "{{ vault_registry_password }}"
"""

RETURN = r"""
image:
  description: Full image reference.
  returned: always
  type: str
  sample: registry.example.com/accelops/vgpu-node-agent:0.1.0
tag:
  description: Image tag.
  returned: always
  type: str
input_hash:
  description: sha256 of all inputs, stored as the image label C(io.accelops.vgpu.input-hash).
  returned: always
  type: str
built:
  description: Whether the image was (or in check mode would be) built.
  returned: always
  type: bool
pushed:
  description: Whether the image was (or in check mode would be) pushed.
  returned: always
  type: bool
actions:
  description: C(build) and/or C(push), in order.
  returned: always
  type: list
  elements: str
containerfile:
  description: The Containerfile the image is built from.
  returned: always
  type: str
node_cli_sha256:
  description: sha256 of the node CLI zipapp in the image.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.accelops.vgpu.plugins.module_utils.image.agent_image import AgentImage
from ansible_collections.accelops.vgpu.plugins.module_utils.image.image_build import image_argspec, run_image_module


def main():
    module = AnsibleModule(
        argument_spec=image_argspec(
            tag=dict(type="str"),
            node_cli=dict(type="path"),
            base_image=dict(type="str", required=True),
            packages=dict(type="list", elements="str", default=[]),
        ),
        required_together=[("registry_username", "registry_password")],
        supports_check_mode=True,
    )
    run_image_module(module, AgentImage)


if __name__ == "__main__":
    main()
