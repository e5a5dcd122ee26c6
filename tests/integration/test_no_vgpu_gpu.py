"""A node with one GPU that offers no vGPU interface (gpusim's h100-guest: an H100 passed whole into this machine,
no sriov_* files, not an mdev parent) beside an L40S. `devices: all` programs the L40S and skips the other with a
one-line note naming it; naming it is a one-line error; with no vGPU GPU at all the node still fails (a vGPU
manager that is not loaded is not hidden). Asserted on gpusim's sysfs and write log."""

import json

from ansible_collections.accelops.vgpu.tests.integration.test_node_cli import cli, pyz  # noqa: F401 pylint: disable=unused-import

L40S, GUEST = "0000:41:00.0", "0000:42:00.0"
NOTE = ("warning: GPU %s: skipped: offers no vGPU interface (not an mdev parent, no VF with "
        "nvidia/current_vgpu_type)" % GUEST)
ALL = json.dumps([{"devices": "all", "profiles": {"L40S-24Q": 2}}])


def touching(node, address):
    bus = address[:8]
    return [e for e in node.log() if bus in e["path"] or bus in str(e["value"])]


def test_devices_all_programs_the_vgpu_gpu_and_skips_the_one_without_vgpu(gpusim_node, pyz):  # noqa: F811
    node = gpusim_node("l40s:1,h100-guest:1", fresh=True)
    assert sorted(node.pfs()) == [L40S, GUEST]
    node.clear_log()
    checked = cli(pyz, node, "apply", "--check", "--config", "-", stdin=ALL)
    assert checked.returncode == 0, checked.stderr
    assert NOTE in checked.stderr.splitlines() and node.log() == []
    applied = cli(pyz, node, "apply", "--json", "--config", "-", stdin=ALL)
    assert applied.returncode == 0, applied.stderr
    result = json.loads(applied.stdout)
    assert [g["address"] for g in result["gpus"]] == [L40S]
    assert [r["address"] for r in result["reserved"]] == [GUEST]
    assert sorted(node.read("bus/pci/devices/%s/nvidia/current_vgpu_type" % vf) for vf in node.vfs(L40S))[-2:] \
        == ["1155", "1155"]
    assert touching(node, GUEST) == [] and touching(node, L40S) != []


def test_naming_the_gpu_without_vgpu_is_a_one_line_error_and_no_write(gpusim_node, pyz):  # noqa: F811
    node = gpusim_node("l40s:1,h100-guest:1", fresh=True)
    node.clear_log()
    for devices in ([GUEST], [1]):             # by address, by index
        spec = [{"devices": devices, "profiles": {"L40S-24Q": 2}}]
        named = cli(pyz, node, "apply", "--config", "-", stdin=json.dumps(spec))
        assert named.returncode == 2 and named.stderr.count("\n") == 1, named.stderr
        assert GUEST in named.stderr and "offers no vGPU interface" in named.stderr
    assert node.log() == []


def test_a_node_whose_gpus_all_lack_vgpu_still_fails(gpusim_node, pyz):  # noqa: F811
    node = gpusim_node("h100-guest:1")
    node.clear_log()
    failed = cli(pyz, node, "apply", "--config", "-", stdin=ALL)
    assert failed.returncode == 2 and failed.stderr.count("\n") == 1, failed.stderr
    assert "GPU %s offers no vGPU interface" % node.pfs()[0] in failed.stderr and node.log() == []
