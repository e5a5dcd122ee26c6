# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    # Options of every node-side module: where the node's /sys, /dev and /proc are.
    DOCUMENTATION = r"""
options:
  sysfs_root:
    description:
      - Directory that holds the node's sysfs.
      - Change it when the host's C(/sys) is mounted elsewhere, for example in a privileged
        DaemonSet container (C(/host/sys)) or a simulated node in tests.
      - A directory that does not exist or has no C(bus/pci/devices) below it fails the task (a typo must
        not read as a node without GPUs).
    type: path
    default: /sys
  dev_root:
    description:
      - Directory that holds the node's device nodes; VFIO devices are looked up below C(vfio/).
      - Used to tell which virtual functions a running VM holds open. A directory that does not exist fails the task.
    type: path
    default: /dev
  proc_root:
    description:
      - Directory that holds the node's procfs; open VFIO handles are found in C(<proc_root>/*/fd).
      - Point it at the host's C(/proc) from a container that does not share the host PID namespace.
        A directory that does not exist fails the task.
    type: path
    default: /proc
"""
