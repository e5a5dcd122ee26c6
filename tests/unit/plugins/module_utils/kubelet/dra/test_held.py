"""A vGPU a prepared DRA claim uses is held: a layout change that would retype it fails before any write,
naming the claim (the node CLI's apply, on the engine the agent and the modules share)."""

import json
import os

from claim_data import ClaimStore, claim, ref
from dra_node import build, view

from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.driver import DraDriver
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.paths import KubeletPaths
from ansible_collections.accelops.vgpu.plugins.module_utils import node_cli as cli

NODE, VF4 = "gpu-node-1", "l40s-24q-0000-41-00-4"
UID = "11111111-aaaa-4bbb-8ccc-000000000001"


def prepared(tmp_path):
    node = build(tmp_path / "node")
    kubelet_dir = str(tmp_path / "kubelet")
    one = claim("vm-a-gpu", UID, [VF4], NODE)
    driver = DraDriver(NODE, ClaimStore(one).get, view(node),
                       KubeletPaths(kubelet_dir).plugin_dir("vgpu.accelops.io"), str(tmp_path / "cdi"))
    assert driver.prepare([ref(one)])[UID].error == ""
    return node, kubelet_dir, driver, one


def apply(capsys, tmp_path, node, kubelet_dir, profiles):
    layout = tmp_path / "layout.json"
    layout.write_text(json.dumps({"layout": [{"device_filter": "0x26B910DE", "profiles": profiles}]}))
    code = cli.main(["apply", "--config", str(layout), "--no-enable-vfs", "--sysfs-root", str(node.sys),
                     "--dev-root", str(node.dev), "--proc-root", str(node.proc), "--kubelet-dir", kubelet_dir])
    out, err = capsys.readouterr()
    return code, out, err


def types(node):
    return {vf: (node.dir(vf) / "nvidia/current_vgpu_type").read_text().strip() for vf in ("0000:41:00.4", "0000:41:00.5")}


def test_a_relayout_that_retypes_a_prepared_vgpu_fails_naming_the_claim(tmp_path, capsys):
    node, kubelet_dir, dummy, dummy2 = prepared(tmp_path)
    before = types(node)
    code, dummy3, err = apply(capsys, tmp_path, node, kubelet_dir, {"L40S-48Q": 1})
    assert code == 2
    assert err.count("\n") == 1 and "0000:41:00.4" in err and "DRA claim vms/vm-a-gpu" in err, err
    assert types(node) == before                      # nothing written


def test_a_layout_that_keeps_the_prepared_vgpu_applies(tmp_path, capsys):
    node, kubelet_dir, dummy, dummy2 = prepared(tmp_path)
    code, dummy3, err = apply(capsys, tmp_path, node, kubelet_dir, {"L40S-24Q": 2})
    assert code == 0, err


def test_after_unprepare_the_vgpu_is_free_again(tmp_path, capsys):
    node, kubelet_dir, driver, one = prepared(tmp_path)
    driver.unprepare([ref(one)])
    code, dummy, err = apply(capsys, tmp_path, node, kubelet_dir, {"L40S-48Q": 1})
    assert code == 0, err
    assert types(node)["0000:41:00.4"] == "1156"          # retyped once the claim is gone


def test_another_kubelet_dir_knows_no_claim(tmp_path, capsys):
    node, dummy, dummy2, dummy3 = prepared(tmp_path)
    os.makedirs(str(tmp_path / "other"))
    code, dummy4, err = apply(capsys, tmp_path, node, str(tmp_path / "other"), {"L40S-48Q": 1})
    assert code == 0, err


VF4_ADDRESS, VF5_ADDRESS = "0000:41:00.4", "0000:41:00.5"


def test_a_vgpu_manager_restart_that_reset_a_prepared_vgpu_gets_its_type_back(tmp_path, capsys):
    """The claim was prepared with L40S-24Q on VF .4; the manager restart left the VF untyped. The layout still wants
    L40S-24Q: the claim's own VF gets it again (not another free VF), and only that VF is written."""
    node, kubelet_dir, dummy, dummy2 = prepared(tmp_path)
    node.set_type(VF4_ADDRESS, 0)
    code, dummy3, err = apply(capsys, tmp_path, node, kubelet_dir, {"L40S-24Q": 2})
    assert code == 0, err
    assert types(node) == {VF4_ADDRESS: "1155", VF5_ADDRESS: "1155"}


def test_a_reset_prepared_vgpu_the_layout_no_longer_wants_stays_untouched(tmp_path, capsys):
    node, kubelet_dir, dummy, dummy2 = prepared(tmp_path)
    node.set_type(VF4_ADDRESS, 0)
    code, dummy3, err = apply(capsys, tmp_path, node, kubelet_dir, {"L40S-48Q": 1})
    assert code == 0, err
    assert types(node) == {VF4_ADDRESS: "0", VF5_ADDRESS: "1156"}     # VF .4 still the claim's, never typed 48Q


def test_a_reset_prepared_vgpu_a_process_has_open_is_not_written(tmp_path, capsys):
    """A process on the VF besides the claim: nobody can say what it expects (unsure = held): no restore."""
    node, kubelet_dir, dummy, dummy2 = prepared(tmp_path)
    node.set_type(VF4_ADDRESS, 0)
    node.hold(node.group_of(VF4_ADDRESS))
    code, dummy3, err = apply(capsys, tmp_path, node, kubelet_dir, {"L40S-24Q": 2})
    assert code == 2 and "no free VF left for L40S-24Q" in err, err
    assert types(node) == {VF4_ADDRESS: "0", VF5_ADDRESS: "1155"}


def test_a_process_that_opens_the_claimed_vf_after_the_plan_stops_its_restore(tmp_path, monkeypatch):
    """The VF was held (by the claim) when planned; a holder that appears later is new all the same. The
    re-check asks the kernel (the group's open answers EBUSY while a VM has it open, drivers/vfio/group.c
    vfio_group_fops_open); FakeNode's node is a plain file, so its open is made to answer as the kernel does."""
    import errno
    import os
    import pytest
    from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import vgpu_apply
    from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import Sysfs
    from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout.vgpu_layout import from_layout
    from ansible_collections.accelops.vgpu.plugins.module_utils.runner import CommandRunner

    node, kubelet_dir, dummy, dummy2 = prepared(tmp_path)
    node.set_type(VF4_ADDRESS, 0)
    real_open = os.open

    def vm_opens(group):
        node.hold(group)
        busy = os.path.join(str(node.dev), "vfio", group)

        def kernel_open(path, *args, **kwargs):
            dir_fd = kwargs.get("dir_fd")       # the engine looks groups up in an open /dev/vfio (Sysfs.cached_dir)
            where = os.path.join(os.readlink("/proc/self/fd/%d" % dir_fd), path) if dir_fd is not None else path
            if str(where) == busy:
                raise OSError(errno.EBUSY, "busy")
            return real_open(path, *args, **kwargs)
        monkeypatch.setattr(os, "open", kernel_open)
    engine = vgpu_apply.NodeEngine(Sysfs(str(node.sys)), CommandRunner(), str(node.dev), str(node.proc),
                                   cache_dir=str(tmp_path / "cache"), kubelet_dir=kubelet_dir)
    with pytest.raises(vgpu_apply.HeldSincePlan, match="VF %s became held" % VF4_ADDRESS):
        vgpu_apply.apply(engine, from_layout([{"device_filter": "0x26B910DE", "profiles": {"L40S-24Q": 2}}]),
                         lock_timeout=5, before_changes=lambda: vm_opens(node.group_of(VF4_ADDRESS)))
    assert types(node) == {VF4_ADDRESS: "0", VF5_ADDRESS: "1155"}


def test_a_kubelet_dir_that_does_not_exist_fails_before_any_write(tmp_path, capsys):
    node, dummy, dummy2, dummy3 = prepared(tmp_path)
    before = types(node)
    code, dummy4, err = apply(capsys, tmp_path, node, str(tmp_path / "kublet"), {"L40S-48Q": 1})
    assert (code, err) == (2, "accelops-vgpu apply: kubelet_dir %s: no such directory\n" % (tmp_path / "kublet"))
    assert types(node) == before
