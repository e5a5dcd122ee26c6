# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
name: node_cli_tag
short_description: The default tag of the node agent image
version_added: 0.1.0
description:
  - The first 16 hex digits of the sha256 of the agent CLI zipapp this collection builds (the node CLI with the
    node agent, cli_zipapp.py, reproducible bytes), the tag M(accelops.vgpu.agent_image) gives the image by default. The
    C(vgpu_node_agent) role deploys that tag unless C(vgpu_node_agent_image_tag) is set, so the image it
    builds and the DaemonSet it deploys agree without building anything on the controller.
  - Takes no terms.
author:
  - accelops.vgpu contributors (@accelops)
"""

EXAMPLES = r"""
- name: Show the node agent image tag of this collection
  ansible.builtin.debug:
    msg: "{{ lookup('accelops.vgpu.node_cli_tag') }}"
"""

RETURN = r"""
_raw:
  description: One element, the tag.
  type: list
  elements: str
"""

from ansible.plugins.lookup import LookupBase

from ansible_collections.accelops.vgpu.plugins.module_utils.image.agent_image import shipped_tag


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        return [shipped_tag()]
