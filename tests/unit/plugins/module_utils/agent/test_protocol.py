import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.agent import protocol as vdm

PLUGIN, VALIDATOR = vdm.OPERAND_LABELS


def test_the_label_selects_the_config_else_the_default():
    assert vdm.selected_config({"metadata": {"labels": {vdm.CONFIG_LABEL: "big"}}}, "default") == "big"
    assert vdm.selected_config({"metadata": {"labels": {vdm.CONFIG_LABEL: ""}}}, "default") == "default"
    assert vdm.selected_config({"metadata": {}}, "default") == "default"


@pytest.mark.parametrize("value, patch", [
    ("true", {PLUGIN: vdm.PAUSED}), (None, {}), ("", {}), ("false", {}), (vdm.PAUSED, {})])
def test_only_operands_at_true_are_paused(value, patch):
    labels = {} if value is None else {PLUGIN: value}
    assert vdm.pause_patch(labels) == patch


def test_an_operand_label_of_another_operation_is_an_error_naming_it():
    with pytest.raises(vdm.OperandError, match="label %s=paused-for-mig-change is owned by another operation"
                       % VALIDATOR):
        vdm.pause_patch({PLUGIN: "true", VALIDATOR: "paused-for-mig-change"})


def test_restore_puts_back_what_we_paused_or_every_leftover():
    labels = {PLUGIN: vdm.PAUSED, VALIDATOR: vdm.PAUSED}
    assert vdm.restore_patch(labels, [PLUGIN]) == {PLUGIN: "true"}
    assert vdm.restore_patch(labels) == {PLUGIN: "true", VALIDATOR: "true"}
    assert vdm.restore_patch({PLUGIN: "false"}) == {}


def test_success_sets_the_state_and_profile_labels_drops_stale_ones_and_the_reason():
    labels = {vdm.STATE_LABEL: "pending", "accelops.io/vgpu.profile.L40S-24Q": "2", "team": "ml"}
    patch = vdm.outcome_patch(labels, {vdm.REASON_ANNOTATION: "old"}, vdm.SUCCESS, {"L40S-12Q": 4})
    assert patch == {"metadata": {
        "labels": {vdm.STATE_LABEL: "success", "accelops.io/vgpu.profile.L40S-12Q": "4",
                   "accelops.io/vgpu.profile.L40S-24Q": None},
        "annotations": {vdm.REASON_ANNOTATION: None}}}


def test_nothing_to_patch_when_the_node_already_says_so():
    labels = {vdm.STATE_LABEL: "success", "accelops.io/vgpu.profile.L40S-24Q": "2"}
    assert vdm.outcome_patch(labels, {}, vdm.SUCCESS, {"L40S-24Q": 2}) is None


def test_failure_keeps_the_profile_labels_and_pending_keeps_the_reason():
    labels = {vdm.STATE_LABEL: "success", "accelops.io/vgpu.profile.L40S-24Q": "2"}
    assert vdm.outcome_patch(labels, {}, vdm.FAILED, None, "VF x is held") == {"metadata": {
        "labels": {vdm.STATE_LABEL: "failed"}, "annotations": {vdm.REASON_ANNOTATION: "VF x is held"}}}
    assert vdm.outcome_patch(labels, {vdm.REASON_ANNOTATION: "r"}, vdm.PENDING) == {"metadata": {
        "labels": {vdm.STATE_LABEL: "pending"}}}


def test_the_reason_is_one_bounded_line():
    text = vdm.reason_text("a\nb" + "x" * 5000)
    assert "\n" not in text and len(text) == vdm.REASON_MAX and text.endswith("...")


def test_event_names_the_node_and_is_unique_per_serial():
    node = {"metadata": {"name": "gpu-a", "uid": "u-1"}}
    first = vdm.event(node, "ns", "VGPUConfigFailed", "m", True, "c", "2026-01-01T00:00:00Z", 10)
    second = vdm.event(node, "ns", "VGPUConfigFailed", "m", True, "c", "2026-01-01T00:00:00Z", 11)
    assert first["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": "gpu-a", "uid": "u-1"}
    assert first["type"] == "Warning" and first["metadata"]["namespace"] == "ns"
    assert first["metadata"]["name"] != second["metadata"]["name"]
