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


@pytest.fixture
def pf_dir(tmp_path):
    """A PF directory with one virtfn link to a VF that has nvidia/, and one dangling link."""
    pf = tmp_path / "devices/pci0000:00/0000:01:00.0"
    vf = tmp_path / "devices/pci0000:00/0000:01:00.4"
    (vf / "nvidia").mkdir(parents=True)
    pf.mkdir(parents=True)
    (pf / "sriov_numvfs").write_text("2\n")
    os.symlink("../0000:01:00.4", pf / "virtfn0")
    os.symlink("../0000:01:00.5", pf / "virtfn1")
    (tmp_path / "bus/pci/devices").mkdir(parents=True)
    os.symlink("../../../devices/pci0000:00/0000:01:00.0", tmp_path / "bus/pci/devices/0000:01:00.0")
    return Sysfs(str(tmp_path))


def test_opendir_looks_up_names_relative_to_the_directory(pf_dir):
    with pf_dir.opendir("bus/pci/devices/0000:01:00.0") as handle:
        assert handle.listdir() == ["sriov_numvfs", "virtfn0", "virtfn1"]
        assert handle.readlink("virtfn0") == "../0000:01:00.4"
        assert handle.link_name("virtfn1") == "0000:01:00.5"       # a link, even though dangling
        assert handle.readlink("sriov_numvfs") is None and handle.readlink("absent") is None
        assert handle.isdir("virtfn0/nvidia")                       # through the link
        assert not handle.isdir("virtfn1/nvidia")                   # dangling: no VF behind it
        assert not handle.isdir("sriov_numvfs") and not handle.isdir("virtfn0/mdev_supported_types")
    assert handle.fd is None


@pytest.mark.parametrize("bad", ["../0000:01:00.4", "virtfn0/../../x", "/etc", "", "a\x00b"])
def test_opendir_names_cannot_leave_the_directory(pf_dir, bad):
    with pf_dir.opendir("bus/pci/devices/0000:01:00.0") as handle:
        with pytest.raises(SysfsError) as err:
            handle.isdir(bad)
        assert err.value.errno == errno.EINVAL


def test_opendir_of_a_missing_directory_names_it(pf_dir):
    with pytest.raises(SysfsError) as err:
        pf_dir.opendir("bus/pci/devices/0000:09:00.0")
    assert err.value.errno == errno.ENOENT and "bus/pci/devices/0000:09:00.0" in str(err.value)
