# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a conformance run creates: its namespace and the test VMIs (pure manifest builders).

Everything carries the run label, so a leftover is recognisable as ours: a namespace without it
is never used, changed or deleted.
"""

from __future__ import annotations

import re

RUN_LABEL = "accelops.io/vgpu-conformance"
PROFILE_LABEL = "accelops.io/vgpu-conformance-profile"
VMI_API = ("kubevirt.io", "v1", "virtualmachineinstances")
_DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")


def valid_namespace(name):
    return bool(_DNS_LABEL_RE.match(name or "")) and len(name) <= 63


def run_of(obj):
    """The run label's value (the run ID) of an object, None when it is not ours."""
    return ((obj.get("metadata") or {}).get("labels") or {}).get(RUN_LABEL)


def is_ours(namespace_obj):
    return run_of(namespace_obj) is not None


def namespace_manifest(name, run_id):
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": {RUN_LABEL: run_id}}}


def vmi_manifest(name, namespace, run_id, plan, params):
    """A small VMI requesting one vGPU of the plan's resource, pinned to the plan's node."""
    volumes = [{"name": "containerdisk", "containerDisk": {"image": params["container_disk_image"]}}]
    disks = [{"name": "containerdisk", "disk": {"bus": "virtio"}}]
    if params.get("cloud_init_user_data"):
        volumes.append({"name": "cloudinit", "cloudInitNoCloud": {"userData": params["cloud_init_user_data"]}})
        disks.append({"name": "cloudinit", "disk": {"bus": "virtio"}})
    return {
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {RUN_LABEL: run_id, PROFILE_LABEL: plan["profile"]}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": plan["hostname"]},
            "terminationGracePeriodSeconds": 0,
            "domain": {"resources": {"requests": {"memory": params["vmi_memory"]}},
                       "devices": {"disks": disks, "gpus": [{"name": "vgpu1", "deviceName": plan["resource"]}]}},
            "volumes": volumes,
        },
    }


def describe(manifest):
    """`VirtualMachineInstance ns/name` / `Namespace name`: how the run lists what it creates."""
    meta = manifest["metadata"]
    where = "%s/%s" % (meta["namespace"], meta["name"]) if meta.get("namespace") else meta["name"]
    return "%s %s" % (manifest["kind"], where)
