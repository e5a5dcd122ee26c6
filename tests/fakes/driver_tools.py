"""Fake node tools for the vGPU manager driver: modprobe, modinfo, systemctl.

A fake node is a directory ($FAKE_NODE) with `bin/` (put it first on PATH), `calls.log` (one line
per tool call: "<tool> <args>"), `proc/modules` (loaded modules, pass `proc_root=$FAKE_NODE/proc`),
`installed_version` (written by the fake runfile) and
`systemd/<unit>.{enabled,active}` markers. The kernel is the sysfs root in $GPUSIM_ROOT: on a
gpusim tree the fakes load/unload the driver through `ROOT/.gpusim/ctl` (`driver load V`),
on a plain directory they write `module/<name>/version` themselves.
"""

import os

KERNEL = r"""node=${FAKE_NODE:?FAKE_NODE is not set}
sysroot=${GPUSIM_ROOT:-/sys}
printf '%s %s\n' "$(basename "$0")" "$*" >> "$node/calls.log"
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
}


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
    os.makedirs(os.path.join(directory, "proc"), exist_ok=True)
    open(os.path.join(directory, "proc", "modules"), "a", encoding="utf-8").close()
    return {"FAKE_NODE": directory, "GPUSIM_ROOT": str(sysfs_root),
            "PATH": bindir + os.pathsep + os.environ.get("PATH", "/usr/bin:/bin")}


def read_calls(directory):
    """The tool calls made so far, as lists of words."""
    with open(os.path.join(str(directory), "calls.log"), encoding="utf-8") as handle:
        return [line.split() for line in handle if line.strip()]


def changing_calls(directory):
    """Calls that change the node (everything but queries): check mode must make none."""
    queries = {("systemctl", "is-enabled"), ("systemctl", "is-active"), ("modinfo", "-F")}
    return [call for call in read_calls(directory)
            if tuple(call[:2]) not in queries and "--version" not in call]
