# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The report's monitoring section: the PromQL a user graphs for the node agent's vGPUs (README "Metrics") and,
per node, what the series must add up to, from the profile labels the agent (or kubevirt_vgpu) keeps on the node.
"""

from __future__ import annotations

from ansible_collections.accelops.vgpu.plugins.module_utils.cluster.conformance.checks import label_profiles

QUERY = "sum by (node, profile, state) (accelops_vgpu_agent_vgpus * on (instance) group_left (node) " \
        "accelops_vgpu_agent_node_info)"


def section(nodes, prefix):
    """{"query": PromQL, "expected": ["<node>: accelops_vgpu_agent_vgpus{profile=...} <count>", ...]}."""
    expected = []
    for node in sorted(nodes, key=lambda n: (n.get("metadata") or {}).get("name") or ""):
        name = (node.get("metadata") or {}).get("name")
        for profile, count in sorted(label_profiles(node, prefix).items()):
            expected.append('node %s: sum(accelops_vgpu_agent_vgpus{profile="%s"}) == %d' % (name, profile, count))
    return {"query": QUERY, "expected": expected}


def markdown_lines(monitoring):
    if not monitoring:
        return []
    lines = ["", "## Monitoring", "", "Graph the node agent's vGPUs by node, profile and state (free, in_use, "
             "unhealthy):", "", "    " + monitoring["query"], ""]
    if monitoring["expected"]:
        lines.append("What the series must add up to, from the nodes' profile labels:")
        lines += ["- `%s`" % line for line in monitoring["expected"]]
    else:
        lines.append("No node carries profile labels yet.")
    return lines
