"""Fake node tools for the vGPU manager driver: modprobe, modinfo, systemctl.

A fake node is a directory ($FAKE_NODE) with `bin/` (put it first on PATH), `calls.log` (one line
per tool call: "<tool> <args>"), `proc/modules` (loaded modules, pass `proc_root=$FAKE_NODE/proc`),
`installed_version` (written by the fake runfile) and
`systemd/<unit>.{enabled,active}` markers, `proc/sys/kernel/osrelease` (the running kernel, FAKE_KERNEL) with
its build tree under `lib/modules/<release>/build` (pass `modules_dir=modules_dir(FAKE_NODE)`; remove it to
play a node without kernel headers) and `proc/1/fd` (procfs always shows a process). A file
`fail/<tool>-<first argument>` makes that call print its content on stderr and exit 1 without acting (a
`modprobe -r` that finds the module in use: `fail/modprobe--r`; a service that does not start:
`fail/systemctl-start`). The kernel is the sysfs root in $GPUSIM_ROOT: on a
gpusim tree the fakes load/unload the driver through `ROOT/.gpusim/ctl` (`driver load V`),
on a plain directory they write `module/<name>/version` themselves.
"""

import os

KERNEL = r"""node=${FAKE_NODE:?FAKE_NODE is not set}
sysroot=${GPUSIM_ROOT:-/sys}
printf '%s %s\n' "$(basename "$0")" "$*" >> "$node/calls.log"
if [ -e "$node/fail/$(basename "$0")-$1" ]; then cat "$node/fail/$(basename "$0")-$1" >&2; exit 1; fi
load() {  # load <module>
  version=$(cat "$node/installed_version" 2>/dev/null) || { echo "modprobe: FATAL: Module $1 not found." >&2; exit 1; }
  grep -q "^$1 " "$node/proc/modules" || echo "$1 1 0 - Live 0x0" >> "$node/proc/modules"
  if [ -e "$sysroot/.gpusim/ctl" ]; then
    if [ "$1" = nvidia ]; then echo "driver load $version" > "$sysroot/.gpusim/ctl"; fi
  else
    mkdir -p "$sysroot/module/$1" && echo "$version" > "$sysroot/module/$1/version"
  fi
}
unload() {  # unload <module>
  sed -i "/^$1 /d" "$node/proc/modules"
  if [ -e "$sysroot/.gpusim/ctl" ]; then
    if [ "$1" = nvidia ]; then echo "driver unload" > "$sysroot/.gpusim/ctl"; fi
  else
    rm -rf "$sysroot/module/$1"
  fi
}
"""

TOOLS = {
    "modprobe": r"""
if [ "$1" = -r ]; then shift; for m in "$@"; do unload "$m"; done; exit 0; fi
for m in "$@"; do load "$m"; done
""",
    "modinfo": r"""
[ "$1 $2 $3" = "-F version nvidia" ] || { echo "fake modinfo: unsupported: $*" >&2; exit 2; }
cat "$node/installed_version" 2>/dev/null || { echo "modinfo: ERROR: Module nvidia not found." >&2; exit 1; }
""",
    "systemctl": r"""
verb=$1 unit=$2 state="$node/systemd/$2"
mkdir -p "$node/systemd"
known() { [ -x "$node/bin/${unit%.service}" ] || { echo "Unit $unit not found." >&2; exit 5; }; }
case $verb in
  is-enabled) [ -e "$state.enabled" ] && { echo enabled; exit 0; }; echo disabled; exit 1 ;;
  is-active) [ -e "$state.active" ] && { echo active; exit 0; }; echo inactive; exit 3 ;;
  enable) known; touch "$state.enabled" ;;
  disable) rm -f "$state.enabled" ;;
  start|restart) known; touch "$state.active" ;;
  stop) rm -f "$state.active" ;;
  *) echo "fake systemctl: unsupported verb $verb" >&2; exit 2 ;;
esac
""",
    "dkms": r"""
[ "$1" = status ] || { echo "fake dkms: unsupported: $*" >&2; exit 2; }
""",
}
FAKE_KERNEL = "6.1.0-accelops-fake"


def make_fake_node(directory, sysfs_root):
    """Create the fake node in `directory`; return the environment the tools (and Ansible) need."""
    directory = str(directory)
    bindir = os.path.join(directory, "bin")
    os.makedirs(bindir, exist_ok=True)
    for name, body in TOOLS.items():
        path = os.path.join(bindir, name)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write("#!/bin/sh\n" + KERNEL + body)
        os.chmod(path, 0o755)
    open(os.path.join(directory, "calls.log"), "a", encoding="utf-8").close()
    os.makedirs(os.path.join(directory, "proc", "1", "fd"), exist_ok=True)
    open(os.path.join(directory, "proc", "modules"), "a", encoding="utf-8").close()
    os.makedirs(os.path.join(directory, "proc", "sys", "kernel"), exist_ok=True)
    with open(os.path.join(directory, "proc", "sys", "kernel", "osrelease"), "w", encoding="utf-8") as handle:
        handle.write(FAKE_KERNEL + "\n")
    os.makedirs(os.path.join(modules_dir(directory), FAKE_KERNEL, "build"), exist_ok=True)
    return {"FAKE_NODE": directory, "GPUSIM_ROOT": str(sysfs_root),
            "PATH": bindir + os.pathsep + os.environ.get("PATH", "/usr/bin:/bin")}


def modules_dir(directory):
    """The fake node's /lib/modules (vgpu_driver's modules_dir)."""
    return os.path.join(str(directory), "lib", "modules")


def fail_calls(directory, tool, first_arg, message):
    """Make every `<tool> <first_arg> ...` call fail with `message` (until `directory/fail/...` is removed)."""
    os.makedirs(os.path.join(str(directory), "fail"), exist_ok=True)
    path = os.path.join(str(directory), "fail", "%s-%s" % (tool, first_arg))
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(message + "\n")
    return path


def hold(directory, device_node, pid=4242):
    """A VM in the fake node's process table: `proc/<pid>/fd/<n>` opens `device_node` (a VFIO node, as QEMU does)."""
    fd_dir = os.path.join(str(directory), "proc", str(pid), "fd")
    os.makedirs(fd_dir, exist_ok=True)
    os.symlink(str(device_node), os.path.join(fd_dir, str(len(os.listdir(fd_dir)) + 3)))
    return pid


def read_calls(directory):
    """The tool calls made so far, as lists of words."""
    with open(os.path.join(str(directory), "calls.log"), encoding="utf-8") as handle:
        return [line.split() for line in handle if line.strip()]


def changing_calls(directory):
    """Calls that change the node (everything but queries): check mode must make none."""
    queries = {("systemctl", "is-enabled"), ("systemctl", "is-active"), ("modinfo", "-F")}
    return [call for call in read_calls(directory)
            if tuple(call[:2]) not in queries and "--version" not in call]
