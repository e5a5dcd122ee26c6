# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The kubelet's own record of the devices it allocated to pods, as a holder source during a kubelet restart
(standard library only).

`<kubelet dir>/device-plugins/kubelet_internal_checkpoint` is the device manager's checkpoint, the one file of
device-plugins/ a starting kubelet keeps (pkg/kubelet/cm/devicemanager/manager.go CleanupPluginDirectory). The
kubelet reads it at start and gives a pod's restarted containers the same devices without calling Allocate again,
so while it restarts the checkpoint says what it still holds. Format (pkg/kubelet/cm/devicemanager/checkpoint/
checkpoint.go, v2): JSON {"Data": {"PodDeviceEntries": [{"PodUID", "ContainerName", "ResourceName", "DeviceIDs":
{"<NUMA node>": [device ID]}, "AllocResp": base64}], "RegisteredDevices": {resource: [device ID]}}, "Checksum":
uint, "BootID"?}. The checksum is FNV-32a over go-spew's `%#v` dump of Data (pkg/kubelet/checkpointmanager/
checksum/checksum.go; k8s.io/utils/dump.ForHash: SortKeys, DisableMethods, SpewKeys); `_dump` writes that dump.

Why only during a restart: the kubelet drops a gone pod's entries only at its next allocation
(manager.go UpdateAllocatedDevices, called from allocateContainerResources), so outside a restart an entry may be
a pod long deleted; then the allocation record, pruned against PodResources (node/holders/pod_allocations.py), is the
answer. The kubelet counts as restarting when its PodResources socket is missing, was made before this boot (no
kubelet started since: the boot unit runs before it) or less than RESTART_GRACE seconds ago.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import stat
import time

from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders.claim_holders import DEFAULT_KUBELET_DIR, read_boot_id

FILE_NAME = "kubelet_internal_checkpoint"
RESOURCE_DOMAIN = "nvidia.com/"      # the vGPU resources (vgpu_types.resource_name); other plugins' IDs are not ours
RESTART_GRACE = 60.0                 # seconds after the kubelet made its PodResources socket (pod_resources.GRACE)
HOLDER = "pod %s container %s (kubelet checkpoint while the kubelet restarts, %s)"


class KubeletCheckpointError(EngineError):
    """The kubelet's device checkpoint cannot be read or trusted; the message names the file."""


def checkpoint_path(kubelet_dir=DEFAULT_KUBELET_DIR):
    return os.path.join(kubelet_dir or DEFAULT_KUBELET_DIR, "device-plugins", FILE_NAME)


def _fnv32a(data):
    value = 0x811C9DC5
    for byte in data:
        value = ((value ^ byte) * 0x01000193) & 0xFFFFFFFF
    return value


def _strings(values):
    return "<nil>" if values is None else "[%s]" % " ".join(values)


def _dump(data):
    """go-spew's `%#v` of checkpoint.checkpointData: types in parentheses where the value is not a slice element or a
    map key or value, nil (JSON null) as <nil>, map keys sorted (NUMA nodes as numbers), strings and bytes bare."""
    entries = data.get("PodDeviceEntries", [])
    parts = []
    for entry in entries or ():
        numa = entry.get("DeviceIDs")          # absent in a list element: Go's zero value, a nil map
        ids = "<nil>" if numa is None else "map[%s]" % " ".join(
            "%d:%s" % (node, _strings(numa[key])) for node, key in sorted((int(k), k) for k in numa))
        alloc = entry.get("AllocResp")
        resp = "<nil>" if alloc is None else "[%s]" % " ".join(str(b) for b in base64.b64decode(alloc, validate=True))
        parts.append("{PodUID:(string)%s ContainerName:(string)%s ResourceName:(string)%s "
                     "DeviceIDs:(checkpoint.DevicesPerNUMA)%s AllocResp:([]uint8)%s}" % (
                         entry.get("PodUID", ""), entry.get("ContainerName", ""), entry.get("ResourceName", ""),
                         ids, resp))
    registered = data.get("RegisteredDevices", {})
    return "(checkpoint.checkpointData){PodDeviceEntries:([]checkpoint.PodDevicesEntry)%s " \
           "RegisteredDevices:(map[string][]string)%s}" % (
               "<nil>" if entries is None else "[%s]" % " ".join(parts),
               "<nil>" if registered is None else "map[%s]" % " ".join(
                   "%s:%s" % (name, _strings(registered[name])) for name in sorted(registered)))


def read(path):
    """{device ID: [holder]} of the nvidia.com/ devices the checkpoint at `path` allocates to pods; {} when there is
    none. KubeletCheckpointError (naming the file) when it cannot be read, parsed or its checksum does not match."""
    try:
        with open(path, "rb") as handle:
            doc = json.loads(handle.read())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise KubeletCheckpointError("kubelet device checkpoint %s cannot be read: %s" % (path, exc)) from None
    try:
        data = doc["Data"]
        if _fnv32a(_dump(data).encode()) != doc["Checksum"]:
            raise ValueError("checksum mismatch")
        found = {}
        for entry in data.get("PodDeviceEntries") or ():
            if not str(entry.get("ResourceName", "")).startswith(RESOURCE_DOMAIN):
                continue
            holder = HOLDER % (entry.get("PodUID"), entry.get("ContainerName"), entry["ResourceName"])
            for ids in (entry.get("DeviceIDs") or {}).values():
                for device in ids or ():
                    found.setdefault(device, []).append(holder)
        return found
    except (KeyError, TypeError, AttributeError, ValueError, binascii.Error) as exc:
        raise KubeletCheckpointError("kubelet device checkpoint %s: not a device manager checkpoint this agent can "
                                     "verify (%s); its devices count as held while the kubelet restarts"
                                     % (path, exc)) from None


def boot_time(proc_root="/proc"):
    """When this boot began (unix seconds: /proc/stat `btime`), or None when it cannot be read."""
    try:
        with open(os.path.join(proc_root, "stat")) as handle:
            for line in handle:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def written_this_boot(path, proc_root="/proc"):
    """Whether the checkpoint at `path` carries this boot's ID (`BootID`, which kubelets that detect a reboot write
    beside Data, manager.go detectNodeReboot): a kubelet ran since the boot, whatever the clock did."""
    boot = read_boot_id(proc_root)
    try:
        with open(path, "rb") as handle:
            return boot is not None and json.loads(handle.read()).get("BootID") == boot
    except (OSError, ValueError, AttributeError):
        return False


def kubelet_restarting(kubelet_dir=DEFAULT_KUBELET_DIR, grace=None, now=time.time, booted=boot_time,
                       this_boot=lambda: False):
    """Whether the kubelet is restarting as its PodResources socket says (no connection made): the socket is missing
    or not a socket, was made before this boot (no kubelet started since: the boot unit runs before it; unless
    `this_boot()`: btime moves with the wall clock, so an NTP step forward after the kubelet started makes its
    socket look older than the boot), or less than `grace` seconds ago."""
    path = os.path.join(kubelet_dir or DEFAULT_KUBELET_DIR, "pod-resources", "kubelet.sock")
    try:
        info = os.stat(path)
    except OSError:
        return True
    started = booted()
    return not stat.S_ISSOCK(info.st_mode) or (started is not None and info.st_ctime < started and not this_boot()) \
        or now() - info.st_ctime < (RESTART_GRACE if grace is None else grace)


def holders_source(kubelet_dir=DEFAULT_KUBELET_DIR, proc_root="/proc"):
    """An inuse.held_devices() source: while the kubelet restarts (or is down), the vGPUs its checkpoint allocates to
    pods; otherwise nothing (the allocation record answers). A checkpoint that cannot be trusted raises then: unknown
    is held."""
    path = checkpoint_path(kubelet_dir)

    def source():
        if not os.path.exists(path) or not kubelet_restarting(
                kubelet_dir, booted=lambda: boot_time(proc_root), this_boot=lambda: written_this_boot(path, proc_root)):
            return {}
        return read(path)
    return source
