# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""After the refused layout change: the VM still holds its VF, and the VF kept its vGPU type."""

from __future__ import annotations

import os

import yaml
from gpusim.models import MODELS

with open(os.path.join(os.path.dirname(__file__), "..", "..", "shared", "group_vars", "vgpu_nodes.yml"),
          encoding="utf-8") as vars_file:
    NODE_VARS = yaml.safe_load(vars_file)
L40S_PROFILE = list(NODE_VARS["vgpu_profiles_configs"][NODE_VARS["vgpu_profiles_selected"]][0]["profiles"])[0]
L40S_TYPE_ID = {vgpu_type.short_name: vgpu_type.type_id for vgpu_type in MODELS["l40s"].types}[L40S_PROFILE]


def held_vf(host):
    address = host.file("/run/molecule-held-vf").content_string.strip()
    assert address
    return address


def test_held_vf_keeps_its_vgpu_type(host):
    vgpu = host.file("/host/sys/bus/pci/devices/%s/nvidia/current_vgpu_type" % held_vf(host))
    assert int(vgpu.content_string) == L40S_TYPE_ID


def test_the_vm_still_holds_the_vf(host):
    group = os.path.basename(host.file("/host/sys/bus/pci/devices/%s/iommu_group" % held_vf(host)).linked_to)
    holders = host.run("find /proc/[0-9]*/fd -lname '/host/sys/.gpusim/dev/vfio/%s'" % group)
    assert holders.stdout.strip(), "nothing holds /dev/vfio/%s any more" % group
