# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which vGPUs the kubelet allocated to pods through the device plugin: the node layer's reading of the
allocation record (standard library only).

Between the kubelet's Allocate and QEMU opening the VF (image pull, volume attach: seconds to minutes) no process
holds the VF, so the /proc scan (node/inuse.py) sees it free. The device plugin (kubelet/device_plugin.py, in the
agent) therefore records every device it hands out, durably, BEFORE it answers Allocate, in

    <kubelet dir>/plugins/accelops-vgpu-device-plugin/allocations.json
    {"version": 1, "checksum": "<sha256 of the canonical devices JSON>",
     "devices": {"<VF address or mdev UUID>": {"resource": "nvidia.com/NVIDIA_L40S-24Q", "allocatedAt": <unix s>,
                                              "pod": "<namespace>/<name>" once the kubelet lists it}}}

and at every reconcile drops the devices no live pod holds any more, as the kubelet's PodResources API v1 says
(kubelet/pod_resources.py; a device allocated moments ago and not listed yet is kept: the kubelet lists it only
after Allocate returned). Fail closed: when PodResources cannot be read nothing is dropped, and a record that cannot be read or
trusted is an error naming the file (never "nothing held"). The node engine, the CLI, the modules, the boot unit
and the manager image read it through `holders_source` (node/kubelet_holders.py gathers every kubelet source).
Not under device-plugins/: the kubelet deletes the files there when it starts.
"""

from __future__ import annotations

import json
import os

from ansible_collections.accelops.vgpu.plugins.module_utils.atomic_file import DURABLE, write_file
from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError
from ansible_collections.accelops.vgpu.plugins.module_utils.node import claim_holders
from ansible_collections.accelops.vgpu.plugins.module_utils.node.claim_holders import DEFAULT_KUBELET_DIR

DIRECTORY = "accelops-vgpu-device-plugin"  # under <kubelet dir>/plugins/
FILE_NAME = "allocations.json"
VERSION = 1
HOLDER = "pod %s (device plugin, %s)"                        # a device the kubelet lists for a live pod
HOLDER_PENDING = "a pod not listed yet (device plugin, %s)"  # allocated, not (yet) in PodResources


class AllocationRecordError(EngineError):
    """The allocation record cannot be read or trusted; the message names the file."""


def record_path(kubelet_dir=DEFAULT_KUBELET_DIR):
    return os.path.join(kubelet_dir or DEFAULT_KUBELET_DIR, "plugins", DIRECTORY, FILE_NAME)


def _checksum(devices):
    """The DRA checkpoint's checksum (sha256 of the canonical JSON), over `devices`."""
    return claim_holders.checksum(claim_holders.canonical(devices))


def _valid(devices):
    return isinstance(devices, dict) and all(
        isinstance(entry, dict) and isinstance(entry.get("resource"), str) for entry in devices.values())


def read(path):
    """The verified `devices` of the record at `path`; {} when there is none."""
    try:
        with open(path) as handle:
            doc = json.load(handle)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise AllocationRecordError("device plugin allocation record %s cannot be read: %s" % (path, exc)) from None
    if not isinstance(doc, dict) or doc.get("version") != VERSION or not _valid(doc.get("devices")):
        raise AllocationRecordError("device plugin allocation record %s: not a version %d record" % (path, VERSION))
    if doc.get("checksum") != _checksum(doc["devices"]):
        raise AllocationRecordError("device plugin allocation record %s: checksum mismatch (edited or damaged); "
                                    "move it away only when no pod on this node uses a vGPU resource" % path)
    return doc["devices"]


def write(path, devices):
    """Replace the record atomically and durably (file and directory fsynced: it must survive a power cut)."""
    write_file(path, json.dumps({"version": VERSION, "checksum": _checksum(devices), "devices": devices},
                                sort_keys=True) + "\n", mode=0o600, sync=DURABLE)


def holders(devices):
    """{device ID: [holder description]} of every recorded device."""
    return dict((device, [HOLDER % (entry["pod"], entry["resource"]) if entry.get("pod")
                          else HOLDER_PENDING % entry["resource"]]) for device, entry in devices.items())


def holders_source(kubelet_dir=DEFAULT_KUBELET_DIR):
    """An inuse.held_devices() source: the vGPUs allocated to pods under `kubelet_dir`, read at every call (the
    device plugin runs in the agent). A damaged record raises: unknown is held."""
    path = record_path(kubelet_dir)
    return lambda: holders(read(path))
