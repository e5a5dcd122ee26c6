"""Fake NVIDIA sriov-manage for a gpusim tree (standard library only, Python >= 3.6).

usage: sriov-manage -e|-d <ssss:bb:dd.f|ALL>
Acts on $GPUSIM_ROOT (default /sys) through plain sysfs writes, as the real script does
(domain brief §1.5): -e on a PF with sriov_numvfs 0 unbinds it from nvidia, binds it to
pci-pf-stub (via driver_override), writes sriov_totalvfs into sriov_numvfs, rebinds it to nvidia
and binds every VF to nvidia; a PF that already has VFs prints "already has VFs enabled", exit 0.
-d does the same with 0. ALL = every NVIDIA function 0 of class 03xx that has SR-IOV.
Not simulated: the unbind lock, /proc/driver/nvidia/params, nvidia-smi -pm 1.
"""

import os
import sys

ROOT = os.environ.get("GPUSIM_ROOT", "/sys")
DEVICES = os.path.join(ROOT, "bus/pci/devices")
DRIVERS = os.path.join(ROOT, "bus/pci/drivers")


class Failure(Exception):
    pass


def read(path):
    with open(path) as handle:
        return handle.read().strip()


def write(path, value):
    try:
        with open(path, "w") as handle:
            handle.write(value)
    except OSError as exc:
        raise Failure("write %s to %s failed: %s" % (value.strip() or "''", os.path.relpath(path, ROOT),
                                                     exc.strerror)) from None


def driver_of(path):
    link = os.path.join(path, "driver")
    return os.path.basename(os.readlink(link)) if os.path.islink(link) else None


def bind(bdf, driver):
    path = os.path.join(DEVICES, bdf)
    current = driver_of(path)
    if current == driver:
        return
    if current:
        write(os.path.join(DRIVERS, current, "unbind"), bdf)
    write(os.path.join(path, "driver_override"), driver if driver == "pci-pf-stub" else "\n")
    write(os.path.join(DRIVERS, driver, "bind"), bdf)


def set_vfs(bdf, enable):
    path = os.path.join(DEVICES, bdf)
    if not os.path.isdir(path):
        raise Failure("Device %s not found" % bdf)
    if not read(os.path.join(path, "class")).startswith("0x03"):
        raise Failure("%s is not a GPU" % bdf)
    if not os.path.exists(os.path.join(path, "sriov_numvfs")):
        raise Failure("GPU at %s does not support SR-IOV" % bdf)
    if not os.path.isdir(os.path.join(DRIVERS, "nvidia")):
        raise Failure("The NVIDIA driver is not loaded")
    numvfs = int(read(os.path.join(path, "sriov_numvfs")))
    if enable and numvfs:
        print("GPU at %s already has VFs enabled." % bdf)
        return
    if not enable and not numvfs:
        print("GPU at %s already has VFs disabled." % bdf)
        return
    print("%s VFs on %s" % ("Enabling" if enable else "Disabling", bdf))
    if not enable:
        for vf in virtfns(path):
            driver = driver_of(os.path.join(DEVICES, vf))
            if driver:
                write(os.path.join(DRIVERS, driver, "unbind"), vf)
    bind(bdf, "pci-pf-stub")
    write(os.path.join(path, "sriov_numvfs"), read(os.path.join(path, "sriov_totalvfs")) if enable else "0")
    bind(bdf, "nvidia")
    if enable:
        for vf in virtfns(path):
            if not driver_of(os.path.join(DEVICES, vf)):
                write(os.path.join(DRIVERS, "nvidia", "bind"), vf)


def virtfns(path):
    names = sorted((n for n in os.listdir(path) if n.startswith("virtfn")), key=lambda n: int(n[6:]))
    return [os.path.basename(os.readlink(os.path.join(path, n))) for n in names]


def all_gpus():
    result = []
    for bdf in sorted(os.listdir(DEVICES)):
        path = os.path.join(DEVICES, bdf)
        if (bdf.endswith(":00.0") and read(os.path.join(path, "vendor")) == "0x10de"
                and read(os.path.join(path, "class"))[:6] in ("0x0300", "0x0302")
                and os.path.exists(os.path.join(path, "sriov_totalvfs"))):
            result.append(bdf)
    return result


def main(argv):
    if len(argv) != 2 or argv[0] not in ("-e", "-d"):
        print("usage: sriov-manage <-e|-d> <ssss:bb:dd.f|ALL>", file=sys.stderr)
        return 0 if argv[:1] == ["-h"] else 1
    targets = all_gpus() if argv[1] == "ALL" else [argv[1].lower()]
    status = 0
    for bdf in targets:
        try:
            set_vfs(bdf, argv[0] == "-e")
        except Failure as exc:
            print("sriov-manage: %s" % exc, file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
