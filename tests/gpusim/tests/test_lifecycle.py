"""Mounting, the log, injected failures, reboot, driver unload/load, latency, clean teardown."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from gpusim import daemon
from gpusim.testing import GpuSimNode
from simhelpers import enable_vfs, gpusim_cli as _gpusim, read, sriov_manage, write, write_fails


def _mounted(root):
    with open("/proc/mounts") as mounts:
        return any(line.split()[1] == root for line in mounts)


def _held(root):
    with open(os.path.join(root, ".gpusim/state.json")) as handle:
        return json.load(handle)["held"]


def test_cli_up_down_leaves_no_mount(tmp_path):
    root = str(tmp_path / "sys")
    result = subprocess.run(["gpusim", "up", root, "--gpus", "l40s:1,nic:1"], capture_output=True, text=True,
                            check=False, env=dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep
                                                  + os.environ.get("PATH", "")))
    assert result.returncode == 0, result.stderr
    try:
        assert _mounted(root)
        assert sorted(os.listdir(os.path.join(root, "bus/pci/devices"))) == ["0000:41:00.0", "0000:42:00.0"]
        assert _gpusim("ctl", root, "fail-next", "bus/pci/devices/0000:42:00.0/sriov_numvfs", "EIO").returncode == 0
        write_fails(os.path.join(root, "bus/pci/devices/0000:42:00.0/sriov_numvfs"), "2", errno.EIO)
        lines = [json.loads(line) for line in _gpusim("log", root, "--clear").stdout.splitlines()]
        assert lines == [{"seq": 1, "path": "bus/pci/devices/0000:42:00.0/sriov_numvfs", "value": "2",
                          "result": "error", "errno": "EIO"}]
        assert _gpusim("log", root).stdout == ""
        write(os.path.join(root, "bus/pci/devices/0000:42:00.0/sriov_numvfs"), "2")
        holder = _gpusim("ctl", root, "hold", "0000:42:02.1")
        assert holder.returncode == 0 and os.path.exists("/proc/%d" % int(holder.stdout))
        assert _held(root) == {"0000:42:02.1": 1}
        assert _gpusim("ctl", root, "release", "0000:42:02.1").returncode == 0
        assert _held(root) == {}
        refused = _gpusim("ctl", root, "release", "0000:42:02.1")
        assert refused.returncode == 1 and "not held" in refused.stderr
    finally:
        assert _gpusim("down", root).returncode == 0
    assert not _mounted(root)
    assert _gpusim("down", root).returncode == 0        # idempotent


def test_down_cleans_up_after_the_server_was_killed(tmp_path):
    root = str(tmp_path / "sys")
    pid = daemon.up(root, "nic:1")
    write(os.path.join(root, "bus/pci/devices/0000:41:00.0/sriov_numvfs"), "1")
    holder = daemon.hold(root, "0000:41:02.0")
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.1)
    assert _mounted(root)                                # a dead server leaves a broken mount
    daemon.down(root)
    assert not _mounted(root)
    assert not os.path.exists("/proc/%d" % holder) and not os.path.exists("/proc/%d" % pid)


def test_up_replaces_a_stale_mount_but_not_a_live_one(tmp_path):
    root = str(tmp_path / "sys")
    try:
        os.kill(daemon.up(root, "nic:1"), signal.SIGKILL)
        time.sleep(0.1)
        daemon.up(root, "l40s:1")                        # stale mount of a dead server: replaced
        assert os.listdir(os.path.join(root, "bus/pci/devices")) == ["0000:41:00.0"]
        with pytest.raises(daemon.GpuSimError, match="already served"):
            daemon.up(root, "t4:1")
    finally:
        daemon.down(root)


def test_bad_spec_fails_before_mounting(tmp_path):
    result = _gpusim("up", str(tmp_path / "sys"), "--gpus", "l40s:2,rtx9000:1")
    assert result.returncode == 1 and "unknown model 'rtx9000'" in result.stderr
    assert not _mounted(str(tmp_path / "sys"))


def test_context_manager_unmounts_after_a_failure():
    with pytest.raises(RuntimeError):
        with GpuSimNode("l40s:1") as node:
            root = node.root
            vf = enable_vfs(node, node.pfs()[0])[0]
            node.hold(vf)
            raise RuntimeError("test failed here")
    assert not _mounted(root) and not os.path.exists(root)


def test_log_records_every_write_attempt(gpusim_node):
    node = gpusim_node("l40s:1")
    pf = node.pfs()[0]
    node.clear_log()
    sriov_manage(node, "-e", pf)
    vf = node.vfs(pf)[0]
    write_fails(node.path("devices/pci0000:41/%s/nvidia/current_vgpu_type" % vf), "7", errno.EINVAL)
    write_fails(node.device_path(pf, "virtfn0/nvidia/current_vgpu_type"), "8", errno.EINVAL)
    canonical = "bus/pci/devices/%s/nvidia/current_vgpu_type" % vf                    # one spelling
    assert [(e["path"], e["value"]) for e in node.log()[-2:]] == [(canonical, "7"), (canonical, "8")]
    assert [e["path"] for e in node.writes()][:5] == [
        "bus/pci/drivers/nvidia/unbind", "bus/pci/devices/%s/driver_override" % pf,
        "bus/pci/drivers/pci-pf-stub/bind", "bus/pci/devices/%s/sriov_numvfs" % pf,
        "bus/pci/drivers/pci-pf-stub/unbind"]
    node.clear_log()
    read(node.device_path(vf, "nvidia/creatable_vgpu_types"))
    assert node.log() == []                              # reads are not logged


def test_fail_next_fails_exactly_once(gpusim_node):
    node = gpusim_node("l40s:1")
    vf = enable_vfs(node, node.pfs()[0])[0]
    node.ctl("fail-next", "bus/pci/devices/%s/nvidia/current_vgpu_type" % vf, "EIO")
    path = node.device_path(vf, "nvidia/current_vgpu_type")
    write_fails(path, "1155", errno.EIO)
    assert read(path) == "0"
    write(path, "1155")
    assert read(path) == "1155"
    with pytest.raises(daemon.GpuSimError, match="EINVAL"):
        node.ctl("fail-next", "bus/pci/devices/%s/sriov_numvfs" % vf, "ENOTANERRNO")


def test_reboot_drops_vfs_types_mdevs_and_mixed_mode(gpusim_node):
    node = gpusim_node("l40s:1,t4:1")
    l40s, t4 = node.pfs()
    vfs = enable_vfs(node, l40s)
    node.ctl("mixed", l40s, "1")
    write(node.device_path(vfs[0], "nvidia/current_vgpu_type"), "1155")
    write(node.device_path(t4, "mdev_supported_types/nvidia-230/create"), "7a3c62f2-0d7b-4c1a-9a55-3f1b2c3d4e5f")
    node.hold(vfs[0])
    node.ctl("reboot")
    assert read(node.device_path(l40s, "sriov_numvfs")) == "0" and node.vfs(l40s) == []
    assert os.listdir(node.path("bus/mdev/devices")) == []
    snapshot = node.state()
    assert snapshot["held"] == {} and not snapshot["pfs"][0]["mixed_size"]
    assert snapshot["nvidia"]["loaded"] and os.path.basename(os.readlink(node.device_path(l40s, "driver"))) == "nvidia"


def test_driver_unload_and_load(gpusim_node):
    node = gpusim_node("l40s:1,t4:1")
    l40s, t4 = node.pfs()
    vfs = enable_vfs(node, l40s)
    node.hold(vfs[0])
    with pytest.raises(daemon.GpuSimError, match="EBUSY"):
        node.ctl("driver", "unload")                     # in use, like rmmod
    node.release(vfs[0])
    node.ctl("driver", "unload")
    assert not os.path.exists(node.path("module/nvidia"))
    assert not os.path.exists(node.path("bus/pci/drivers/nvidia"))
    assert not os.path.exists(node.device_path(l40s, "driver")) and node.vfs(l40s) == []
    assert not os.path.exists(node.path("class/mdev_bus", t4))
    write_fails(node.device_path(l40s, "sriov_numvfs"), "32", errno.ENOENT)
    result = subprocess.run(["sriov-manage", "-e", l40s], env=node.env, capture_output=True, text=True, check=False)
    assert result.returncode == 1 and "not loaded" in result.stderr
    assert subprocess.run(["nvidia-smi", "-q"], env=node.env, capture_output=True, check=False).returncode == 9
    node.ctl("driver", "load", "580.65.06")
    assert read(node.path("module/nvidia/version")) == "580.65.06"
    assert os.path.basename(os.readlink(node.device_path(l40s, "driver"))) == "nvidia"
    assert os.path.exists(node.path("class/mdev_bus", t4))


def test_enable_latency_does_not_serialise_pfs(gpusim_node):
    """Eight PFs enable at once, each store sleeping `latency` in the server: one after another they
    take 8 x latency. The bound (4 x latency) is loose on purpose: it tells overlapping stores from
    serial ones without timing how fast they overlap (speed belongs to tests/bench)."""
    latency, count = 1.0, 8
    node = gpusim_node("nic:%d" % count, latency_ms=int(latency * 1000))
    errors = []

    def enable(pf):
        try:
            write(node.device_path(pf, "sriov_numvfs"), "4")
        except OSError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=enable, args=(pf,)) for pf in node.pfs()]
    start = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - start
    assert not errors and len(threads) == count
    assert all(len(node.vfs(pf)) == 4 for pf in node.pfs())
    assert elapsed < count / 2 * latency, "%d stores of %.1f s took %.1f s: serialised" % (count, latency, elapsed)


def test_reset_returns_to_the_freshly_started_state(gpusim_node):
    node = gpusim_node("l40s:1,t4:1")
    l40s, t4 = node.pfs()
    node.ctl("driver", "unload")
    node.ctl("driver", "load", "580.1")
    vf = enable_vfs(node, l40s)[0]
    node.ctl("mixed", l40s, "1")
    write(node.device_path(vf, "nvidia/current_vgpu_type"), "1155")
    write(node.device_path(t4, "mdev_supported_types/nvidia-230/create"), "7a3c62f2-0d7b-4c1a-9a55-3f1b2c3d4e50")
    node.ctl("fail-next", "bus/pci/devices/%s/sriov_numvfs" % l40s, "EIO")
    holder = node.hold(vf)
    assert gpusim_node("l40s:1,t4:1") is not node          # same spec twice in one test: a second node
    node.env["PATH"] = "/nowhere"
    os.unlink(os.path.join(node.tools_dir, "nvidia-smi"))
    node.reset()
    assert node.env["PATH"].split(os.pathsep)[0] == node.tools_dir
    assert os.access(os.path.join(node.tools_dir, "nvidia-smi"), os.X_OK)
    snapshot = node.state()
    assert snapshot["held"] == {} and not os.path.exists("/proc/%d" % holder)
    assert snapshot["pfs"][0]["numvfs"] == 0 and not snapshot["pfs"][0]["mixed_size"]
    assert snapshot["nvidia"]["version"] == "570.172.07"
    assert node.log() == [] and os.listdir(node.path("bus/mdev/devices")) == []
    enable_vfs(node, l40s)                                 # the injected EIO is gone too
    assert read(node.device_path(node.vfs(l40s)[0], "nvidia/current_vgpu_type")) == "0"


def test_a_test_may_unmount_its_pooled_node(gpusim_node):
    node = gpusim_node("nvme:1")
    daemon.down(node.root)                               # the fixture replaces it for the next test
    assert not node.healthy()
