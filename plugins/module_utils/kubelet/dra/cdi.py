# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""CDI specs (Container Device Interface) for prepared vGPUs, and how files are written.

One spec per prepared claim, `<cdi dir>/vgpu.accelops.io-claim_<claim uid>.json`, kind
`vgpu.accelops.io/claim`, one CDI device per vGPU named `<claim uid>-<device name>`. Its container
edits are the VFIO device nodes, as KubeVirt's own device plugins hand them out
(pkg/virt-handler/device-manager/common.go formatVFIODeviceSpecs, formatVFIOCdevDeviceSpecs):
`/dev/vfio/vfio`, `/dev/vfio/<iommu group>` and, where the kernel exposes it, the iommufd cdev
`/dev/vfio/devices/vfio<N>`. cdiVersion 0.5.0: the oldest version that covers what is used and the
one the kubelet plugin helper writes for metadata, so every runtime with CDI loads it.

Files are replaced atomically (atomic_file.write_file, no fsync: a reader or a kill -9 never sees half a
spec, and a reboot empties /var/run/cdi and makes the driver write everything again anyway).
"""

from __future__ import annotations

import json
import os

from ansible_collections.accelops.vgpu.plugins.module_utils.atomic_file import RENAME, write_file

CDI_VERSION = "0.5.0"
CLASS = "claim"


def remove(path):
    """Remove a file; one already gone is fine."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def spec_path(cdi_dir, driver, claim_uid):
    return os.path.join(cdi_dir, "%s-%s_%s.json" % (driver, CLASS, claim_uid))


def device_id(driver, claim_uid, device_name):
    """The fully qualified CDI device ID (`vendor/class=name`) the kubelet passes to the runtime."""
    return "%s/%s=%s-%s" % (driver, CLASS, claim_uid, device_name)


def device_nodes(nodes, dev_dir="/dev"):
    """CDI deviceNodes of a vGPU whose VFIO nodes (relative to /dev/vfio/) are `nodes`: the VFIO
    container node first, then its group and cdev. Host paths: the runtime reads the spec on the host."""
    paths = [os.path.join(dev_dir, "vfio", "vfio")] + [os.path.join(dev_dir, "vfio", node) for node in nodes]
    return [{"path": path, "permissions": "rw"} for path in paths]


def claim_spec(driver, claim_uid, devices):
    """The spec (a dict) for one claim's vGPUs, `devices` = [(DraDevice, its VFIO nodes)]."""
    return {"cdiVersion": CDI_VERSION, "kind": "%s/%s" % (driver, CLASS),
            "devices": [{"name": "%s-%s" % (claim_uid, device.name),
                         "containerEdits": {"deviceNodes": device_nodes(nodes)}} for device, nodes in devices]}


def write_claim_spec(cdi_dir, driver, claim_uid, devices):
    path = spec_path(cdi_dir, driver, claim_uid)
    write_file(path, json.dumps(claim_spec(driver, claim_uid, devices), indent=2, sort_keys=True) + "\n", sync=RENAME)
    return path
