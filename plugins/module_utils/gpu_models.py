# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one table of known NVIDIA GPU PCI IDs and their model names.

Source: NVIDIA/vgpu-device-manager `examples/config-example.yaml` (`default` config, device filters
`0x<device><vendor>`) at acb7270, cross-checked against
(L40S: public `lspci` output; H200 SXM: gpu-operator#2594; RTX PRO 6000: cubecos#312; A2: the
harvester/pcidevices fixture). On NVIDIA SR-IOV GPUs a VF reports its PF's ID, so the table names
VFs too. A2 and A16 share 0x25b6 and cannot be told apart by ID.
"""

from __future__ import annotations

NVIDIA_VENDOR = "10de"  # PCI vendor ID (lower-case hex, as sysfs `vendor` without 0x); node/hw/pci.py uses it

# device ID (lower-case hex) -> model name, vendor 10de
NVIDIA_MODELS = {
    "26b9": "L40S",
    "26b5": "L40",
    "27b8": "L4",
    "26ba": "L20",
    "2331": "H100 PCIe",
    "2330": "H100 SXM5",
    "2336": "H100 SXM5",
    "2321": "H100 NVL",
    "2335": "H200 SXM",
    "233b": "H200 NVL",
    "2342": "GH200",
    "2348": "GH200",
    "2901": "B200",
    "2bb5": "RTX PRO 6000 Blackwell",
    "25b6": "A2/A16",
    "2236": "A10",
    "2235": "A40",
    "1eb8": "T4",
}


# What a GPU offers to time-sliced vGPUs, for the checks that run before its VFs are enabled
# (node/layout/layout_fit.py), when the driver cannot list its types (`nvidia-smi vgpu -s` missing or failing).
# Per device ID (vendor 10de): the profile prefix the driver's names use, the framebuffer in GB that
# vGPUs share (the size of the largest profile, one vGPU per GPU), and the offered profiles as
# {series: (sizes in GB)}. A type's per-GPU maximum is framebuffer // size, capped at one vGPU per VF
# (the PF's sriov_totalvfs, read from sysfs). Only fully sourced models are listed; any other GPU
# fails closed unless the driver answers. Sources:
# - L40S: profile names and sizes from the harvester/pcidevices fixture (type IDs 1145..1166, domain
#   brief section 9) and VDM's config-example (L40S-24Q: 2 per GPU); 48 GB (NVIDIA L40S datasheet).
# - L40: the same Ada 48 GB profile set as L40S (VDM config-example lists the same L40-nQ counts); 48 GB
#   (NVIDIA L40 datasheet).
# - H100 PCIe: C-series 4, 5, 8, 10, 16, 20, 40, 80 GB (NVIDIA vGPU user guide, H100 PCIe 80GB table;
#   VDM H100-40C); 80 GB (NVIDIA H100 datasheet).
_ADA_48GB = {"Q": (1, 2, 3, 4, 6, 8, 12, 16, 24, 48), "A": (1, 2, 3, 4, 6, 8, 12, 16, 24, 48), "B": (1, 2, 3)}
VGPU_OFFERS = {
    "26b9": ("L40S", 48, _ADA_48GB),
    "26b5": ("L40", 48, _ADA_48GB),
    "2331": ("H100", 80, {"C": (4, 5, 8, 10, 16, 20, 40, 80)}),
}


def vgpu_offer(vendor, device):
    """(profile prefix, framebuffer GB, {series: sizes}) of a GPU from VGPU_OFFERS, or None when unknown."""
    if not vendor or not device or vendor.lower() != NVIDIA_VENDOR:
        return None
    return VGPU_OFFERS.get(device.lower())


def model_name(vendor, device):
    """Model name for a (vendor, device) pair of 4-digit hex strings, or None when unknown."""
    if not vendor or not device or vendor.lower() != NVIDIA_VENDOR:
        return None
    return NVIDIA_MODELS.get(device.lower())
