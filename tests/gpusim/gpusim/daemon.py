"""Mounting, unmounting and the helper processes (server, VM holders) of a gpusim ROOT.

Host-side bookkeeping lives in a runtime directory per ROOT (/run/gpusim/<hash>, or under the temp
dir when /run is not writable): server.pid, server.log and holders/<name>.<pid>. `down` uses it to
clean up even when the mount is broken: kill holders, fusermount3 -u, then lazy unmount, then kill
the server.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from gpusim import layout
from gpusim.fs import serve
from gpusim.models import DEFAULT_DRIVER_VERSION
from gpusim.state import State

START_TIMEOUT = 60.0   # generous: the build machines are shared and often loaded
HOLDER_CODE = (
    "import os, signal, sys\n"
    "fd = os.open(sys.argv[1], os.O_RDWR)\n"
    "sys.stdout.write('ready\\n'); sys.stdout.flush()\n"
    "while True: signal.pause()\n"
)


class GpuSimError(RuntimeError):
    """A gpusim operation failed; the message is one line naming ROOT or the device."""


def runtime_dir(root, create=True):
    key = hashlib.sha1(os.path.realpath(root).encode()).hexdigest()[:16]
    base = "/run/gpusim" if os.access("/run", os.W_OK) else os.path.join(tempfile.gettempdir(), "gpusim-run")
    path = os.path.join(base, key)
    if create:
        os.makedirs(os.path.join(path, "holders"), exist_ok=True)
    return path


def is_mounted(root):
    target = os.path.realpath(root)
    with open("/proc/mounts") as mounts:
        for line in mounts:
            fields = line.split()
            if len(fields) > 2 and fields[1].encode().decode("unicode_escape") == target:
                return True
    return False


def _read_pid(path):
    try:
        with open(path) as handle:
            return int(handle.read().strip())
    except (OSError, ValueError):
        return None


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:   # a zombie child counts as gone
        with open("/proc/%d/stat" % pid) as handle:
            return handle.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _kill(pid, timeout=3.0):
    """SIGTERM, wait, SIGKILL; reaps the process when it is our child."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    return
            except ChildProcessError:
                pass
            if not _alive(pid):
                return
            time.sleep(0.02)


# ---- up / down -----------------------------------------------------------------------------------
def serve_foreground(root, spec, latency_ms=0, driver_version=DEFAULT_DRIVER_VERSION):
    """Build the state and serve ROOT in this process until it is unmounted."""
    state = State(spec, latency_ms=latency_ms, driver_version=driver_version)
    os.makedirs(root, exist_ok=True)
    if is_mounted(root):
        raise GpuSimError("%s is already mounted; run: gpusim down %s" % (root, root))
    run = runtime_dir(root)
    with open(os.path.join(run, "server.pid"), "w") as handle:
        handle.write("%d\n" % os.getpid())
    os.chdir("/")
    serve(state, os.path.realpath(root))


def up(root, spec, latency_ms=0, driver_version=DEFAULT_DRIVER_VERSION):
    """Start a background server for ROOT and return once the tree is mounted and answering."""
    layout.pf_slots(spec)            # a bad SPEC fails here, before anything is started
    root = os.path.realpath(root)
    if is_mounted(root):
        server = _read_pid(os.path.join(runtime_dir(root, create=False), "server.pid"))
        if server and _alive(server):
            raise GpuSimError("%s is already served by gpusim (pid %d); run: gpusim down %s" % (root, server, root))
        down(root)                   # a stale mount left by a killed server
    os.makedirs(root, exist_ok=True)
    run = runtime_dir(root)
    log_path = os.path.join(run, "server.log")
    argv = [sys.executable, "-m", "gpusim.cli", "up", root, "--gpus", spec, "--foreground",
            "--vf-enable-latency-ms", str(latency_ms), "--driver-version", driver_version]
    paths = [_package_parent()] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd="/",
                                start_new_session=True, env=env)
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise GpuSimError("gpusim server for %s exited with %s: %s" % (root, proc.returncode, _tail(log_path)))
        if is_mounted(root) and os.path.exists(os.path.join(root, ".gpusim", "state.json")):
            return proc.pid
        time.sleep(0.05)
    down(root)
    raise GpuSimError("gpusim server for %s did not mount within %.0f s: %s" % (root, START_TIMEOUT, _tail(log_path)))


def _package_parent():
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tail(path, lines=5):
    try:
        with open(path) as handle:
            return " | ".join(handle.read().strip().splitlines()[-lines:]) or "(no output)"
    except OSError:
        return "(no log)"


def down(root):
    """Unmount ROOT and stop its server and holders; safe to repeat, works on broken mounts."""
    root = os.path.realpath(root)
    run = runtime_dir(root, create=False)
    kill_holders(root)
    for argv in (["fusermount3", "-u", root], ["fusermount3", "-uz", root], ["umount", "-l", root]):
        if not is_mounted(root):
            break
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    server = _read_pid(os.path.join(run, "server.pid"))
    if server:
        deadline = time.monotonic() + 3.0
        while _alive(server) and time.monotonic() < deadline:   # exits by itself once unmounted
            try:
                os.waitpid(server, os.WNOHANG)
            except ChildProcessError:
                pass
            time.sleep(0.02)
        _kill(server)
    if is_mounted(root):
        raise GpuSimError("%s is still mounted after fusermount3 -u, -uz and umount -l" % root)
    shutil.rmtree(run, ignore_errors=True)


# ---- holders (a VM opening the VFIO device) --------------------------------------------------------
def device_node(root, name):
    """ROOT/.gpusim/dev/vfio/devices/vfio<N> of a VF or mdev, else its vfio/<group> node."""
    for base in ("bus/pci/devices", "bus/mdev/devices"):
        path = os.path.join(root, base, name)
        if os.path.exists(path):
            vfio_dev = os.path.join(path, "vfio-dev")
            if os.path.isdir(vfio_dev) and os.listdir(vfio_dev):
                return os.path.join(root, ".gpusim/dev/vfio/devices", sorted(os.listdir(vfio_dev))[0])
            group = os.path.basename(os.readlink(os.path.join(path, "iommu_group")))
            node = os.path.join(root, ".gpusim/dev/vfio", group)
            if os.path.exists(node):
                return node
            raise GpuSimError("%s has no VFIO device node (only VFs, mdevs and functions bound to vfio-pci can be held)" % name)
    raise GpuSimError("no device %s under %s" % (name, root))


def hold(root, name):
    """Start a detached process that keeps the device's VFIO node open; returns its pid."""
    root = os.path.realpath(root)
    node = device_node(root, name)
    proc = subprocess.Popen([sys.executable, "-c", HOLDER_CODE, node], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd="/", start_new_session=True)
    line = proc.stdout.readline()
    if line.strip() != b"ready":
        proc.wait()
        raise GpuSimError("holding %s failed: %s" % (name, proc.stderr.read().decode().strip()[-200:]))
    proc.stdout.close()
    proc.stderr.close()
    with open(os.path.join(runtime_dir(root), "holders", "%s.%d" % (name, proc.pid)), "w") as handle:
        handle.write(node + "\n")
    return proc.pid


def _holder_files(root, name=None):
    folder = os.path.join(runtime_dir(root, create=False), "holders")
    try:
        entries = os.listdir(folder)
    except OSError:
        return []
    return [(os.path.join(folder, entry), int(entry.rsplit(".", 1)[1])) for entry in entries
            if name is None or entry.rsplit(".", 1)[0] == name]


def release(root, name):
    """Stop the holders of `name` started by hold() and wait until the server saw the close."""
    root = os.path.realpath(root)
    holders = _holder_files(root, name)
    if not holders:
        raise GpuSimError("%s is not held by gpusim ctl hold" % name)
    for path, pid in holders:
        _kill(pid)
        os.unlink(path)
    wait_unheld(root, name)


def kill_holders(root):
    for path, pid in _holder_files(root):
        _kill(pid)
        os.unlink(path)


def wait_unheld(root, name, timeout=10.0):
    """FUSE release is asynchronous: wait until state.json no longer lists `name` as held."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(os.path.join(root, ".gpusim", "state.json")) as handle:
                if name not in json.load(handle)["held"]:
                    return
        except (OSError, ValueError):
            return
        time.sleep(0.01)
    raise GpuSimError("%s is still held after its holder exited" % name)


def control(root, command):
    """One command to ROOT/.gpusim/ctl; an errno from the server becomes GpuSimError."""
    try:
        with open(os.path.join(root, ".gpusim", "ctl"), "w") as handle:
            handle.write(command)
    except OSError as exc:
        name = errno.errorcode.get(exc.errno, str(exc.errno))
        raise GpuSimError("%s: %s (%s)" % (command, os.strerror(exc.errno), name)) from None
