import json
import os

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout import vgpu_layout
from ansible_collections.accelops.vgpu.plugins.module_utils.node.boot import handover

CONFIG = [{"devices": "all", "vgpu-devices": {"L40S-12Q": 4}}]


def test_written_only_where_the_boot_unit_lives_and_read_back_as_one_config(tmp_path):
    path = tmp_path / "etc" / handover.FILE_NAME
    assert not handover.write(str(path), "l40s-12q", CONFIG) and not path.exists()
    path.parent.mkdir()          # the agent's mount exists on every node: no boot unit there yet
    assert not handover.write(str(path), "l40s-12q", CONFIG) and not path.exists()
    (path.parent / "layout.json").write_text("{}")
    assert handover.write(str(path), "l40s-12q", CONFIG) and handover.applied_by_agent(str(path))
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    assert json.loads(path.read_text()) == {"version": "v1", "vgpu-configs": {"l40s-12q": CONFIG}}
    entries = vgpu_layout.from_file(str(path))        # no --selected needed: one config
    assert entries[0].profiles == {"L40S-12Q": 4}
    mtime = os.stat(path).st_mtime_ns
    assert handover.write(str(path), "l40s-12q", CONFIG) and os.stat(path).st_mtime_ns == mtime


def test_a_config_the_parser_refuses_is_never_written(tmp_path):
    (tmp_path / "layout.json").write_text("{}")
    with pytest.raises(vgpu_layout.LayoutError, match="config bad"):
        handover.write(str(tmp_path / handover.FILE_NAME), "bad", [{"devices": "all"}])
    assert not (tmp_path / handover.FILE_NAME).exists()


def test_no_path_means_no_agent_ownership():
    assert not handover.applied_by_agent(None) and not handover.applied_by_agent("")
