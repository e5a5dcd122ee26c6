# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The host vGPU manager driver: detect it, install/upgrade/remove it from NVIDIA's runfile.

Node-side engine: standard library only, no Ansible import. Everything the kernel says comes
from an injectable sysfs root, every tool runs through an injectable runner, so the tests drive
it against gpusim and fake tools.

Decisions (documented in the module):
- Installed version: `<sysfs>/module/nvidia/version` when the module is loaded (what the kernel
  runs), else `modinfo -F version nvidia` (installed but not loaded, e.g. right after a reboot).
  Loaded modules: `<proc>/modules` (what lsmod reads), else `<sysfs>/module/<name>`.
- vGPU-manager flavour: `nvidia_vgpu_vfio` is loaded, or the `nvidia-vgpu-mgr` daemon exists
  (only the vGPU-KVM runfile ships it). A plain data-center driver of the same version is
  replaced by an install.
- A runfile is accepted when its name is `NVIDIA-Linux-<arch>-<version>-vgpu-kvm[-aie].run`, its
  first bytes are a makeself shell header, and its `--version` output names the same version.
- Before the first stop (install, upgrade, absent) nothing may use the vGPU stack (vgpu_busy.users:
  a VF/mdev a VM holds, or nvidia_vgpu_vfio with users; "cannot tell" counts as in use), and an
  install needs the running kernel's build tree (`<modules_dir>/<release>/build`, release from
  `<proc_root>/sys/kernel/osrelease`, or the installer's --kernel-source-path) and `dkms` with
  `dkms: true`. Otherwise it refuses, naming what is missing or held, and changes nothing.
- A step failing after the first stop restores what ran before (modprobe the modules that were
  loaded, start the services that were active), reads the node again and reports both the failure
  and the restore in one line. The planned restore is part of the plan (`on_failure`), so check
  and diff mode show the whole sequence.
"""

from __future__ import annotations

import os
import re

from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import vgpu_busy
from ansible_collections.accelops.vgpu.plugins.module_utils.atomic_file import write_file
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders.claim_holders import DEFAULT_KUBELET_DIR
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders.kubelet_holders import holder_sources
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders.inuse import InUseError
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import Sysfs

RUNFILE_NAME = re.compile(
    r"^NVIDIA-Linux-(?P<arch>x86_64|aarch64)-(?P<version>\d+(?:\.\d+){1,2})-vgpu-kvm(?P<aie>-aie)?\.run\Z")
RUNFILE_PATTERN = "NVIDIA-Linux-<arch>-<version>-vgpu-kvm[-aie].run"
VERSION_OUTPUT = re.compile(r"version:?\s+(\d+(?:\.\d+){1,2})")
# makeself writes its shell header (with a "Makeself" banner) before the payload; NVIDIA's is ~20 KiB.
HEADER_BYTES = 64 * 1024
# -s implies these two, but older installers only honour the explicit forms: pass all three.
SILENT_ARGS = ("--ui=none", "--no-questions", "--silent")
MODULES = ("nvidia", "nvidia_vgpu_vfio")
DEFAULT_SERVICES = ("nvidia-vgpud.service", "nvidia-vgpu-mgr.service")
BLACKLIST_NAME = "accelops-vgpu-blacklist-nouveau.conf"
BLACKLIST_CONTENT = ("# Written by accelops.vgpu.vgpu_driver: the NVIDIA vGPU manager needs nouveau off.\n"
                     "blacklist nouveau\noptions nouveau modeset=0\n")
BLACKLIST_MODE = 0o644
KERNEL_SOURCE_ARG = "--kernel-source-path"


class DriverError(EngineError):
    """A driver operation cannot go ahead; the message names the runfile or driver version."""


def version_key(version):
    return tuple(int(part) for part in version.split("."))


class Runfile:
    """A validated vGPU-KVM runfile: `path`, `arch`, `version`, `aie`."""

    def __init__(self, path, arch, version, aie):
        self.path, self.arch, self.version, self.aie = path, arch, version, aie

    @classmethod
    def inspect(cls, path, runner):
        """Validate name, header and `--version` output; raise DriverError (one line) otherwise."""
        runfile = cls.from_file(path)
        rc, out, err = runner.run(["sh", path, "--version"], check=False)
        reported = VERSION_OUTPUT.search(out or "")
        if rc != 0 or not reported:
            why = (err or out or "no version in its output").strip().splitlines()
            raise DriverError("runfile %s: '--version' failed: %s" % (path, why[-1] if why else "rc %s" % rc))
        if reported.group(1) != runfile.version:
            raise DriverError("runfile %s: its name says %s but '--version' reports %s"
                              % (path, runfile.version, reported.group(1)))
        return runfile

    @classmethod
    def from_file(cls, path):
        """Validate name and makeself header without running the file (the image build host)."""
        if not os.path.isfile(path):
            raise DriverError("runfile %s: no such file" % path)
        match = RUNFILE_NAME.match(os.path.basename(path))
        if not match:
            raise DriverError("runfile %s: not a vGPU-KVM runfile name (expected %s)" % (path, RUNFILE_PATTERN))
        with open(path, "rb") as handle:
            head = handle.read(HEADER_BYTES)
        if not head.startswith(b"#!") or b"makeself" not in head.lower():
            raise DriverError("runfile %s: not a makeself archive (no makeself shell header)" % path)
        return cls(path, match.group("arch"), match.group("version"), bool(match.group("aie")))


class DriverState:
    """What the node runs now: version, flavour, loaded modules, service states."""

    def __init__(self, version, loaded, vgpu_manager, modules, services):
        self.version, self.loaded, self.vgpu_manager = version, loaded, vgpu_manager
        self.modules, self.services = modules, services

    @classmethod
    def read(cls, sysfs, runner, services=(), proc_root="/proc"):
        loaded_modules = _loaded_modules(proc_root)
        modules = [name for name in MODULES
                   if (name in loaded_modules if loaded_modules is not None else sysfs.exists("module/%s" % name))]
        version = sysfs.read_optional("module/nvidia/version")
        loaded = version is not None
        if not loaded:
            version = _installed_module_version(runner)
        vgpu_manager = "nvidia_vgpu_vfio" in modules or bool(_which(runner, "nvidia-vgpu-mgr"))
        return cls(version, loaded, vgpu_manager, modules,
                   {name: _service_state(runner, name) for name in services})

    def as_dict(self):
        return {"version": self.version, "vgpu_manager": self.vgpu_manager,
                "loaded_modules": list(self.modules), "services": dict(self.services)}


def _loaded_modules(proc_root):
    """Names in <proc_root>/modules (what lsmod shows), or None when it cannot be read."""
    try:
        with open(os.path.join(proc_root, "modules"), encoding="utf-8") as handle:
            return {line.split(None, 1)[0] for line in handle if line.strip()}
    except OSError:
        return None


def _which(runner, name):
    # PATH first (so a container's or a test's tools win), then where the runfile/distro put them.
    return runner.which(name) or runner.which(name, extra_paths=("/usr/bin/%s" % name, "/usr/sbin/%s" % name))


def _installed_module_version(runner):
    modinfo = _which(runner, "modinfo")
    if not modinfo:
        return None
    rc, out, _err = runner.run([modinfo, "-F", "version", "nvidia"], check=False)
    return (out.strip() or None) if rc == 0 else None


def _service_state(runner, name):
    systemctl = _which(runner, "systemctl")
    if not systemctl:
        return {"enabled": False, "active": False}
    enabled = runner.run([systemctl, "is-enabled", name], check=False)[1].strip()
    active = runner.run([systemctl, "is-active", name], check=False)[1].strip()
    return {"enabled": enabled == "enabled", "active": active == "active"}


class Action:
    """One step of a plan: a command (argv) or the blacklist file write."""

    def __init__(self, describe, argv=None, write=None, disruptive=False):
        # disruptive: from this step on the running vGPU manager is (partly) gone; a failure restores it
        self.describe, self.argv, self.write, self.disruptive = describe, argv, write, disruptive

    def __repr__(self):
        return "Action(%r)" % self.describe


class DriverManager:
    """Plans and applies `state: present|absent` for the vGPU manager driver."""

    def __init__(self, runner, sysfs_root="/sys", modprobe_dir="/etc/modprobe.d", proc_root="/proc",
                 dev_root="/dev", modules_dir="/lib/modules", kubelet_dir=DEFAULT_KUBELET_DIR):
        self.runner = runner
        # a vGPU a pod holds through a DRA claim or a device plugin allocation is in use too (node/holders/kubelet_holders.py)
        self.holder_sources = holder_sources(kubelet_dir)
        self.sysfs = Sysfs(sysfs_root)
        self.modprobe_dir = modprobe_dir
        self.proc_root, self.dev_root, self.modules_dir = proc_root, dev_root, modules_dir

    def tool(self, name):
        path = _which(self.runner, name)
        if not path:
            raise DriverError("%s: not found on PATH (needed to manage the NVIDIA vGPU manager driver)" % name)
        return path

    # -- planning ------------------------------------------------------------------------------
    def plan(self, params):
        """(state before, runfile or None, [Action], after dict); raises before any change."""
        services = list(params["services"]) if params["manage_services"] else []
        state = DriverState.read(self.sysfs, self.runner, services, self.proc_root)
        if params["state"] == "absent":
            actions = self._plan_absent(params, state, services)
            if actions:
                self._refuse_while_in_use(state, "remove it")
            gone = {"version": None, "vgpu_manager": False, "loaded_modules": [],
                    "services": {name: {"enabled": False, "active": False} for name in services}}
            return state, None, actions, gone if actions else state.as_dict()
        runfile = Runfile.inspect(params["runfile"], self.runner)
        if state.version and version_key(runfile.version) < version_key(state.version) \
                and not params["allow_downgrade"]:
            raise DriverError("driver %s: refusing to downgrade to %s from %s (set allow_downgrade)"
                              % (state.version, runfile.version, runfile.path))
        install = state.version != runfile.version or not state.vgpu_manager
        actions = self._plan_blacklist(params)
        if install:
            self._check_build_prerequisites(params, runfile)
            self._refuse_while_in_use(state, "install %s" % runfile.version)
            actions += self._plan_stop(state, services) + self._plan_install(params, runfile)
        actions += self._plan_load(params, state, install) + self._plan_services(state, services, install)
        after = {"version": runfile.version, "vgpu_manager": True,
                 "loaded_modules": list(MODULES) if params["load_modules"] else
                 ([] if install else list(state.modules)),
                 "services": {name: {"enabled": True, "active": True} for name in services}}
        return state, runfile, actions, after

    # -- before the first stop ------------------------------------------------------------------
    def _refuse_while_in_use(self, state, doing):
        """DriverError naming every holder (or why nobody can tell) while the vGPU stack is in use."""
        try:
            found = vgpu_busy.users(self.sysfs, self.dev_root, self.proc_root, self.holder_sources)
        except InUseError as err:
            found = ["cannot tell which devices VMs hold (%s)" % err]
        if found:
            raise DriverError("driver %s: refusing to %s while the vGPU stack is in use (stopping it takes the vGPU "
                              "from running VMs; stop them first): %s"
                              % (state.version or "(none)", doing, "; ".join(found)))

    def kernel_release(self):
        """The running kernel's release (`uname -r`) as `<proc_root>/sys/kernel/osrelease` says."""
        try:
            with open(os.path.join(self.proc_root, "sys/kernel/osrelease"), encoding="utf-8") as handle:
                return handle.read().strip() or os.uname().release
        except OSError:
            return os.uname().release

    def _check_build_prerequisites(self, params, runfile):
        """The runfile builds its kernel modules for the running kernel: its build tree (headers) must be there,
        and `dkms` when asked for."""
        args = list(params["installer_args"])
        source = None
        for index, arg in enumerate(args):
            if arg.startswith(KERNEL_SOURCE_ARG + "="):
                source = arg.split("=", 1)[1]
            elif arg == KERNEL_SOURCE_ARG and index + 1 < len(args):
                source = args[index + 1]
        release = self.kernel_release()
        source = source or os.path.join(self.modules_dir, release, "build")
        if not os.path.isdir(source):
            raise DriverError("driver %s: cannot build its kernel modules for the running kernel %s: no kernel source "
                              "tree at %s (install the kernel headers for %s, or pass %s)"
                              % (runfile.version, release, source, release, KERNEL_SOURCE_ARG))
        if params["dkms"] and not _which(self.runner, "dkms"):
            raise DriverError("driver %s: dkms is true but dkms is not installed on the node" % runfile.version)

    def _plan_blacklist(self, params):
        if not params["blacklist_nouveau"]:
            return []
        path = os.path.join(self.modprobe_dir, BLACKLIST_NAME)
        try:
            with open(path, encoding="utf-8") as handle:
                same = handle.read() == BLACKLIST_CONTENT and (os.stat(path).st_mode & 0o7777) == BLACKLIST_MODE
        except OSError:
            same = False
        return [] if same else [Action("blacklist nouveau in %s" % path, write=path)]

    def _plan_stop(self, state, services):
        actions = [Action("stop %s" % name, argv=[self.tool("systemctl"), "stop", name], disruptive=True)
                   for name in services if state.services[name]["active"]]
        loaded = [name for name in reversed(MODULES) if name in state.modules]
        if loaded:
            actions.append(Action("unload %s" % " ".join(loaded),
                                  argv=[self.tool("modprobe"), "-r"] + loaded, disruptive=True))
        return actions

    def _plan_install(self, params, runfile):
        argv = ["sh", runfile.path] + list(SILENT_ARGS) + (["--dkms"] if params["dkms"] else [])
        argv += list(params["installer_args"])
        return [Action("install %s from %s" % (runfile.version, os.path.basename(runfile.path)), argv=argv,
                       disruptive=True)]

    def _plan_load(self, params, state, install):
        if not params["load_modules"]:
            return []
        return [Action("load %s" % name, argv=[self.tool("modprobe"), name])
                for name in MODULES if install or name not in state.modules]

    def _plan_services(self, state, services, install):
        actions = []
        for name in services:
            now = state.services[name]
            if install or not now["enabled"]:
                actions.append(Action("enable %s" % name, argv=[self.tool("systemctl"), "enable", name]))
            if install or not now["active"]:
                actions.append(Action("start %s" % name, argv=[self.tool("systemctl"), "start", name]))
        return actions

    def _plan_absent(self, params, state, services):
        if not state.version and not state.vgpu_manager:
            return []
        actions = self._plan_stop(state, services)
        actions += [Action("disable %s" % name, argv=[self.tool("systemctl"), "disable", name])
                    for name in services if state.services[name]["enabled"]]
        if params.get("runfile"):
            runfile = Runfile.inspect(params["runfile"], self.runner)
            argv = ["sh", runfile.path, "--uninstall"]
        else:
            argv = [self.tool("nvidia-uninstall")]
        actions.append(Action("uninstall driver %s" % (state.version or "(vGPU manager)"),
                              argv=argv + list(SILENT_ARGS), disruptive=True))
        return actions

    # -- applying ------------------------------------------------------------------------------
    def apply(self, params, check_mode=False):
        """Result dict: changed, version, previous_version, actions, on_failure, before, after."""
        before, runfile, actions, after = self.plan(params)
        disruptive = any(action.disruptive for action in actions)
        result = {"changed": bool(actions), "previous_version": before.version, "actions":
                  [action.describe for action in actions], "before": before.as_dict(), "after": after,
                  "on_failure": self._describe_restore(before) if disruptive else [],
                  "version": after["version"], "runfile_version": runfile.version if runfile else None}
        if check_mode:
            return result
        disrupted = False
        for action in actions:
            disrupted = disrupted or action.disruptive
            try:
                if action.write:
                    write_file(action.write, BLACKLIST_CONTENT, BLACKLIST_MODE)
                else:
                    self.runner.run(action.argv)
            except (EngineError, OSError) as err:
                if not disrupted:
                    raise
                raise DriverError("driver %s: '%s' failed (%s); %s"
                                  % (before.version or "(none)", action.describe, err, self._restore(before))) from None
        if runfile and actions:
            self._verify(runfile, params)
        return result

    @staticmethod
    def _describe_restore(before):
        """What a failure after the first stop brings back: the modules that were loaded, the services that ran."""
        return (["load %s" % name for name in MODULES if name in before.modules]
                + ["start %s" % name for name, now in before.services.items() if now["active"]])

    def _restore(self, before):
        """Bring back what `before` ran; one clause saying what was restored or what is still missing."""
        services = list(before.services)
        now = DriverState.read(self.sysfs, self.runner, services, self.proc_root)
        done = []
        modprobe, systemctl = _which(self.runner, "modprobe"), _which(self.runner, "systemctl")
        for name in MODULES:
            if name in before.modules and name not in now.modules and modprobe:
                if self.runner.run([modprobe, name], check=False)[0] == 0:
                    done.append("loaded %s" % name)
        for name in services:
            if before.services[name]["active"] and not now.services[name]["active"] and systemctl:
                if self.runner.run([systemctl, "start", name], check=False)[0] == 0:
                    done.append("started %s" % name)
        final = DriverState.read(self.sysfs, self.runner, services, self.proc_root)
        missing = ["module %s" % name for name in before.modules if name not in final.modules]
        missing += ["service %s" % name for name in services
                    if before.services[name]["active"] and not final.services[name]["active"]]
        if before.loaded and final.version != before.version:
            missing.append("driver %s (the kernel runs %s)" % (before.version, final.version or "no nvidia module"))
        if missing:
            return "restore incomplete: %s not back%s" % (
                ", ".join(missing), " (did: %s)" % ", ".join(done) if done else "")
        if not done:
            ran = self._describe_restore(before)
            return "nothing to restore (%s)" % ("modules and services as before" if ran else "nothing ran before")
        return "restored: %s" % ", ".join(done)

    def _verify(self, runfile, params):
        now = DriverState.read(self.sysfs, self.runner, (), self.proc_root)
        if params["load_modules"] and now.version != runfile.version:
            raise DriverError("driver %s: installed from %s but the kernel runs %s (a reboot may be needed)"
                              % (runfile.version, runfile.path, now.version or "no nvidia module"))
