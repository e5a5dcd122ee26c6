# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
name: vgpu_cluster_plan
short_description: KubeVirt entries, node profiles and validation errors from the nodes' vGPU results
version_added: 0.1.0
description:
  - Reads C(vgpu_profiles_resources) (published by the C(vgpu_profiles) role) of each host and returns
    the C(pciHostDevices) and C(mediatedDevices) entries for M(accelops.vgpu.kubevirt_hostdevices), the
    profiles per node for M(accelops.vgpu.node_labels), and a list of errors.
  - An error is reported for a node whose GPU model (PCI vendor selector) carries more than one vendor-VFIO
    profile (KubeVirt cannot tell them apart), for a host without results, and, with O(naming=profile), for a
    GPU model that carries different profiles on different nodes.
  - The node name is the host's C(kubevirt_vgpu_node_name), else its inventory name.
options:
  _input:
    description: Inventory host names.
    type: list
    elements: str
    required: true
  hostvars:
    description: The C(hostvars) mapping.
    type: dict
    required: true
  naming:
    description:
      - V(profile) uses each profile's resource name (one profile per GPU model cluster-wide);
        V(model) one resource per GPU model (C(nvidia.com/NVIDIA_L40S)), VMs pick profiles by node label.
    type: str
    default: profile
    choices: [profile, model]
  mdev_external_provider:
    description: Mark mediated devices as served by an external device plugin (the NVIDIA sandbox device plugin).
    type: bool
    default: true
  provider:
    description:
      - V(kubevirt) has KubeVirt's own device plugins serve the vGPUs (permitted by PCI ID; one profile per GPU
        model).
      - V(agent) has the node agent's device plugin serve them, one resource per profile. Every entry gets
        C(externalResourceProvider=true) and a GPU model may carry any profiles on any node.
    type: str
    default: kubevirt
    choices: [kubevirt, agent]
  extra_profiles:
    description:
      - With O(provider=agent), profiles the layouts name that no node carries yet (a relabel may converge a
        node to them), each C({type_name, pci_vendor_selector}) (C(framework=mdev) for an mdev type).
    type: list
    elements: dict
    default: []
"""

EXAMPLES = r"""
- name: Plan the cluster side
  ansible.builtin.set_fact:
    plan: "{{ groups['vgpu_nodes'] | accelops.vgpu.vgpu_cluster_plan(hostvars) }}"
"""

RETURN = r"""
_value:
  description: C(errors), C(pci_host_devices), C(mediated_devices), C(nodes) (name, profiles, vendor_vfio), C(vendor_vfio).
  type: dict
"""

from ansible.errors import AnsibleFilterError

# The engine is imported when the filter runs, not with this file: ansible-core loads every filter file of
# the collection in each forked worker that uses any accelops.vgpu filter (the node play's vdm_document on
# every host), and importing the engine with this file would be most of that cost (issue 34, P4b).


def profile_resource(profile):
    """A resource dict like vgpu_profile's from {type_name, pci_vendor_selector[, framework]}."""
    from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.vgpu_types import resource_name, short_name
    type_name = str(profile["type_name"]).strip()
    out = {"profile": short_name(type_name), "type_name": type_name, "resource_name": resource_name(type_name),
           "pci_vendor_selector": str(profile["pci_vendor_selector"]).upper(),
           "framework": profile.get("framework") or "vendor-vfio", "count": 0}
    if out["framework"] == "mdev":
        out["mdev_name_selector"] = type_name
    return out


def vgpu_cluster_plan(hosts, hostvars, naming="profile", mdev_external_provider=True, provider="kubevirt",
                      extra_profiles=()):
    from ansible_collections.accelops.vgpu.plugins.module_utils.cluster.kubevirt import plan_cluster_resources
    if naming not in ("profile", "model"):
        raise AnsibleFilterError("vgpu_cluster_plan: naming must be profile or model, not %r" % naming)
    nodes = []
    for host in hosts:
        facts = hostvars[host]
        # a top-level var while facts are injected as vars (Ansible's default), else under ansible_facts
        resources = facts.get("vgpu_profiles_resources", (facts.get("ansible_facts") or {}).get("vgpu_profiles_resources"))
        nodes.append({"name": facts.get("kubevirt_vgpu_node_name") or host, "resources": resources})
    try:
        extra = [profile_resource(p) for p in extra_profiles or ()]
    except (KeyError, TypeError, AttributeError) as exc:
        raise AnsibleFilterError("vgpu_cluster_plan: extra_profiles entries need type_name and pci_vendor_selector: "
                                 "%s" % exc) from None
    try:
        return plan_cluster_resources(nodes, naming, mdev_external_provider, provider, extra)
    except (KeyError, TypeError, AttributeError) as exc:
        raise AnsibleFilterError("vgpu_cluster_plan: malformed vgpu_profiles_resources: %s" % exc) from None


class FilterModule:
    def filters(self):
        return {"vgpu_cluster_plan": vgpu_cluster_plan}
