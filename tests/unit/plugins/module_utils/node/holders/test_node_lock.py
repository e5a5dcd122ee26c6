import os
import subprocess
import sys
import threading
import time

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import node_lock as nl


def test_lock_file_is_named_after_the_real_sysfs_root(tmp_path):
    (tmp_path / "node-a").mkdir()
    os.symlink(str(tmp_path / "node-a"), tmp_path / "alias")
    assert nl.lock_name(str(tmp_path / "alias")) == nl.lock_name(str(tmp_path / "node-a"))
    assert nl.lock_name(str(tmp_path / "node-a")) != nl.lock_name(str(tmp_path / "node-b"))
    assert nl.lock_name("/sys").startswith("sys-")


def test_holder_pid_is_recorded_and_cleared(tmp_path):
    with nl.node_lock("/sys", timeout=1, directory=str(tmp_path)) as lock:
        with open(lock.path) as handle:
            assert handle.read().strip() == str(os.getpid())
    with open(lock.path) as handle:
        assert handle.read() == ""


def test_second_apply_on_the_same_node_times_out_naming_the_holder(tmp_path):
    with nl.node_lock("/sys", timeout=1, directory=str(tmp_path)) as lock:
        start = time.monotonic()
        with pytest.raises(nl.NodeLockError) as err:
            nl.node_lock("/sys", timeout=0.3, directory=str(tmp_path)).acquire()
        assert time.monotonic() - start >= 0.3
    assert str(err.value) == "another accelops-vgpu apply holds the node lock %s (pid %d)" % (lock.path, os.getpid())


def test_other_nodes_do_not_block(tmp_path):
    with nl.node_lock(str(tmp_path / "node-a"), timeout=1, directory=str(tmp_path)):
        with nl.node_lock(str(tmp_path / "node-b"), timeout=0, directory=str(tmp_path)) as other:
            assert other.path.endswith(nl.lock_name(str(tmp_path / "node-b")))


def test_a_waiter_gets_the_lock_when_the_holder_releases(tmp_path):
    first = nl.node_lock("/sys", timeout=1, directory=str(tmp_path)).acquire()
    order = []

    def waiter():
        with nl.node_lock("/sys", timeout=5, directory=str(tmp_path)):
            order.append("waiter")

    thread = threading.Thread(target=waiter)
    thread.start()
    time.sleep(0.3)
    order.append("holder releases")
    first.release()
    thread.join(5)
    assert order == ["holder releases", "waiter"]


def test_lock_held_by_another_process_names_that_pid(tmp_path):
    code = ("import sys, time; from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import node_lock as nl\n"
            "with nl.node_lock('/sys', directory=sys.argv[1]):\n    print('locked', flush=True); time.sleep(30)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    try:
        assert proc.stdout.readline().strip() == "locked"
        with pytest.raises(nl.NodeLockError) as err:
            nl.node_lock("/sys", timeout=0.2, directory=str(tmp_path)).acquire()
        assert "(pid %d)" % proc.pid in str(err.value)
    finally:
        proc.kill()
        proc.wait()
    with nl.node_lock("/sys", timeout=2, directory=str(tmp_path)):
        pass   # the kernel released the dead holder's flock


def test_unwritable_preferred_directory_falls_back_to_tempdir(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    chosen = nl.lock_dir(str(blocker / "sub"))
    assert chosen.endswith("accelops-vgpu") and os.access(chosen, os.W_OK)


def test_a_container_names_the_lock_after_the_hosts_sysfs_path(tmp_path, monkeypatch):
    (tmp_path / "host" / "sys").mkdir(parents=True)
    monkeypatch.setenv(nl.LOCK_KEY_ENV, "/sys")
    assert nl.lock_name(str(tmp_path / "host" / "sys")) == nl.lock_name("/sys")
    monkeypatch.delenv(nl.LOCK_KEY_ENV)
    assert nl.lock_name(str(tmp_path / "host" / "sys")) != nl.lock_name("/sys")


def test_a_stop_event_ends_the_wait_for_the_lock_at_once(tmp_path):
    stop = threading.Event()
    with nl.node_lock(str(tmp_path), timeout=5, directory=str(tmp_path)):
        threading.Timer(0.3, stop.set).start()
        started = time.monotonic()
        with pytest.raises(nl.NodeLockError, match="stopped while waiting for the node lock"):
            nl.NodeLock(str(tmp_path), timeout=60, directory=str(tmp_path), stop=stop).acquire()
        assert time.monotonic() - started < 2
