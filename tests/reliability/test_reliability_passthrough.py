"""A GPU passed through whole (issue 32 item 1), on gpusim: the second L40S bound to vfio-pci and held by its
VM. `devices: all` programs the vGPU GPU and never touches the passthrough one; naming it, or taking it over
while its VM runs, is one line naming it and writes nothing anywhere."""

from __future__ import annotations

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw import vgpu_types
from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout import vgpu_layout
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import sriov, vgpu_apply
from ansible_collections.accelops.vgpu.tests.reliability import node_lab
from ansible_collections.accelops.vgpu.tests.reliability.assertions import one_line_naming

VGPU, PASSED = "0000:41:00.0", "0000:42:00.0"
ALL = [{"devices": "all", "profiles": {"L40S-24Q": 2}}]


@pytest.fixture
def lab(gpusim_node, monkeypatch, tmp_path):
    node = gpusim_node("l40s:2")
    for name, value in node_lab.environment(node).items():
        monkeypatch.setenv(name, value)
    node.bind(PASSED, "vfio-pci")
    node.hold(PASSED)
    node.clear_log()
    return node_lab.Lab(node, tmp_path)


def naming(lab, address=PASSED):
    """Write attempts (refused ones too) to the GPU or its functions, or naming it in the value written."""
    bus = address[:8]
    return [e for e in lab.node.log() if bus in e["path"] or bus in str(e["value"])]


def untouched(lab):
    return lab.node.read("bus/pci/devices/%s/sriov_numvfs" % PASSED) == "0" and \
        lab.node.read("bus/pci/devices/%s/driver_override" % PASSED) == "vfio-pci" and naming(lab) == []


@pytest.mark.no_failure_path("a success path: the writes it makes are asserted one by one")
def test_devices_all_programs_the_vgpu_gpu_and_leaves_the_passed_through_one_alone(lab):
    result = node_lab.run_layout(lab, layout=ALL, enable_vfs=True)
    assert [g["address"] for g in result["gpus"]] == [VGPU]
    assert [r["address"] for r in result["reserved"]] == [PASSED]
    assert vgpu_types.read_current(lab.sysfs, "0000:41:00.4") == 1155
    assert untouched(lab)


@pytest.mark.no_failure_path("a success path: the writes it makes are asserted one by one")
def test_sriov_vfs_all_enables_the_vgpu_gpu_only(lab):
    node_lab.run_sriov(lab, devices="all")
    assert lab.node.read("bus/pci/devices/%s/sriov_numvfs" % VGPU) == "32"
    assert untouched(lab)


@pytest.mark.parametrize("entry", [{"devices": [PASSED], "profiles": {"L40S-24Q": 2}},
                                   {"devices": [1], "profiles": {"L40S-24Q": 2}}], ids=["by-address", "by-index"])
def test_naming_the_passed_through_gpu_is_refused_before_any_write(lab, failure_writes, entry):
    with pytest.raises(vgpu_layout.LayoutError) as caught:
        node_lab.run_layout(lab, layout=[{"devices": [VGPU], "profiles": {"L40S-24Q": 2}}, entry], enable_vfs=True)
    one_line_naming(str(caught.value), PASSED)
    assert failure_writes.gpusim(lab.node, what="writes after naming a passed-through GPU") == []


def test_sriov_vfs_naming_it_is_refused_before_any_write(lab, failure_writes):
    with pytest.raises(EngineError) as caught:
        sriov.plan_vfs(lab.sysfs, lab.runner, [PASSED], held=lab.engine.held)
    one_line_naming(str(caught.value), PASSED)
    assert failure_writes.gpusim(lab.node, what="writes after sriov_vfs named a passed-through GPU") == []


def test_taking_it_over_while_its_vm_runs_is_refused_before_any_write(lab, failure_writes, tmp_path):
    lab.engine = vgpu_apply.NodeEngine(lab.sysfs, lab.runner, lab.node.dev_root, "/proc", cache_dir=str(tmp_path),
                                       take_over=[PASSED])
    with pytest.raises(EngineError) as caught:
        node_lab.run_layout(lab, layout=ALL, enable_vfs=True)
    one_line_naming(str(caught.value), PASSED)
    assert failure_writes.gpusim(lab.node, what="writes after a take-over of a GPU its VM holds") == []
    assert untouched(lab)
