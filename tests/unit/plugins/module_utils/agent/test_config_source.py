import os

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.agent.config_source import ConfigSource
from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout.vgpu_layout import LayoutError

CONFIG = '{"version": "v1", "vgpu-configs": {"default": [{"devices": "all", "vgpu-devices": {"L40S-24Q": %d}}]}}'


def configmap(directory, text, stamp):
    """What the kubelet does for a ConfigMap volume: ..<stamp>/key, ..data -> it, key -> ..data/key."""
    data_dir = directory / ("..%s" % stamp)
    data_dir.mkdir()
    (data_dir / "config.yaml").write_text(text)
    tmp = directory / "..data_tmp"
    os.symlink(data_dir.name, tmp)
    os.rename(tmp, directory / "..data")
    if not (directory / "config.yaml").is_symlink():
        os.symlink("..data/config.yaml", directory / "config.yaml")
    return str(directory / "config.yaml")


def test_a_configmap_update_is_seen_through_the_data_swap(tmp_path):
    path = configmap(tmp_path, CONFIG % 2, "2026_01")
    source = ConfigSource(path)
    assert source.entries("default")[0].profiles == {"L40S-24Q": 2}
    assert not source.poll()
    configmap(tmp_path, CONFIG % 1, "2026_02")
    assert source.poll()
    assert source.entries("default")[0].profiles == {"L40S-24Q": 1}
    configmap(tmp_path, CONFIG % 1, "2026_03")  # same content, new timestamp: no change
    assert not source.poll()


def test_unknown_config_missing_and_broken_files_are_layout_errors_naming_the_file(tmp_path):
    path = tmp_path / "vgpu.json"
    path.write_text(CONFIG % 2)
    source = ConfigSource(str(path))
    with pytest.raises(LayoutError, match="selected config 'big' not present"):
        source.entries("big")
    path.unlink()
    assert source.poll()
    with pytest.raises(LayoutError, match="cannot read %s" % path):
        source.entries("default")
    path.write_text('{"version": ')
    assert source.poll()
    with pytest.raises(LayoutError, match=str(path)):
        source.entries("default")
