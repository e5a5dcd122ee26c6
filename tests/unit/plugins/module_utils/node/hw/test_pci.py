import os

import pytest
from fake_node import RecordingSysfs

from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw import pci
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import Sysfs, SysfsError


@pytest.mark.parametrize("text,expected", [
    ("0000:41:00.0", "0000:41:00.0"),
    ("41:00.4", "0000:41:00.4"),
    ("0000:3D:00.4", "0000:3d:00.4"),
])
def test_addresses_are_normalised(text, expected):
    assert pci.parse_address(text) == expected


@pytest.mark.parametrize("text", ["", "0000:41:00", "0000:41:20.0", "0000:41:00.8", "../41:00.0",
                                  "0000:41:00.0/../../x", "gpu0"])
def test_bad_addresses_name_the_input(text):
    with pytest.raises(pci.PciAddressError) as err:
        pci.parse_address(text)
    assert repr(text)[:20] in str(err.value)


@pytest.mark.parametrize("text,expected", [
    ("0x26B910DE", ("10de", "26b9")),
    ("26b910de", ("10de", "26b9")),
    ("10DE:26B9", ("10de", "26b9")),
])
def test_id_filters(text, expected):
    assert pci.parse_id_filter(text) == expected


@pytest.mark.parametrize("text", ["0x26B910D", "10de", "10de:26b9:1", "nvidia"])
def test_bad_id_filters(text):
    with pytest.raises(pci.PciAddressError):
        pci.parse_id_filter(text)


def test_vendor_selector_is_upper_case():
    assert pci.vendor_selector("10de", "26b9") == "10DE:26B9"


def _device(root, addr, cls="0x030200", device="0x26b9", physfn=None):
    path = root / "devices/pci0000:00" / addr
    path.mkdir(parents=True)
    (path / "vendor").write_text("0x10de\n")
    (path / "device").write_text(device + "\n")
    (path / "class").write_text(cls + "\n")
    link = root / "bus/pci/devices" / addr
    link.parent.mkdir(parents=True, exist_ok=True)
    os.symlink("../../../devices/pci0000:00/" + addr, link)
    if physfn:
        os.symlink("../" + physfn, path / "physfn")
    return path


def test_pf_vfs_are_read_in_virtfn_order(tmp_path):
    pf = _device(tmp_path, "0000:41:00.0")
    (pf / "sriov_totalvfs").write_text("32\n")
    (pf / "sriov_numvfs").write_text("11\n")
    for n in range(11):
        vf = "0000:41:%02x.%d" % ((n + 4) // 8, (n + 4) % 8)
        _device(tmp_path, vf, physfn="0000:41:00.0")
        os.symlink("../" + vf, pf / ("virtfn%d" % n))
    sysfs = Sysfs(str(tmp_path))
    dev = pci.get_device(sysfs, "41:00.0")
    assert dev.is_display and dev.sriov_capable and not dev.is_vf
    assert dev.sriov_totalvfs == 32 and dev.sriov_numvfs == 11
    vfs = dev.virtfns()
    assert vfs[0] == "0000:41:00.4" and vfs[10] == "0000:41:01.6" and len(vfs) == 11
    assert pci.PciDevice(sysfs, vfs[3]).physfn == "0000:41:00.0"
    assert pci.list_addresses(sysfs)[0] == "0000:41:00.0"


def _pf_with_vfs(tmp_path, address, vf_addresses, offset=None, stride=None):
    pf = _device(tmp_path, address)
    (pf / "sriov_totalvfs").write_text("%d\n" % len(vf_addresses))
    (pf / "sriov_numvfs").write_text("%d\n" % len(vf_addresses))
    if offset is not None:
        (pf / "sriov_offset").write_text("%d\n" % offset)
        (pf / "sriov_stride").write_text("%d\n" % stride)
    for n, vf in enumerate(vf_addresses):
        _device(tmp_path, vf, physfn=address)
        os.symlink("../" + vf, pf / ("virtfn%d" % n))
    return pf


@pytest.mark.parametrize("address,offset,stride,first,last,count", [
    ("0000:41:00.0", 4, 1, "0000:41:00.4", "0000:41:04.3", 32),    # L40S: VFs from function 4
    ("0000:c1:00.0", 2, 1, "0000:c1:00.2", "0000:c1:00.5", 4),     # RTX PRO 6000: from function 2
    ("0001:3f:00.0", 1, 2, "0001:3f:00.1", "0001:40:05.3", 150),   # past the PF's bus: the bus number carries
])
def test_vf_addresses_follow_the_kernels_routing_id_arithmetic_without_reading_links(
        tmp_path, address, offset, stride, first, last, count):
    # kernel drivers/pci/iov.c pci_iov_virtfn_bus()/devfn(): PF routing ID + offset + N * stride
    bus, rest = address.split(":")[1:]
    slot, function = rest.split(".")
    rid = (int(bus, 16) << 8) | (int(slot, 16) << 3) | int(function)
    vfs = ["%s:%02x:%02x.%x" % (address[:4], (rid + offset + stride * n) >> 8, ((rid + offset + stride * n) >> 3) & 31,
                                (rid + offset + stride * n) & 7) for n in range(count)]
    _pf_with_vfs(tmp_path, address, vfs, offset, stride)
    sysfs = RecordingSysfs(str(tmp_path))
    found = pci.PciDevice(sysfs, address).virtfns()
    assert found == vfs and found[0] == first and found[-1] == last
    assert sysfs.links == ["bus/pci/devices/%s/virtfn%d" % (address, count - 1)]    # the one check
    assert all(pci.PciDevice(sysfs, vf).physfn == address for vf in found)


def test_vf_addresses_are_only_those_the_kernel_linked(tmp_path):
    vfs = ["0000:41:00.%d" % n for n in range(4, 8)]
    pf = _pf_with_vfs(tmp_path, "0000:41:00.0", vfs, offset=4, stride=1)
    os.unlink(pf / "virtfn3")          # the kernel removes VFs last first: virtfn3 is gone already
    assert pci.PciDevice(Sysfs(str(tmp_path)), "0000:41:00.0").virtfns() == vfs[:3]


def test_offset_and_stride_that_disagree_with_the_links_fall_back_to_the_links(tmp_path):
    """A kernel or a device whose attributes do not give the linked addresses (here: offset 4, stride 1 shown, the VFs
    linked with stride 2): the highest link disagrees, so every link is read and the linked addresses win."""
    vfs = ["0000:41:00.4", "0000:41:00.6", "0000:41:01.0", "0000:41:01.2"]
    _pf_with_vfs(tmp_path, "0000:41:00.0", vfs, offset=4, stride=1)
    sysfs = RecordingSysfs(str(tmp_path))
    assert pci.PciDevice(sysfs, "0000:41:00.0").virtfns() == vfs
    assert sysfs.links == ["bus/pci/devices/0000:41:00.0/virtfn3"] + [
        "bus/pci/devices/0000:41:00.0/virtfn%d" % n for n in range(4)]


def test_a_highest_link_that_cannot_be_read_falls_back_to_the_links(tmp_path, monkeypatch):
    vfs = ["0000:41:00.%d" % n for n in range(4, 8)]
    _pf_with_vfs(tmp_path, "0000:41:00.0", vfs, offset=4, stride=1)
    sysfs = RecordingSysfs(str(tmp_path))
    real = RecordingSysfs.readlink
    failed = []

    def once_eio(self, rel):
        if rel.endswith("/virtfn3") and not failed:
            failed.append(rel)
            raise SysfsError(rel, 5, "readlink")
        return real(self, rel)
    monkeypatch.setattr(RecordingSysfs, "readlink", once_eio)
    assert pci.PciDevice(sysfs, "0000:41:00.0").virtfns() == vfs and failed
    assert len(sysfs.links) == 4


@pytest.mark.parametrize("offset,stride", [(None, None), (0, 1), (4, 0)])
def test_without_usable_offset_and_stride_the_links_are_read(tmp_path, offset, stride):
    vfs = ["0000:41:00.4", "0000:41:00.6", "0000:41:01.0"]     # whatever the links say
    _pf_with_vfs(tmp_path, "0000:41:00.0", vfs, offset, stride)
    sysfs = RecordingSysfs(str(tmp_path))
    assert pci.PciDevice(sysfs, "0000:41:00.0").virtfns() == vfs
    assert len(sysfs.links) == 3


def test_missing_device_names_the_address(tmp_path):
    with pytest.raises(SysfsError) as err:
        pci.get_device(Sysfs(str(tmp_path)), "0000:99:00.0")
    assert "0000:99:00.0" in str(err.value)
