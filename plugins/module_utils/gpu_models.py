# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one table of known NVIDIA GPU PCI IDs and their model names.

Source: NVIDIA/vgpu-device-manager `examples/config-example.yaml` (`default` config, device filters
`0x<device><vendor>`) at acb7270, cross-checked as noted in the domain brief section 9
(L40S: public `lspci` output; H200 SXM: gpu-operator#2594; RTX PRO 6000: cubecos#312; A2: the
harvester/pcidevices fixture). On NVIDIA SR-IOV GPUs a VF reports its PF's ID, so the table names
VFs too. A2 and A16 share 0x25b6 and cannot be told apart by ID.
"""

from __future__ import annotations

from ansible_collections.accelops.vgpu.plugins.module_utils.node.pci import NVIDIA_VENDOR

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


def model_name(vendor, device):
    """Model name for a (vendor, device) pair of 4-digit hex strings, or None when unknown."""
    if not vendor or not device or vendor.lower() != NVIDIA_VENDOR:
        return None
    return NVIDIA_MODELS.get(device.lower())
