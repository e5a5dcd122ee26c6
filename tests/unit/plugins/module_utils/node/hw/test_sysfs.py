import errno
import os

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import Sysfs, SysfsError


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


def test_an_attribute_is_read_with_one_read_call_and_a_long_file_whole(tree, tmp_path, monkeypatch):
    # on gpusim's FUSE tree (no attribute cache) every fstat, isatty and read is a round trip: a short read is
    # the end, so an attribute costs one read(), not open()'s fstat, isatty and a second read for the end
    from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw import sysfs as sysfs_module
    long_text = "x" * (sysfs_module.READ_SIZE * 2 + 10)
    (tmp_path / "long").write_text(long_text + "\n")
    calls, real_read = [], os.read
    monkeypatch.setattr(os, "read", lambda fd, size: calls.append(size) or real_read(fd, size))
    assert tree.read("bus/pci/devices/0000:01:00.0/vendor") == "0x10de"
    assert len(calls) == 1
    with tree.walk_cache():
        assert tree.read("bus/pci/devices/0000:01:00.0/sriov_numvfs") == "0"
    assert len(calls) == 2
    assert tree.read("long") == long_text
    assert len(calls) == 5


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


# --- walk_cache(): PCI device paths walked from their bus's directory ---------------------------------------

PF, VF, ELSEWHERE = "0000:41:00.0", "0000:41:00.4", "0000:41:01.0"


@pytest.fixture
def pci(tmp_path):
    """A bridge with a PF and a VF below it, as the kernel lays them out, and one device of the same bus that
    sits elsewhere (as a VF on a virtual bus may): bus/pci/devices holds relative links to all three."""
    bridge = tmp_path / "devices/pci0000:40/0000:40:01.1"
    for parent, address, value in ((bridge, PF, "0"), (bridge, VF, "17"), (tmp_path / "devices/virtual", ELSEWHERE, "9")):
        device = parent / address
        (device / "nvidia").mkdir(parents=True)
        (device / "nvidia/current_vgpu_type").write_text(value + "\n")
        os.symlink("../../../kernel/iommu_groups/%s" % address[-1], device / "iommu_group")
        links = tmp_path / "bus/pci/devices"
        links.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(device, links), links / address)
    return tmp_path


def _answers(sysfs):
    out = []
    for address in (PF, VF, ELSEWHERE, "0000:99:00.0"):
        base = "bus/pci/devices/" + address
        out.append((sysfs.read_optional(base + "/nvidia/current_vgpu_type"), sysfs.read_optional(base + "/nope"),
                    sysfs.link_name(base + "/iommu_group"), sysfs.readlink(base + "/nope"), sysfs.listdir(base + "/nvidia"),
                    sysfs.listdir(base + "/nope"), sysfs.exists(base + "/nvidia"), sysfs.isdir(base + "/nvidia"),
                    sysfs.exists(base + "/nope")))
        for op in (lambda: sysfs.read(base + "/nope"), lambda: sysfs.write(base + "/nope/x", 1)):
            with pytest.raises(SysfsError) as err:
                op()
            out.append((err.value.errno, str(err.value)))
    return out


def test_walk_cache_gives_the_answers_full_paths_give(pci):
    plain = _answers(Sysfs(str(pci)))
    sysfs = Sysfs(str(pci))
    with sysfs.walk_cache():
        assert _answers(sysfs) == plain
    assert [plain[i][0] for i in (0, 3, 6, 9)] == ["0", "17", "9", None]
    assert plain[1] == (errno.ENOENT, "read bus/pci/devices/%s/nope: No such file or directory (ENOENT)" % PF)


def test_walk_cache_looks_devices_up_in_their_bus_directory(pci, monkeypatch):
    sysfs = Sysfs(str(pci))
    calls, real_open = [], os.open
    monkeypatch.setattr(os, "open", lambda path, *a, **k: calls.append((str(path), k.get("dir_fd"))) or
                        real_open(path, *a, **k))
    with sysfs.walk_cache():
        sysfs.read("bus/pci/devices/%s/nvidia/current_vgpu_type" % PF)     # learns bus 41's directory
        calls.clear()
        sysfs.write("bus/pci/devices/%s/nvidia/current_vgpu_type" % VF, 25)
        assert calls[0][0] == VF + "/nvidia/current_vgpu_type" and calls[0][1] is not None
        assert sysfs.read("bus/pci/devices/%s/nvidia/current_vgpu_type" % ELSEWHERE) == "9"   # by its full path
    assert (pci / "devices/pci0000:40/0000:40:01.1" / VF / "nvidia/current_vgpu_type").read_text() == "25\n"
    assert sysfs.write_log == [("bus/pci/devices/%s/nvidia/current_vgpu_type" % VF, "25")]


def test_walk_cache_closes_its_descriptors_and_is_reentrant(pci):
    before = set(os.listdir("/proc/self/fd"))
    sysfs = Sysfs(str(pci))
    with sysfs.walk_cache():
        with sysfs.walk_cache():
            sysfs.read("bus/pci/devices/%s/nvidia/current_vgpu_type" % VF)
            assert sysfs.cached_dir(str(pci / "devices")) is not None
        assert len(set(os.listdir("/proc/self/fd")) - before) == 2    # still open in the outer block
        assert sysfs.read("bus/pci/devices/%s/nvidia/current_vgpu_type" % PF) == "0"
    assert set(os.listdir("/proc/self/fd")) <= before
    assert sysfs.cached_dir(str(pci / "devices")) is None


def test_walk_cache_reads_a_recreated_device_tree_by_its_full_path(pci):
    """The bridge's directory is removed and made again (VFs disabled and enabled, a remove and rescan) while
    the block holds the old one: the device is read where it is now."""
    sysfs = Sysfs(str(pci))
    with sysfs.walk_cache():
        assert sysfs.read("bus/pci/devices/%s/nvidia/current_vgpu_type" % VF) == "17"
        bridge = pci / "devices/pci0000:40/0000:40:01.1"
        bridge.rename(pci / "devices/old-bridge")
        (bridge / VF / "nvidia").mkdir(parents=True)
        (bridge / VF / "nvidia/current_vgpu_type").write_text("3\n")
        (pci / "devices/old-bridge").rename(pci / "devices/gone")
        import shutil
        shutil.rmtree(pci / "devices/gone")
        assert sysfs.read("bus/pci/devices/%s/nvidia/current_vgpu_type" % VF) == "3"
        assert sysfs.read_optional("bus/pci/devices/%s/nvidia/current_vgpu_type" % PF) is None


def test_walk_cache_checks_the_learned_directory_against_the_link(pci):
    """A `bus/pci` that is itself a link (a test tree, a copied capture): the link text of a device names a
    directory relative to where the link sits, not to `bus/pci/devices`; the directory learned from the text is
    used only when the device below it is the one the full path reaches."""
    import shutil
    deeper = pci / "x/y"
    deeper.mkdir(parents=True)
    shutil.move(str(pci / "bus/pci"), str(deeper / "pci"))
    os.symlink("../x/y/pci", pci / "bus/pci")
    real = pci / "x/devices/pci0000:40/0000:40:01.1" / VF
    (real / "nvidia").mkdir(parents=True)
    (real / "nvidia/current_vgpu_type").write_text("33\n")      # where the link reaches from x/y/pci/devices
    plain = Sysfs(str(pci)).read("bus/pci/devices/%s/nvidia/current_vgpu_type" % VF)
    sysfs = Sysfs(str(pci))
    with sysfs.walk_cache():
        assert sysfs.read("bus/pci/devices/%s/nvidia/current_vgpu_type" % VF) == plain == "33"
        sysfs.write("bus/pci/devices/%s/nvidia/current_vgpu_type" % VF, 44)
    assert (real / "nvidia/current_vgpu_type").read_text() == "44\n"
    assert (pci / "devices/pci0000:40/0000:40:01.1" / VF / "nvidia/current_vgpu_type").read_text() == "17\n"
