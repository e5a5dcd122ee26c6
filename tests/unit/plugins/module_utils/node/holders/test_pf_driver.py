"""Which PFs the engine may give VFs or vGPUs (node/holders/pf_driver.py): the rule, case by case, and sriov's selection
with it (issue 32 item 1). The whole paths on gpusim: tests/integration/test_passthrough.py."""

import pytest

from fake_node import FakeNode

from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw import pci
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import pf_driver
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import sriov
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import Sysfs

GPU, PASSED, UNBOUND, NIC, NIC_STUB = "0000:41:00.0", "0000:42:00.0", "0000:43:00.0", "0000:61:00.0", "0000:62:00.0"


@pytest.fixture
def node(tmp_path):
    node = FakeNode(tmp_path)
    node.pf(GPU)
    node.pf(PASSED, driver="vfio-pci")
    node.pf(UNBOUND, driver=None)
    node.nic(NIC)
    node.pf(NIC_STUB, vendor="0x8086", device="0x1572", cls="0x020000", driver="pci-stub")
    return node


def reserved(node, address):
    sysfs = Sysfs(str(node.sys))
    return pf_driver.reserved(sysfs, pci.PciDevice(sysfs, address))


def test_a_gpu_is_the_engines_only_on_nvidia_and_another_pf_only_on_its_own_driver(node):
    assert reserved(node, GPU) is None and reserved(node, NIC) is None
    assert reserved(node, PASSED) == "bound to vfio-pci, not to the vGPU host driver nvidia (reserved for " \
                                     "whole-GPU passthrough)"
    assert reserved(node, NIC_STUB) == "bound to pci-stub (reserved for passthrough)"
    # unbound: nvidia not loaded at all is the vGPU paths' own error ("is the driver loaded?"), not a skip
    assert reserved(node, UNBOUND) is None
    (node.sys / "module" / "nvidia").mkdir(parents=True)
    assert reserved(node, UNBOUND).startswith("no driver bound while the vGPU host driver nvidia is loaded")


def test_all_and_filters_skip_a_reserved_pf_and_naming_one_is_an_error_unless_taken_over(node):
    (node.sys / "module" / "nvidia").mkdir(parents=True)
    sysfs = Sysfs(str(node.sys))
    skipped = []
    assert [d.address for d in sriov.select_pfs(sysfs, "all", skipped=skipped)] == [GPU]
    assert [s.address for s in skipped] == [PASSED, UNBOUND]
    skipped = []
    assert [d.address for d in sriov.select_pfs(sysfs, ["10de:26b9", NIC], skipped=skipped)] == [GPU, NIC]
    assert [s.address for s in skipped] == [PASSED, UNBOUND]
    skipped = []
    assert [d.address for d in sriov.select_pfs(sysfs, ["8086:1572"], skipped=skipped)] == [NIC]
    assert [s.address for s in skipped] == [NIC_STUB]
    with pytest.raises(sriov.SriovError, match=r"^devices: 0000:62:00.0 is bound to pci-stub \(reserved for "
                                               r"passthrough\); it is left alone"):
        sriov.select_pfs(sysfs, [NIC_STUB])
    assert [d.address for d in sriov.select_pfs(sysfs, [PASSED], take_over=(PASSED,))] == [PASSED]
    with pytest.raises(pf_driver.ReservedError, match="take_over: 0000:42:00.0 is held \\(pid 7\\)"):
        pf_driver.check_take_over(sysfs, [PASSED], {PASSED: [7]})
