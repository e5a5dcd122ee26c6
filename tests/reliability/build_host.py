"""Build-host doubles: a runner that only runs read-only commands, runfiles, module parameters.

`QueryOnlyRunner` runs `sh <runfile> --version` for real, answers the other queries itself (no local
image, no installed module, services inactive) and records every other command as a write without
running it: a bad input that slips through validation shows up in `mutations` instead of building
or installing anything.
"""

from __future__ import annotations

import os

from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine.nvdriver import DEFAULT_SERVICES
from ansible_collections.accelops.vgpu.plugins.module_utils.runner import CommandRunner
from ansible_collections.accelops.vgpu.tests.fakes.driver_tools import FAKE_KERNEL
from ansible_collections.accelops.vgpu.tests.fakes.runfile import write_runfile

DRIVER_LOADED = "570.172.07"          # gpusim's default driver version
UPGRADE = "575.51.02"                 # a newer runfile: an upgrade stops the vGPU manager


class QueryOnlyRunner(CommandRunner):
    def __init__(self):
        super().__init__(timeout=30)
        self.mutations = []

    def which(self, name, extra_paths=()):
        return "/fake/bin/" + name  # never executed: see _execute

    def _execute(self, argv):
        if argv[-1] == "--version":
            return super()._execute(argv)
        tool, args = os.path.basename(argv[0]), argv[1:]
        if tool == "podman" and args[:2] == ["image", "inspect"]:
            return 125, "", "Error: %s: image not known" % argv[-1]
        if tool == "modinfo":
            return 1, "", "modinfo: ERROR: Module nvidia not found."
        if tool == "systemctl" and args[:1] in (["is-enabled"], ["is-active"]):
            return 3, "inactive", ""
        self.mutations.append(argv)
        return 0, "", ""


class NoRegistry:
    """Registry double: the image is not there yet (so a run that got this far would build and push)."""

    def __init__(self):
        self.reads = []

    def image_labels(self, repository, tag):
        self.reads.append((repository, tag))


def runfiles(directory):
    """The runfiles the cases refer to, written into `directory`, and beside them a `proc` root (no process,
    the running kernel FAKE_KERNEL) and `lib/modules` with that kernel's (and this host's) build tree."""
    os.makedirs(os.path.join(str(directory), "proc", "sys", "kernel"), exist_ok=True)
    with open(os.path.join(str(directory), "proc", "sys", "kernel", "osrelease"), "w", encoding="utf-8") as handle:
        handle.write(FAKE_KERNEL + "\n")
    for release in (FAKE_KERNEL, os.uname().release):  # the latter for cases that read the host's /proc
        os.makedirs(os.path.join(str(directory), "lib", "modules", release, "build"), exist_ok=True)
    write_runfile(directory, UPGRADE)
    write_runfile(directory, DRIVER_LOADED)
    write_runfile(directory, "550.54.16")
    write_runfile(directory, DRIVER_LOADED, name="NVIDIA-Linux-x86_64-%s.run" % DRIVER_LOADED)
    write_runfile(directory, "570.172.08", makeself=False)
    write_runfile(directory, "580.82.03", reported="580.82.04")


def fill(value, tmp):
    """`{tmp}` replaced in every string (keys too) of a parameter structure."""
    if isinstance(value, str):
        return value.replace("{tmp}", str(tmp))
    if isinstance(value, dict):
        return dict((fill(k, tmp), fill(v, tmp)) for k, v in value.items())
    if isinstance(value, list):
        return [fill(v, tmp) for v in value]
    return value


def image_params(tmp, **overrides):
    """vgpu_manager_image's parameters (module defaults) for a valid private build, then `overrides`."""
    params = {"name": "registry.example.com/nvidia/vgpu-manager", "os_tag": "ubuntu24.04",
              "runfile": "{tmp}/NVIDIA-Linux-x86_64-%s-vgpu-kvm.run" % DRIVER_LOADED, "driver_version": None,
              "containerfile": "FROM localhost/accelops-debian:bookworm\n", "context_files": {}, "context_paths": {},
              "build_args": {}, "labels": {}, "pull": "never", "push": True, "force": False,
              "registry_username": None, "registry_password": None, "tls_verify": True,
              "allow_public_registry": False, "work_dir": "{tmp}/work", "executable": "podman"}
    params.update(overrides)
    return fill(params, tmp)


def driver_params(tmp, sysfs_root, **overrides):
    """vgpu_driver's parameters (module defaults) against `sysfs_root`, then `overrides`."""
    params = {"state": "present", "runfile": None, "dkms": False, "allow_downgrade": False, "installer_args": [],
              "blacklist_nouveau": True, "modprobe_dir": "{tmp}/modprobe.d", "load_modules": True,
              "manage_services": True, "services": list(DEFAULT_SERVICES), "sysfs_root": sysfs_root,
              "proc_root": "{tmp}/proc", "dev_root": "/dev", "modules_dir": "{tmp}/lib/modules", "lock_timeout": 10.0}
    params.update(overrides)
    return fill(params, tmp)


def files_below(directory):
    """Files under `directory` (none when it does not exist)."""
    return sorted(os.path.join(d, f) for d, dummy, names in os.walk(str(directory)) for f in names)
