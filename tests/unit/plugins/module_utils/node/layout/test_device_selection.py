"""The shared `devices` rules: one device once, an address that is there, a PF, not a VF."""

import pytest

from fake_node import FakeNode

from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout import device_selection as ds
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import Sysfs

PF = "0000:41:00.0"


@pytest.fixture
def sysfs(tmp_path):
    fake = FakeNode(tmp_path / "node")
    fake.pf(PF)
    fake.set_numvfs(PF, 2)
    return Sysfs(str(fake.sys))


def test_two_spellings_of_one_device_are_refused():
    selection = ds.Selection()
    selection.spelling("0000:41:00.0", "41:00.0")
    with pytest.raises(ds.SelectionError) as err:
        selection.spelling("0000:41:00.0", "0000:41:00.0")
    assert str(err.value) == "devices: '41:00.0' and '0000:41:00.0' select the same devices"


def test_one_device_chosen_by_two_items_is_refused():
    selection = ds.Selection()
    selection.choose(PF, 0)
    with pytest.raises(ds.SelectionError) as err:
        selection.choose(PF, PF)
    assert str(err.value) == "devices: %s is selected twice (by 0 and '%s')" % (PF, PF)


def test_a_pf_is_returned(sysfs):
    assert ds.physical_function(sysfs, PF).address == PF


@pytest.mark.parametrize("address,message", [
    ("0000:99:00.0", "devices: no PCI device 0000:99:00.0 on this node"),
    ("0000:41:00.4", "devices: 0000:41:00.4 is a VF of %s; select its physical function" % PF),
])
def test_missing_devices_and_vfs_are_refused(sysfs, address, message):
    with pytest.raises(ds.SelectionError) as err:
        ds.physical_function(sysfs, address)
    assert str(err.value) == message
