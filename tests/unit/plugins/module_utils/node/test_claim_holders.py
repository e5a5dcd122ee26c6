"""The node layer's reading of the DRA driver's checkpoint: the same file the driver writes, the same directory
the kubelet plugin serves from."""

import json
import re

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.checkpoint import COMPLETED, Checkpoint
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.paths import KubeletPaths
from ansible_collections.accelops.vgpu.plugins.module_utils.node import claim_holders


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
