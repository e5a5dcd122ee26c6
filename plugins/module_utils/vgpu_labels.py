# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The per-profile node labels, shared by the cluster side (node_labels) and the node agent.

`accelops.io/vgpu.profile.<profile>=<count>`: one label per profile in use on the node, so VMs can
be scheduled by profile although KubeVirt sees one PCI ID per GPU model. Stdlib only (the agent
ships in the node CLI zipapp).
"""

from __future__ import annotations

DEFAULT_PROFILE_PREFIX = "accelops.io/vgpu.profile."


def profile_labels(profiles, prefix=DEFAULT_PROFILE_PREFIX):
    """{profile: count} -> {prefix + profile: "count"}."""
    return {prefix + str(profile): str(int(count)) for profile, count in sorted((profiles or {}).items())}


def profiles_in_use(resources):
    """{profile: count} from vgpu_apply's `resources` (one entry per profile and PCI ID)."""
    counts = {}
    for resource in resources or ():
        counts[resource["profile"]] = counts.get(resource["profile"], 0) + int(resource["count"])
    return counts
