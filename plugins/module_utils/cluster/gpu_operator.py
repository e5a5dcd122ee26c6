# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""GPU Operator integration: ClusterPolicy fields for VM workloads and our node labels.

Pure planning functions (dict in, plan out) plus thin runners that do the I/O through a KubeApi.

Decisions (NVIDIA/gpu-operator `deployments/gpu-operator/values.yaml`, `controllers/object_controls.go`
resolveDriverTag, `controllers/state_manager.go`):
- `vgpuManager.version` is given WITHOUT the OS suffix: the operator appends `-<os tag>` itself, so a
  version that already ends in one (`580.82-ubuntu24.04`) is rejected before any request.
- `vgpuDeviceManager.enabled: false` for vendor-VFIO nodes: the device manager is mdev-only.
- The sandbox validator's `vgpu-devices` step counts mdevs only (code inference, UNCONFIRMED at
  runtime), so on vendor-VFIO nodes it would block. We do not forge its marker files; the node
  label `nvidia.com/gpu.deploy.sandbox-validator=false` (the operator's per-node deploy switch)
  turns the validator off on exactly those nodes, reversibly (node_labels' sandbox_validator option).
- One owner per node's vGPUs: the GPU Operator's vGPU device manager applies its default config on
  every vm-vgpu node without a `nvidia.com/vgpu.config` label, deleting and re-creating all vGPUs
  (NVIDIA/vgpu-device-manager `pkg/vgpu/config.go` SetVGPUConfig), so on nodes whose layout this collection
  programs it is switched off with the operator's per-node deploy label
  `nvidia.com/gpu.deploy.vgpu-device-manager=false` (node_labels' vgpu_device_manager option; the ClusterPolicy
  switch stays for vendor-VFIO fleets).
- A deploy switch this collection set is its own: the Node annotation SWITCHES_ANNOTATION records
  each switch label with the value it set (same write). A switch the caller no longer wants
  (node_labels' release_deploy_switches; the kubevirt_vgpu role on a node that is no longer all
  vendor-VFIO) is removed while it still holds that recorded value; one set by someone else, or
  changed since, stays.
- Profile labels: one label per profile, `<prefix><profile>=<count>`, default prefix
  `accelops.io/vgpu.profile.` (we do not write into NVIDIA's `nvidia.com/` label namespace); a node
  with two GPU models carries two labels. Select VMs with `nodeAffinity` `Exists` on the key.
"""

from __future__ import annotations

import json
import re

from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError, shown
from ansible_collections.accelops.vgpu.plugins.module_utils.cluster.k8s_write import WritePlan, read_modify_write
from ansible_collections.accelops.vgpu.plugins.module_utils.vgpu_labels import DEFAULT_PROFILE_PREFIX, profile_labels

POLICY_GROUP, POLICY_VERSION, POLICY_PLURAL = "nvidia.com", "v1", "clusterpolicies"
WORKLOAD_LABEL = "nvidia.com/gpu.workload.config"
SANDBOX_VALIDATOR_LABEL = "nvidia.com/gpu.deploy.sandbox-validator"
VGPU_DEVICE_MANAGER_LABEL = "nvidia.com/gpu.deploy.vgpu-device-manager"
DEPLOY_SWITCHES = {"sandbox_validator": SANDBOX_VALIDATOR_LABEL, "vgpu_device_manager": VGPU_DEVICE_MANAGER_LABEL}
SWITCHES_ANNOTATION = "accelops.io/vgpu.deploy-switches"
# OS tags the operator appends (gpu-driver-container dirs and the usual node OS ids).
_OS_SUFFIX_RE = re.compile(r"-(ubuntu\d+(\.\d+)?|rhel\d+(\.\d+)?|rhcos\d+(\.\d+)*|centos\d+|sles\d+(\.\d+)?|"
                           r"debian\d+|rocky\d+(\.\d+)?)\Z", re.IGNORECASE)
# \Z, not $: `$` also matches before a final newline, so "gpu\n" would pass as a label.
_LABEL_NAME_RE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?\Z")
_DNS_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")


class GpuOperatorError(EngineError):
    """A ClusterPolicy or node label problem; the message names the object."""


# --- ClusterPolicy ----------------------------------------------------------------------------

def validate_vgpu_manager_version(version):
    if version and not version.startswith("sha256:") and _OS_SUFFIX_RE.search(version):
        base = _OS_SUFFIX_RE.sub("", version)
        raise GpuOperatorError("ClusterPolicy vgpuManager.version %s: ends in an OS tag; the GPU Operator appends "
                               "it per node, give %s" % (shown(version), shown(base)))


def _leaves(tree, prefix=()):
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from _leaves(value, prefix + (key,))
        else:
            yield prefix + (key,), value


def _lookup(tree, path):
    for key in path:
        if not isinstance(tree, dict) or key not in tree:
            return None
        tree = tree[key]
    return tree


def _nest(path, value, into):
    for key in path[:-1]:
        into = into.setdefault(key, {})
    into[path[-1]] = value


def policy_spec_from_params(params):
    """The spec fields to enforce; options left unset (None) are not managed."""
    spec = {}
    for option, path in (("sandbox_workloads_enabled", ("sandboxWorkloads", "enabled")),
                         ("sandbox_workloads_mode", ("sandboxWorkloads", "mode")),
                         ("sandbox_workloads_default_workload", ("sandboxWorkloads", "defaultWorkload")),
                         ("vgpu_device_manager_enabled", ("vgpuDeviceManager", "enabled"))):
        if params.get(option) is not None:
            _nest(path, params[option], spec)
    for option, value in (params.get("vgpu_manager") or {}).items():
        if value is not None:
            _nest(("vgpuManager", option), value, spec)
    return spec


def plan_cluster_policy(current, desired_spec):
    """Merge-patch the leaves of `desired_spec` that differ (only dicts and scalars: no list is touched)."""
    name = (current.get("metadata") or {}).get("name")
    validate_vgpu_manager_version(_lookup(desired_spec, ("vgpuManager", "version")))
    spec = current.get("spec") or {}
    patch_spec, changes, before, after = {}, [], {}, {}
    for path, value in _leaves(desired_spec):
        old = _lookup(spec, path)
        _nest(path, old, before)
        _nest(path, value, after)
        if old != value:
            _nest(path, value, patch_spec)
            changes.append("ClusterPolicy %s: %s %r -> %r" % (name, ".".join(path), old, value))
    patch = None
    if patch_spec:
        patch = {"metadata": {"resourceVersion": current["metadata"].get("resourceVersion")}, "spec": patch_spec}
    return WritePlan(patch, changes, before, after)


def run_cluster_policy(api, params, check_mode):
    desired = policy_spec_from_params(params)
    validate_vgpu_manager_version(_lookup(desired, ("vgpuManager", "version")))
    what = "ClusterPolicy %s" % params["name"]

    def write(current, patch):
        if not (check_mode and params.get("dry_run") == "client"):
            api.patch_custom(what, POLICY_GROUP, POLICY_VERSION, POLICY_PLURAL, params["name"], patch,
                             dry_run=check_mode)

    def read():
        return api.get_custom(what, POLICY_GROUP, POLICY_VERSION, POLICY_PLURAL, params["name"])

    plan, attempts = read_modify_write(read, lambda cur: plan_cluster_policy(cur, desired), write,
                                       params.get("conflict_retries", 5))[1:]
    return {"changed": plan.changed, "changes": plan.changes, "attempts": attempts,
            "diff": {"before": {"spec": plan.before}, "after": {"spec": plan.after}}}


# --- node labels ------------------------------------------------------------------------------

def validate_label(key, value, node):
    prefix, name = key.rpartition("/")[::2]
    if not _LABEL_NAME_RE.match(name) or len(name) > 63 or (prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN_RE.match(prefix))):
        raise GpuOperatorError("Node %s: label key %r is not a valid Kubernetes label key" % (shown(node), key))
    if value is not None and (len(value) > 63 or (value and not _LABEL_NAME_RE.match(value))):
        raise GpuOperatorError("Node %s: label %s value %r is not a valid Kubernetes label value"
                               % (shown(node), key, value))


def plan_node_labels(node_obj, desired, owned_prefix, state="present", only_if_ours=None, release=()):
    """Plan a node's labels. `desired` = our labels; labels starting with `owned_prefix` are ours
    (stale ones go); `only_if_ours` = {key: value} removed on absent only while they hold our value;
    `release` = deploy switch labels no longer wanted (removed while they hold the value we recorded).
    """
    meta = node_obj.get("metadata") or {}
    name = meta.get("name")
    current = dict(meta.get("labels") or {})
    for key, value in desired.items():
        validate_label(key, value, name)
    only_if_ours = only_if_ours or {}
    target = dict(current)
    if state == "present":
        for key in current:
            if owned_prefix and key.startswith(owned_prefix) and key not in desired:
                del target[key]
        target.update(desired)
    else:
        for key in list(target):
            ours = (owned_prefix and key.startswith(owned_prefix)) or (
                key in desired and key not in only_if_ours) or only_if_ours.get(key) == target[key]
            if ours:
                del target[key]
    recorded = recorded_switches(meta)
    released = release_switches(current, recorded, release, desired) if state == "present" else []
    for key in released:
        del target[key]
    labels_patch, changes = {}, []
    for key in sorted(set(current) | set(target)):
        if current.get(key) != target.get(key):
            labels_patch[key] = target.get(key)
            changes.append("Node %s: %s %s" % (name, "remove" if key not in target else "set",
                                               key if key not in target else "%s=%s" % (key, target[key])))
    switches = switches_after(recorded, desired, target, state)
    patch = None
    if labels_patch or switches is not None:
        patch = {"metadata": {"resourceVersion": meta.get("resourceVersion")}}
        if labels_patch:
            patch["metadata"]["labels"] = labels_patch
        if switches is not None:
            patch["metadata"]["annotations"] = {SWITCHES_ANNOTATION: switches}
            if not labels_patch:
                changes.append("Node %s: annotation %s: %s" % (name, SWITCHES_ANNOTATION, switches))
    touched = set(labels_patch) | set(desired)
    return WritePlan(patch, changes, {k: current[k] for k in sorted(touched) if k in current},
                     {k: target[k] for k in sorted(touched) if k in target})


def recorded_switches(meta):
    """{deploy switch label: value} this collection set on the node (SWITCHES_ANNOTATION); {} when none."""
    text = (meta.get("annotations") or {}).get(SWITCHES_ANNOTATION)
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    return dict((k, v) for k, v in value.items() if k in DEPLOY_SWITCHES.values()) if isinstance(value, dict) else {}


def release_switches(current, recorded, release, desired):
    """The switch labels in `release` to remove now: not desired, set by us and still holding our value."""
    return sorted(key for key in release
                  if key not in desired and key in recorded and current.get(key) == recorded[key])


def switches_after(recorded, desired, target, state):
    """The annotation's new text, or None when it stays as it is: the switches we set that the node still
    carries with our value (present: the desired ones added)."""
    after = dict((k, v) for k, v in recorded.items() if target.get(k) == v)
    if state == "present":
        after.update((k, v) for k, v in desired.items() if k in DEPLOY_SWITCHES.values() and target.get(k) == v)
    if after == recorded:
        return None
    return json.dumps(after, sort_keys=True, separators=(",", ":"))


def node_desired_labels(params):
    labels = {}
    if params.get("workload_config"):
        labels[WORKLOAD_LABEL] = params["workload_config"]
    for option, label in DEPLOY_SWITCHES.items():
        if params.get(option) is not None:
            labels[label] = "true" if params[option] else "false"
    labels.update(profile_labels(params.get("profiles"), params.get("profile_label_prefix") or DEFAULT_PROFILE_PREFIX))
    labels.update(params.get("labels") or {})
    return labels


def run_node_labels(api, params, check_mode):
    desired = node_desired_labels(params)
    only_if_ours = {k: v for k, v in desired.items() if k == WORKLOAD_LABEL or k in DEPLOY_SWITCHES.values()}
    release = [DEPLOY_SWITCHES[option] for option in params.get("release_deploy_switches") or ()]
    node = params["name"]

    def write(current, patch):
        if not (check_mode and params.get("dry_run") == "client"):
            api.patch_node(node, patch, dry_run=check_mode)

    plan, attempts = read_modify_write(
        lambda: api.get_node(node),
        lambda cur: plan_node_labels(cur, desired, params.get("profile_label_prefix") or DEFAULT_PROFILE_PREFIX,
                                     params.get("state", "present"), only_if_ours, release),
        write, params.get("conflict_retries", 5))[1:]
    return {"changed": plan.changed, "changes": plan.changes, "attempts": attempts, "labels": plan.after,
            "diff": {"before": {"labels": plan.before}, "after": {"labels": plan.after}}}
