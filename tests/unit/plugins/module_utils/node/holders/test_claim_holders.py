"""The node layer's reading of the DRA driver's checkpoint: the same file the driver writes, the same directory
the kubelet plugin serves from."""

import json
import re

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.checkpoint import COMPLETED, Checkpoint
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.paths import KubeletPaths
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import claim_holders


def test_the_driver_directory_is_the_kubelet_plugin_directory(tmp_path):
    assert claim_holders.plugin_dir(str(tmp_path)) == KubeletPaths(str(tmp_path)).plugin_dir(claim_holders.DRIVER)


def test_holders_are_read_from_what_the_driver_wrote(tmp_path):
    driver_dir = claim_holders.plugin_dir(str(tmp_path))
    checkpoint = Checkpoint(driver_dir)
    checkpoint.set("uid-1", "vms", "vm-a", COMPLETED, [{"key": "0000:41:00.4"}, {"key": "5c8f3b52-aa"}])
    checkpoint.set("uid-2", "vms", "vm-b", COMPLETED, [{"key": "0000:41:00.4"}])
    checkpoint.save()
    source = claim_holders.holders_source(str(tmp_path))
    assert source() == {"0000:41:00.4": ["DRA claim vms/vm-a", "DRA claim vms/vm-b"],
                        "5c8f3b52-aa": ["DRA claim vms/vm-a"]}
    assert claim_holders.holders_source(str(tmp_path / "elsewhere"))() == {}     # no driver there: nothing held


def test_a_damaged_checkpoint_is_an_error_naming_it_unknown_is_held(tmp_path):
    driver_dir = claim_holders.plugin_dir(str(tmp_path))
    checkpoint = Checkpoint(driver_dir)
    checkpoint.set("uid-1", "vms", "vm-a", COMPLETED, [{"key": "0000:41:00.4"}])
    checkpoint.save()
    path = claim_holders.checkpoint_path(driver_dir)
    doc = json.loads(open(path).read())
    doc["claims"]["uid-1"]["devices"] = []
    with open(path, "w") as handle:
        json.dump(doc, handle)
    with pytest.raises(claim_holders.CheckpointError, match="checkpoint %s: checksum mismatch" % re.escape(path)):
        claim_holders.holders_source(str(tmp_path))()


def _rewrite_valid(path, edit):
    """Edit the claims and write them back with a matching checksum (another version's or a hand-made file)."""
    doc = json.loads(open(path).read())
    edit(doc["claims"])
    doc["checksum"] = claim_holders.checksum(claim_holders.canonical(doc["claims"]))
    with open(path, "w") as handle:
        json.dump(doc, handle)


@pytest.mark.parametrize("edit, message", [
    (lambda c: c["uid-1"]["devices"][0].pop("key"), r"claim uid-1 \(vms/vm-a\): device 0 has no key"),
    (lambda c: c["uid-1"]["devices"].__setitem__(0, "0000:41:00.4"), r"claim uid-1 \(vms/vm-a\): device 0 has no key"),
    (lambda c: c["uid-1"].pop("namespace"), "claim uid-1 has no namespace"),
    (lambda c: c.__setitem__("uid-1", []), "claim uid-1 is not an object"),
])
def test_a_checksum_valid_checkpoint_missing_what_readers_use_is_one_line_naming_it(tmp_path, edit, message):
    driver_dir = claim_holders.plugin_dir(str(tmp_path))
    checkpoint = Checkpoint(driver_dir)
    checkpoint.set("uid-1", "vms", "vm-a", COMPLETED, [{"key": "0000:41:00.4", "typeID": 1155}])
    checkpoint.save()
    path = claim_holders.checkpoint_path(driver_dir)
    _rewrite_valid(path, edit)
    with pytest.raises(claim_holders.CheckpointError, match="^checkpoint %s: %s" % (re.escape(path), message)):
        claim_holders.holders_source(str(tmp_path))()
    with pytest.raises(claim_holders.CheckpointError, match="^checkpoint %s: %s" % (re.escape(path), message)):
        claim_holders.claimed_types_of(str(tmp_path))
    with pytest.raises(claim_holders.CheckpointError):      # the DRA driver's own load fails the same way
        Checkpoint(driver_dir)
