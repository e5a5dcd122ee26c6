import errno
import os

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.node.sysfs import Sysfs, SysfsError


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "bus/pci/devices/0000:01:00.0").mkdir(parents=True)
    dev = tmp_path / "bus/pci/devices/0000:01:00.0"
    (dev / "sriov_numvfs").write_text("0\n")
    (dev / "vendor").write_text("0x10de\n")
    os.symlink("../../../bus/pci/drivers/nvidia", dev / "driver")
    return Sysfs(str(tmp_path))


def test_read_strips_newline_and_parses_hex(tree):
    assert tree.read("bus/pci/devices/0000:01:00.0/sriov_numvfs") == "0"
    assert tree.read_int("bus/pci/devices/0000:01:00.0/vendor") == 0x10DE


def test_missing_attribute_is_default_for_optional_reads(tree):
    assert tree.read_optional("bus/pci/devices/0000:01:00.0/nope", "x") == "x"
    assert tree.read_int("bus/pci/devices/0000:01:00.0/nope", 7) == 7
    with pytest.raises(SysfsError) as err:
        tree.read("bus/pci/devices/0000:01:00.0/nope")
    assert err.value.errno == errno.ENOENT
    assert "bus/pci/devices/0000:01:00.0/nope" in str(err.value)


@pytest.mark.parametrize("bad", ["../etc/passwd", "/etc/passwd", "bus/../../x", "a\x00b"])
def test_paths_cannot_leave_the_root(tree, bad):
    with pytest.raises(SysfsError) as err:
        tree.path(bad)
    assert err.value.errno == errno.EINVAL


def test_write_counts_and_logs(tree):
    tree.write("bus/pci/devices/0000:01:00.0/sriov_numvfs", 4)
    assert tree.read("bus/pci/devices/0000:01:00.0/sriov_numvfs") == "4"
    assert tree.writes == 1
    assert tree.write_log == [("bus/pci/devices/0000:01:00.0/sriov_numvfs", "4")]


def test_write_error_names_path_and_errno(tree):
    with pytest.raises(SysfsError) as err:
        tree.write("bus/pci/devices/0000:01:00.0/missing/attr", 1)
    assert err.value.errno == errno.ENOENT
    assert "0000:01:00.0/missing/attr" in str(err.value)
    assert tree.writes == 0


def test_link_name_and_non_links(tree):
    assert tree.link_name("bus/pci/devices/0000:01:00.0/driver") == "nvidia"
    assert tree.link_name("bus/pci/devices/0000:01:00.0/vendor") is None
    assert tree.link_name("bus/pci/devices/0000:01:00.0/absent") is None
