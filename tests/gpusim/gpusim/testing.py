"""Python API for tests: a mounted simulated node as a context manager.

    with GpuSimNode("l40s:2", latency_ms=0) as node:
        subprocess.run(["sriov-manage", "-e", node.pfs()[0]], env=node.env, check=True)
        assert node.writes()[-1]["path"].endswith("bus/pci/drivers/nvidia/bind")

On exit (also after an exception) holders are killed and ROOT is unmounted; a temporary ROOT is
removed.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile

from gpusim import daemon, tools
from gpusim.models import DEFAULT_DRIVER_VERSION


class GpuSimNode:
    def __init__(self, spec, root=None, latency_ms=0, driver_version=DEFAULT_DRIVER_VERSION):
        self.spec = spec
        self.latency_ms = latency_ms
        self.driver_version = driver_version
        self._own_dir = None
        if root is None:
            self._own_dir = tempfile.mkdtemp(prefix="gpusim-", dir="/tmp")
            root = os.path.join(self._own_dir, "sys")
        self.root = os.path.realpath(root)
        self.dev_root = os.path.join(self.root, ".gpusim", "dev")
        self.tools_dir = os.path.join(self._own_dir or tempfile.mkdtemp(prefix="gpusim-tools-", dir="/tmp"),
                                      "bin")
        self._initial_env = dict(os.environ, GPUSIM_ROOT=self.root,
                                 PATH=self.tools_dir + os.pathsep + os.environ.get("PATH", ""))
        self.env = dict(self._initial_env)
        self.mounted = False

    # ---- lifecycle -------------------------------------------------------------------------------
    def start(self):
        tools.install(self.tools_dir)
        try:
            daemon.up(self.root, self.spec, self.latency_ms, self.driver_version)
        except BaseException:
            self._cleanup_dirs()
            raise
        self.mounted = True
        return self

    def stop(self):
        try:
            if self.mounted:
                daemon.down(self.root)
                self.mounted = False
        finally:
            self._cleanup_dirs()

    def _cleanup_dirs(self):
        if self._own_dir and not daemon.is_mounted(self.root):
            shutil.rmtree(self._own_dir, ignore_errors=True)
        elif not self._own_dir:
            shutil.rmtree(os.path.dirname(self.tools_dir), ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc_info):
        self.stop()

    # ---- paths ---------------------------------------------------------------------------------------
    def path(self, *parts):
        return os.path.join(self.root, *parts)

    def device_path(self, address, *parts):
        return os.path.join(self.root, "bus/pci/devices", address, *parts)

    def read(self, relpath):
        with open(self.path(relpath)) as handle:
            return handle.read().rstrip("\n")

    def write(self, relpath, value):
        """One write(2) of `value` to ROOT/relpath; OSError carries the simulated errno."""
        fd = os.open(self.path(relpath), os.O_WRONLY)
        try:
            os.write(fd, str(value).encode())
        finally:
            os.close(fd)

    # ---- observation -----------------------------------------------------------------------------------
    def state(self):
        with open(self.path(".gpusim", "state.json")) as handle:
            return json.load(handle)

    def log(self):
        with open(self.path(".gpusim", "log")) as handle:
            return [json.loads(line) for line in handle if line.strip()]

    def writes(self):
        return [entry for entry in self.log() if entry["result"] == "ok"]

    def reads(self):
        """{canonical path: opens for reading} since the last clear_log (sysfs reads, .gpusim/ not counted)."""
        with open(self.path(".gpusim", "reads")) as handle:
            return json.load(handle)

    def clear_log(self):
        self.ctl("clear-log")

    # ---- control ---------------------------------------------------------------------------------------
    def ctl(self, *args):
        """Raw command to ROOT/.gpusim/ctl: ctl("reboot"), ctl("fail-next", path, "EIO"),
        ctl("driver", "unload"), ctl("driver", "load", "580.1"), ctl("mixed", pf, "1")."""
        if args and args[0] == "reboot":
            daemon.kill_holders(self.root)
        daemon.control(self.root, " ".join(str(arg) for arg in args))

    def reset(self):
        """Kill holders and return to the state right after start (log, injected failures and a
        test's changes to `env` too)."""
        daemon.kill_holders(self.root)
        daemon.control(self.root, "reset")
        self.env = dict(self._initial_env)
        tools.install(self.tools_dir)

    def healthy(self):
        """Mounted and answering (a test may have killed or unmounted it)."""
        try:
            return self.mounted and daemon.is_mounted(self.root) and bool(self.state()["pfs"])
        except (OSError, ValueError, KeyError):
            return False

    def hold(self, address):
        """A VM opens the VF's / mdev's VFIO node; returns the holder's pid."""
        return daemon.hold(self.root, address)

    def release(self, address):
        daemon.release(self.root, address)

    def bind(self, address, driver):
        """Move a function to `driver` as an administrator does (`driverctl set-override`): unbind it from
        its driver, write `driver_override`, bind; `bind(pf, "vfio-pci")` reserves a GPU for whole-GPU
        passthrough (its group becomes a VFIO group a VM can hold). Plain sysfs writes: they are logged."""
        device = "bus/pci/devices/" + address
        link = self.path(device, "driver")
        if os.path.islink(link):
            self.write("bus/pci/drivers/%s/unbind" % os.path.basename(os.readlink(link)), address)
        self.write(device + "/driver_override", driver)
        self.write("bus/pci/drivers/%s/bind" % driver, address)

    def pfs(self, model=None):
        return [pf["address"] for pf in self.state()["pfs"] if model is None or pf["model"] == model]

    def vfs(self, pf):
        """VF addresses of `pf` in virtfn order."""
        path = self.device_path(pf)
        names = sorted((n for n in os.listdir(path) if n.startswith("virtfn")), key=lambda n: int(n[6:]))
        return [os.path.basename(os.readlink(os.path.join(path, n))) for n in names]
