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
CLAIM_API = ("resource.k8s.io", "v1", "resourceclaims")
DRA_REQUEST = "vgpu"        # the request name in each claim, and the VMI's name for its claim
_DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")


def valid_namespace(name):
    return bool(_DNS_LABEL_RE.match(name or "")) and len(name) <= 63


def valid_subdomain(name):
    """A DNS-1123 subdomain (the name of a cluster-scoped object such as a DeviceClass)."""
    return bool(name) and len(name) <= 253 and all(_DNS_LABEL_RE.match(part) for part in name.split("."))


def run_of(obj):
    """The run label's value (the run ID) of an object, None when it is not ours."""
    return ((obj.get("metadata") or {}).get("labels") or {}).get(RUN_LABEL)


def is_ours(namespace_obj):
    return run_of(namespace_obj) is not None


def namespace_manifest(name, run_id):
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": {RUN_LABEL: run_id}}}


def vmi_manifest(name, namespace, run_id, plan, params, claim=None):
    """A small VMI requesting one vGPU, pinned to the plan's node: the plan's device-plugin resource
    (`gpus[].deviceName`), or with `claim` the ResourceClaim of that name (DRA: `spec.resourceClaims` and
    `gpus[].claimName/requestName`, as KubeVirt >= 1.6 reads them with GPUsWithDRA)."""
    volumes = [{"name": "containerdisk", "containerDisk": {"image": params["container_disk_image"]}}]
    disks = [{"name": "containerdisk", "disk": {"bus": "virtio"}}]
    if params.get("cloud_init_user_data"):
        volumes.append({"name": "cloudinit", "cloudInitNoCloud": {"userData": params["cloud_init_user_data"]}})
        disks.append({"name": "cloudinit", "disk": {"bus": "virtio"}})
    gpu = {"name": "vgpu1", "deviceName": plan["resource"]} if claim is None else \
        {"name": "vgpu1", "claimName": DRA_REQUEST, "requestName": DRA_REQUEST}
    vmi = {
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {RUN_LABEL: run_id, PROFILE_LABEL: plan["profile"]}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": plan["hostname"]},
            "terminationGracePeriodSeconds": 0,
            "domain": {"resources": {"requests": {"memory": params["vmi_memory"]}},
                       "devices": {"disks": disks, "gpus": [gpu]}},
            "volumes": volumes,
        },
    }
    if claim is not None:
        vmi["spec"]["resourceClaims"] = [{"name": DRA_REQUEST, "resourceClaimName": claim}]
    return vmi


def profile_selector(driver, profile, gpu=None):
    """The CEL expression that selects the devices of one vGPU profile of `driver` (README's claim examples); with
    `gpu`, only those of that physical GPU (`parentGPU`: the whole-or-vGPUs row, dra.exclusion_check)."""
    found = 'device.attributes["%s"].profile == "%s"' % (driver, profile)
    return found if gpu is None else '%s && device.attributes["%s"].parentGPU == "%s"' % (found, driver, gpu)


def claim_manifest(name, namespace, run_id, plan):
    """A resource.k8s.io/v1 ResourceClaim for one device of the plan's DeviceClass and profile."""
    return {
        "apiVersion": "%s/%s" % CLAIM_API[:2], "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {RUN_LABEL: run_id, PROFILE_LABEL: plan["profile"]}},
        "spec": {"devices": {"requests": [{"name": DRA_REQUEST, "exactly": {
            "deviceClassName": plan["device_class"], "allocationMode": "ExactCount", "count": 1,
            "selectors": [{"cel": {"expression": profile_selector(plan["driver"], plan["profile"], plan.get("gpu"))}}]}}]}},
    }


def describe(manifest):
    """`VirtualMachineInstance ns/name` / `ResourceClaim ns/name` / `Namespace name`: how the run lists what it
    creates."""
    meta = manifest["metadata"]
    where = "%s/%s" % (meta["namespace"], meta["name"]) if meta.get("namespace") else meta["name"]
    return "%s %s" % (manifest["kind"], where)
