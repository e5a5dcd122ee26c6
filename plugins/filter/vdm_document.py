# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
name: vdm_document
short_description: One vgpu-device-manager config document from the vgpu_profiles layout variables
version_added: 0.1.0
description:
  - "Returns C({version: v1, vgpu-configs: {...}}), the document the node CLI, the vgpu_profile module and
    the node agent read, from whichever layout source is set, in this order: the text of a VDM config file
    (O(file_text), YAML or JSON), a VDM document as data (O(vdm_config)), or the Ansible-style C(_input)
    (C({label: [{devices, device_filter, profiles}]}); C(devices) defaults to V(all))."
  - The roles C(vgpu_profiles) (bastion path, one node) and C(vgpu_node_agent) (the agent's ConfigMap) both use it,
    so one inventory variable gives both the same document.
options:
  _input:
    description: The Ansible-style layouts (C(vgpu_profiles_configs)).
    type: dict
    required: true
  vdm_config:
    description: A VDM document as data (C(vgpu_profiles_vdm_config)).
    type: dict
    default: {}
  file_text:
    description: The content of a VDM config file (for example C(lookup('ansible.builtin.file', path))).
    type: str
    default: ""
  sources:
    description:
      - The names of the three variables that hold C(_input), O(vdm_config) and O(file_text)'s file, for the
        error message. When given, exactly one of the three must be set (non-empty), else the filter fails
        naming them.
    type: list
    elements: str
  selected:
    description:
      - When given, it must be one of the document's labels, else the filter fails listing them.
    type: str
"""

EXAMPLES = r"""
- name: The document of the vgpu_profiles variables
  ansible.builtin.set_fact:
    document: "{{ vgpu_profiles_configs | accelops.vgpu.vdm_document(vgpu_profiles_vdm_config) }}"

- name: The same, failing unless exactly one source is set and 'default' is one of its labels
  ansible.builtin.set_fact:
    document: >-
      {{ vgpu_profiles_configs | accelops.vgpu.vdm_document(vgpu_profiles_vdm_config, selected='default',
         sources=['vgpu_profiles_configs', 'vgpu_profiles_vdm_config', 'vgpu_profiles_vdm_config_file']) }}
"""

RETURN = r"""
_value:
  description: The vgpu-device-manager document (C(version), C(vgpu-configs)).
  type: dict
"""

import json

from ansible.errors import AnsibleFilterError
from ansible.module_utils.common.yaml import yaml_load


def _from_layouts(configs):
    converted = {}
    for label, entries in configs.items():
        if not isinstance(entries, list):
            raise AnsibleFilterError("vdm_document: layout %r is not a list of entries" % label)
        converted[label] = []
        for entry in entries:
            if not isinstance(entry, dict):
                raise AnsibleFilterError("vdm_document: layout %r has an entry that is not a mapping" % label)
            vdm_entry = {"devices": entry.get("devices", "all"), "vgpu-devices": entry.get("profiles") or {}}
            if "device_filter" in entry:
                vdm_entry["device-filter"] = entry["device_filter"]
            converted[label].append(vdm_entry)
    return {"version": "v1", "vgpu-configs": converted}


def vdm_document(configs, vdm_config=None, file_text="", sources=None, selected=None):
    if sources is not None:
        given = [name for name, value in zip(sources, (configs, vdm_config, file_text)) if value]
        if len(given) != 1:
            raise AnsibleFilterError("set exactly one of %s (set: %s)" % (", ".join(sources), ", ".join(given) or "none"))
    document = _document(configs, vdm_config, file_text)
    if selected is not None:
        labels = sorted((document.get("vgpu-configs") or {}) if isinstance(document, dict) else {})
        if not selected or selected not in labels:
            raise AnsibleFilterError("selected %r is not one of the labels %s" % (selected, labels))
    return document


def _document(configs, vdm_config, file_text):
    if file_text:
        try:
            document = yaml_load(file_text)
        except Exception as exc:  # a YAML error names the line; never echo the text
            raise AnsibleFilterError("vdm_document: the config file is not YAML or JSON: %s"
                                     % " ".join(str(exc).split())[:200]) from None
    elif vdm_config:
        document = vdm_config
    else:
        document = _from_layouts(configs or {})
    # plain data: what goes into a ConfigMap or a module argument
    return json.loads(json.dumps(document))


class FilterModule:
    def filters(self):
        return {"vdm_document": vdm_document}
