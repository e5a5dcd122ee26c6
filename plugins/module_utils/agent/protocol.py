# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""vgpu-device-manager's node label protocol, as pure functions (labels in, label patches out).

VDM (NVIDIA/vgpu-device-manager `cmd/nvidia-k8s-vgpu-dm/main.go`, `operand_labels.go`): the node label
`nvidia.com/vgpu.config` names the config (absent: DEFAULT_VGPU_CONFIG); `nvidia.com/vgpu.config.state` is
`pending` while applying, then `success` or `failed`. Around a change the GPU Operator's sandbox device plugin and
validator are paused through their deploy labels: "true" becomes `paused-for-vgpu-change` and is put back
afterwards (also after a failure); absent, "", "false" or an already paused label is left alone;
any other value belongs to someone else and fails the change. Ours on top: the failure reason as a
one-line annotation, and the per-profile labels `accelops.io/vgpu.profile.<profile>=<count>`.
"""

from __future__ import annotations

from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError, one_line
from ansible_collections.accelops.vgpu.plugins.module_utils.vgpu_labels import DEFAULT_PROFILE_PREFIX, profile_labels

CONFIG_LABEL = "nvidia.com/vgpu.config"
STATE_LABEL = "nvidia.com/vgpu.config.state"
REASON_ANNOTATION = "accelops.io/vgpu.config.reason"
PENDING, SUCCESS, FAILED = "pending", "success", "failed"
OPERAND_LABELS = ("nvidia.com/gpu.deploy.sandbox-device-plugin", "nvidia.com/gpu.deploy.sandbox-validator")
PAUSED = "paused-for-vgpu-change"
# the GPU Operator's pods behind each deploy label (VDM waits for these to go after pausing)
OPERAND_PODS = {OPERAND_LABELS[0]: "app=nvidia-sandbox-device-plugin-daemonset",
                OPERAND_LABELS[1]: "app=nvidia-sandbox-validator"}
LEFT_ALONE = (None, "", "false", PAUSED)
REASON_MAX = 1024  # characters of the reason annotation (one line; the Event carries the same text)


class OperandError(EngineError):
    """An operand deploy label another operation owns, or operand pods that do not go."""


def labels_of(node):
    return dict(((node or {}).get("metadata") or {}).get("labels") or {})


def selected_config(node, default):
    """The config the node asks for: its `nvidia.com/vgpu.config` label, else the default."""
    return labels_of(node).get(CONFIG_LABEL) or default


def pause_patch(labels):
    """Labels to set to pause the operands (only those at "true"); raises OperandError naming
    the label when one holds a value it cannot own."""
    patch = {}
    for key in OPERAND_LABELS:
        value = labels.get(key)
        if value == "true":
            patch[key] = PAUSED
        elif value not in LEFT_ALONE:
            raise OperandError("label %s=%s is owned by another operation" % (key, value))
    return patch


def restore_patch(labels, paused_by_us=None):
    """Labels to put back to "true": those we paused (`paused_by_us`), or, when None, every operand
    label still paused (left over by an agent that stopped mid-change)."""
    keys = OPERAND_LABELS if paused_by_us is None else paused_by_us
    return dict((key, "true") for key in keys if labels.get(key) == PAUSED)


def owned_labels(labels, prefix=DEFAULT_PROFILE_PREFIX):
    """The labels the agent writes as the outcome: the state and the profile labels."""
    return dict((k, v) for k, v in labels.items() if k == STATE_LABEL or k.startswith(prefix))


def reason_text(error):
    """The one-line failure reason, bounded for an annotation."""
    text = one_line(error)
    return text if len(text) <= REASON_MAX else text[:REASON_MAX - 3] + "..."


def outcome_patch(labels, annotations, state, profiles=None, reason=None, prefix=DEFAULT_PROFILE_PREFIX):
    """Merge patch (or None) setting the state label, the reason annotation (set on failed, removed
    on success, untouched while pending) and, when `profiles` ({profile: count}) is given, the profile labels (stale ones removed)."""
    want = {STATE_LABEL: state}
    if profiles is not None:
        wanted_profiles = profile_labels(profiles, prefix)
        want.update(wanted_profiles)
        want.update(dict((key, None) for key in labels if key.startswith(prefix) and key not in wanted_profiles))
    label_changes = dict((k, v) for k, v in want.items() if labels.get(k) != v)
    metadata = {}
    if label_changes:
        metadata["labels"] = label_changes
    reason_want = reason if state == FAILED else None
    if state != PENDING and annotations.get(REASON_ANNOTATION) != reason_want:
        metadata["annotations"] = {REASON_ANNOTATION: reason_want}
    return {"metadata": metadata} if metadata else None


def event(node, namespace, reason, message, warning, component, now, serial):
    """A core/v1 Event about the node (`now`: RFC 3339 UTC; `serial` makes the name unique, as
    client-go's recorder does with `<object>.<hex nanoseconds>`)."""
    meta = (node or {}).get("metadata") or {}
    name = meta.get("name")
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": "%s.%x" % (name, serial), "namespace": namespace},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": name, "uid": meta.get("uid") or name},
        "reason": reason, "message": message, "type": "Warning" if warning else "Normal",
        "source": {"component": component, "host": name}, "reportingComponent": component,
        "reportingInstance": name, "firstTimestamp": now, "lastTimestamp": now, "count": 1,
    }
