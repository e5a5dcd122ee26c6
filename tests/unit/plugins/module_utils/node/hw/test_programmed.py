"""Which vGPUs a node has programmed is one function (node/hw/programmed.py): the DRA driver's inventory and
from_apply, and the device plugin's devices_from_apply and devices_programmed all come from it, on gpusim."""

from __future__ import annotations

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet import device_plugin
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import devices as dra_devices
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw import programmed
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import facts, vgpu_apply
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import Sysfs
from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout.vgpu_layout import from_layout
from ansible_collections.accelops.vgpu.plugins.module_utils.runner import CommandRunner

LAYOUT = [{"device_filter": "10de:26b9", "profiles": {"L40S-24Q": 2}},
          {"device_filter": "10de:1eb8", "profiles": {"T4-4Q": 2}},
          {"device_filter": "10de:25b6", "profiles": {"A16-8Q": 2}}]


@pytest.fixture
def applied(gpusim_node, monkeypatch, tmp_path):
    """(engine, apply result, node facts) of an L40S (vendor VFIO), a T4 (mdevs on the GPU) and an A16 (mdevs on
    its VFs), the layout applied."""
    node = gpusim_node("l40s:1,t4:1,a16:1")
    for name in ("PATH", "GPUSIM_ROOT"):
        monkeypatch.setenv(name, node.env[name])
    engine = vgpu_apply.NodeEngine(Sysfs(node.root), CommandRunner(), node.dev_root, "/proc", cache_dir=str(tmp_path))
    result = vgpu_apply.apply(engine, from_layout(LAYOUT), enable_vfs=True)
    return engine, result, facts.gather(engine.sysfs, {}, engine.names)


def keys(vgpus):
    return sorted((v.uuid or v.address, v.type_name, v.profile) for v in vgpus)


def test_a_full_read_and_the_apply_result_say_the_same_vgpus(applied):
    dummy, result, read = applied
    from_facts = programmed.programmed(*programmed.of_facts(read))
    from_result = programmed.programmed(*programmed.of_apply(result))
    assert len(from_facts) == 2 + 2 + 8 and keys(from_facts) == keys(from_result)
    mdevs = [v for v in from_facts if v.uuid]
    assert {v.mdev_type for v in mdevs} == {"nvidia-%d" % v.type_id for v in mdevs}
    assert {v.gpu["address"] for v in from_facts} == {g["address"] for g in result["gpus"]}


def test_every_view_of_the_programmed_vgpus_is_that_one_function(applied, monkeypatch):
    engine, result, read = applied
    dra_read = dra_devices.inventory(engine.sysfs, read)
    assert sorted(d.mdev_uuid or d.address for d in dra_read) == [k for k, dummy, dummy2 in keys(
        programmed.programmed(*programmed.of_facts(read)))]
    served = sorted(d.id for d in device_plugin.devices_from_apply(engine.sysfs, result))
    assert served == sorted(d.id for d in device_plugin.devices_programmed(engine.sysfs, dra_read))
    only_l40s = programmed.programmed
    monkeypatch.setattr(programmed, "programmed", lambda *args: [v for v in only_l40s(*args) if not v.uuid])
    views = {"inventory": dra_devices.inventory(engine.sysfs, read),
             "from_apply": dra_devices.from_apply(engine.sysfs, result),
             "devices_from_apply": device_plugin.devices_from_apply(engine.sysfs, result)}
    views["devices_programmed"] = device_plugin.devices_programmed(engine.sysfs, views["inventory"])
    for name, found in views.items():
        assert sorted(getattr(d, "id", None) or d.address for d in found) == ["0000:41:00.4", "0000:41:00.5"], name
