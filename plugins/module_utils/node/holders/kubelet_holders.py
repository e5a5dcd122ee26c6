# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every record of the kubelet's plugins that says a vGPU belongs to a pod, as inuse.held_devices() sources: the one
list every path that writes a VF passes (node engine, CLI, modules, boot unit, manager image), so none forgets one.

- DRA claims prepared on the node (node/holders/claim_holders.py: the DRA driver's checkpoint);
- devices the device plugin allocated to pods that still live (node/holders/pod_allocations.py: the allocation record);
- while the kubelet restarts (or has not started since boot), the devices its own checkpoint allocates to pods
  (node/holders/kubelet_checkpoint.py: it gives them back to the pods' containers without a new Allocate).
Standard library only: both are files under the kubelet directory.
"""

from __future__ import annotations

from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import claim_holders, inuse, kubelet_checkpoint
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import pod_allocations


def holder_sources(kubelet_dir=claim_holders.DEFAULT_KUBELET_DIR):
    """(source, ...) for inuse.held_devices(sources=...): each returns {device: [holder]} read at every call and
    raises when its record cannot be trusted (unknown is held)."""
    kubelet_dir = kubelet_dir or claim_holders.DEFAULT_KUBELET_DIR
    return (claim_holders.holders_source(kubelet_dir), pod_allocations.holders_source(kubelet_dir),
            kubelet_checkpoint.holders_source(kubelet_dir))


def node_holders(sysfs, dev_root="/dev", proc_root="/proc", kubelet_dir=claim_holders.DEFAULT_KUBELET_DIR):
    """An inuse.Holders asking every source above: which devices are held and by whom, and the O(1) re-check a
    vGPU write makes right before it (node/engine/vgpu_writer.py), without a node engine."""
    return inuse.Holders(sysfs, dev_root, proc_root, holder_sources(kubelet_dir))
