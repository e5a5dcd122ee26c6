# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node roots (sysfs_root, dev_root, proc_root) must be usable before anything is planned.

A typo in a boot unit or a DaemonSet mount (`/host/sy`) would otherwise read as an empty node:
"no GPU, nothing to do", exit 0, forever. A missing dev_root or proc_root is worse: no open VFIO
handle is found, so every VF looks free. Rules (one line naming the root and the path):
- sysfs_root: a directory with `bus/pci/devices` (every Linux sysfs has it, with or without GPUs);
- dev_root, proc_root: directories;
- kubelet_dir (where prepared DRA claims are recorded, which then hold their vGPUs): when given, a
  directory, since a typo would make every claimed vGPU look free; when not given, the kubelet's
  default directory, which may be absent (a host without a kubelet has no claims).
Used by every node module (module_glue.NodeContext, vgpu_driver), the node CLI and so the agent.
"""

from __future__ import annotations

import os

from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError, shown
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders.claim_holders import DEFAULT_KUBELET_DIR

PCI_DEVICES = os.path.join("bus", "pci", "devices")


class RootError(EngineError):
    """A node root that does not exist or is not what it should be."""


def _directory(option, path):
    if not os.path.exists(path):
        raise RootError("%s %s: no such directory" % (option, shown(path)))
    if not os.path.isdir(path):
        raise RootError("%s %s: not a directory" % (option, shown(path)))
    if not os.access(path, os.R_OK | os.X_OK):
        raise RootError("%s %s: not readable" % (option, shown(path)))


def check_roots(sysfs_root, dev_root=None, proc_root=None):
    """Raise RootError (one line) unless every given root is usable; None skips a root."""
    _directory("sysfs_root", sysfs_root)
    if not os.path.isdir(os.path.join(sysfs_root, PCI_DEVICES)):
        raise RootError("sysfs_root %s: no %s below it; not a sysfs (is the host's /sys mounted there?)"
                        % (shown(sysfs_root), PCI_DEVICES))
    for option, path in (("dev_root", dev_root), ("proc_root", proc_root)):
        if path is not None:
            _directory(option, path)


def check_kubelet_dir(kubelet_dir=None):
    """The kubelet directory to read prepared DRA claims under: a given one must be a usable
    directory (RootError otherwise); None is DEFAULT_KUBELET_DIR, which may be absent."""
    if kubelet_dir is None:
        return DEFAULT_KUBELET_DIR
    _directory("kubelet_dir", kubelet_dir)
    return kubelet_dir
