"""Fake NVIDIA vGPU-KVM runfiles for tests: a shell script with a makeself-like header.

It honours what `vgpu_driver` and the image entrypoint use:
  --version                 prints "<name>: version <V>" like the real runfile
  --ui=none ... --silent    "installs" driver V into the fake node ($FAKE_NODE, see driver_tools.py):
                            records the version, drops nvidia-vgpu-mgr/nvidia-vgpud/nvidia-uninstall
                            into $FAKE_NODE/bin; refuses while the nvidia module is loaded, as the real
                            installer does
  --uninstall               removes it again
Every call appends one line "runfile <V> <args>" to $FAKE_NODE/calls.log.
"""

import os
import stat

HEADER = """#!/bin/sh
# This script was generated using Makeself 2.1.5 (fake NVIDIA vGPU-KVM runfile for accelops.vgpu tests)
label="NVIDIA Accelerated Graphics Driver for Linux-{arch} {version} (vGPU KVM, fake)"
"""

BODY = r"""VERSION={version}
NAME=$(basename "$0")
sysroot=${{GPUSIM_ROOT:-/sys}}
[ -n "${{FAKE_NODE:-}}" ] && printf 'runfile %s %s\n' "$VERSION" "$*" >> "$FAKE_NODE/calls.log"
case " $* " in
  *" --version "*) echo "$NAME: version {reported}"; exit 0 ;;
esac
node=${{FAKE_NODE:?FAKE_NODE is not set}}
if [ -e "$sysroot/module/nvidia/version" ]; then
  echo "ERROR: An NVIDIA kernel module 'nvidia' appears to already be loaded in your kernel." >&2
  exit 1
fi
case " $* " in
  *" --uninstall "*)
    rm -f "$node/installed_version" "$node/bin/nvidia-vgpu-mgr" "$node/bin/nvidia-vgpud" "$node/bin/nvidia-uninstall"
    exit 0 ;;
  *" --silent "*) ;;
  *) echo "ERROR: fake runfile needs --silent (the real one would ask questions)" >&2; exit 2 ;;
esac
{fail}
mkdir -p "$node/bin"
echo "$VERSION" > "$node/installed_version"
# the daemons log their start; nvidia-vgpu-mgr stays up like the real one (the image entrypoint supervises it)
printf '#!/bin/sh\necho "nvidia-vgpud $*" >> "$FAKE_NODE/calls.log"\n' > "$node/bin/nvidia-vgpud"
printf '#!/bin/sh\necho "nvidia-vgpu-mgr $*" >> "$FAKE_NODE/calls.log"\nexec sleep 1000000\n' > "$node/bin/nvidia-vgpu-mgr"
chmod 755 "$node/bin/nvidia-vgpud" "$node/bin/nvidia-vgpu-mgr"
printf '#!/bin/sh\nexec sh "%s" --uninstall "$@"\n' "$(readlink -f "$0")" > "$node/bin/nvidia-uninstall"
chmod 755 "$node/bin/nvidia-uninstall"
exit 0
"""


def runfile_name(version, arch="x86_64", aie=False):
    return "NVIDIA-Linux-%s-%s-vgpu-kvm%s.run" % (arch, version, "-aie" if aie else "")


def write_runfile(directory, version, arch="x86_64", aie=False, name=None, reported=None,
                  makeself=True, fail_install=False):
    """Write a fake runfile into `directory` and return its path.

    `reported` makes `--version` lie (a renamed file), `makeself=False` drops the header banner,
    `fail_install=True` makes the install step exit 1 like a failed kernel module build.
    """
    header = HEADER.format(arch=arch, version=version)
    if not makeself:
        header = header.replace("Makeself", "a shell")
    fail = 'echo "ERROR: Unable to build the NVIDIA kernel module." >&2; exit 1' if fail_install else ""
    body = BODY.format(version=version, reported=reported or version, fail=fail)
    path = os.path.join(str(directory), name or runfile_name(version, arch, aie))
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(header + body)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    return path
