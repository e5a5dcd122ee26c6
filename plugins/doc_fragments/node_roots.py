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
  kubelet_dir:
    description:
      - The kubelet's root directory (its C(--root-dir)). A vGPU that a DRA claim prepared there by the
        C(vgpu.accelops.io) driver uses (C(<kubelet_dir>/plugins/vgpu.accelops.io/checkpoint.json)) counts as
        held, like one a VM holds open; so does a vGPU the node agent's device plugin allocated to a pod that still
        lives (its record in C(<kubelet_dir>/plugins/accelops-vgpu-device-plugin/)), before its VM opens it.
      - Set it where the kubelet keeps another directory, for example C(/var/lib/k0s/kubelet) (k0s) or
        C(/var/snap/microk8s/common/var/lib/kubelet) (MicroK8s); otherwise the claims prepared there are not seen.
      - When not set, C(/var/lib/kubelet), which may be absent (a host without a kubelet has no claims). A directory
        that is set must exist, or the task fails (a typo must not make every claimed vGPU look free).
    type: path
"""
