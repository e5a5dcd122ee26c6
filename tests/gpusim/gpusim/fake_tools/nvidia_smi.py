"""Fake nvidia-smi for a gpusim tree (standard library only, Python >= 3.6): the vGPU subset.

  nvidia-smi -q                          per GPU, includes "vGPU Heterogeneous Mode : Enabled|Disabled"
  nvidia-smi vgpu [-i ID] -shm 0|1       set mixed-size (heterogeneous) mode
  nvidia-smi vgpu [-i ID] -ghm           get it
  nvidia-smi vgpu [-i ID] -s [-v]        supported vGPU types (names; with -v ID, FB, max instances)
ID = index, PCI address (0000:41:00.0, 00000000:41:00.0, 41:00.0). Acts on $GPUSIM_ROOT (default /sys)
through ROOT/.gpusim/state.json (read) and ROOT/.gpusim/ctl (write). GPUs are the NVIDIA PFs bound
to nvidia, in PCI order. Output wording beyond the mode line is an ASSUMPTION.
Exit codes as nvidia-smi documents them: 2 invalid argument, 3 not supported, 6 not found,
9 driver not loaded, 1 other.
"""

import errno
import json
import os
import sys

ROOT = os.environ.get("GPUSIM_ROOT", "/sys")
NO_DRIVER = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
             "Make sure that the latest NVIDIA driver is installed and running.")


def state():
    with open(os.path.join(ROOT, ".gpusim", "state.json")) as handle:
        return json.load(handle)


def bus_id(address):
    return "0000" + address.upper()


def select(gpus, ident):
    if ident is None:
        return gpus
    if ident.isdigit():
        index = int(ident)
        return [gpus[index]] if index < len(gpus) else []
    short = ident.lower()[-7:]
    return [gpu for gpu in gpus if gpu["address"].endswith(short)]


def query(snapshot, gpus):
    lines = ["", "==============NVSMI LOG==============", "",
             "Driver Version                            : %s" % snapshot["nvidia"]["version"], "",
             "Attached GPUs                             : %d" % len(gpus)]
    for gpu in gpus:
        lines += ["GPU %s" % bus_id(gpu["address"]),
                  "    Product Name                          : %s" % gpu["product"],
                  "    vGPU Device Capability",
                  "        Heterogeneous Time-Slice Sizes    : %s"
                  % ("Supported" if gpu["mixed_size_supported"] else "Not Supported"),
                  "    vGPU Heterogeneous Mode               : %s"
                  % ("Enabled" if gpu["mixed_size"] else "Disabled"), ""]
    print("\n".join(lines))
    return 0


def supported(gpus, verbose):
    """Layout of `nvidia-smi vgpu -s [-v]` as far as known (ASSUMPTION: field set and order)."""
    lines = []
    for gpu in gpus:
        vendor, device = gpu["pci_id"].split(":")
        lines.append("GPU %s" % bus_id(gpu["address"]))
        for vgpu_type in gpu["types"]:
            if not verbose:
                lines.append("    %s" % vgpu_type["name"])
                continue
            lines += ["    vGPU Type ID                          : 0x%x" % vgpu_type["id"],
                      "        Name                              : %s" % vgpu_type["name"],
                      "        Max Instances                     : %d" % vgpu_type["max_instances"],
                      "        Device ID                         : 0x%s%s" % (device, vendor),
                      "        FB Memory                         : %d MiB" % (vgpu_type["framebuffer_gib"] * 1024)]
    print("\n".join(lines))
    return 0


def set_mode(gpus, value):
    for gpu in gpus:
        try:
            with open(os.path.join(ROOT, ".gpusim", "ctl"), "w") as handle:
                handle.write("mixed %s %s" % (gpu["address"], value))
        except OSError as exc:
            reason = {errno.EBUSY: "In use by another client", errno.EOPNOTSUPP: "Not Supported"}.get(
                exc.errno, exc.strerror)
            print("Unable to set vGPU heterogeneous mode for GPU %s: %s" % (bus_id(gpu["address"]), reason))
            return 3 if exc.errno == errno.EOPNOTSUPP else 1
        print("vGPU heterogeneous mode %s for GPU %s." % ("enabled" if value == "1" else "disabled",
                                                          bus_id(gpu["address"])))
    return 0


def main(argv):
    try:
        snapshot = state()
    except (OSError, ValueError):
        print("nvidia-smi (gpusim): no simulator at %s (set GPUSIM_ROOT)" % ROOT, file=sys.stderr)
        return 9
    if not snapshot["nvidia"]["loaded"]:
        print(NO_DRIVER)
        return 9
    gpus = [gpu for gpu in snapshot["pfs"] if gpu["driver"] == "nvidia"]
    args = list(argv)
    ident = None
    if "-i" in args:
        position = args.index("-i")
        if position + 1 >= len(args):
            print("Option -i requires an argument")
            return 2
        ident = args.pop(position + 1)
        args.pop(position)
        gpus = select(gpus, ident)
        if not gpus:
            print("No devices were found matching %s" % ident)
            return 6
    if args == ["-q"]:
        return query(snapshot, gpus)
    if args[:1] == ["vgpu"] and args[1:] == ["-ghm"]:
        for gpu in gpus:
            print("GPU %s\n    vGPU Heterogeneous Mode : %s" % (bus_id(gpu["address"]),
                                                                "Enabled" if gpu["mixed_size"] else "Disabled"))
        return 0
    if args[:1] == ["vgpu"] and len(args) == 3 and args[1] == "-shm" and args[2] in ("0", "1"):
        return set_mode(gpus, args[2])
    if args[:1] == ["vgpu"] and args[1:] in (["-s"], ["-s", "-v"], ["-v", "-s"]):
        return supported(gpus, "-v" in args)
    print("nvidia-smi (gpusim): unsupported arguments %s; supported: -q, vgpu [-i ID] -shm 0|1, "
          "vgpu [-i ID] -ghm, vgpu [-i ID] -s [-v]" % " ".join(argv), file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
