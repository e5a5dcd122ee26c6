"""Fake nvidia-smi for a gpusim tree (standard library only, Python >= 3.6): the vGPU subset.

  nvidia-smi -q                          per GPU: "MIG Mode" (Current, Pending), "GPU Virtualization Mode",
                                         "vGPU Device Capability" (driver 580 layout)
  nvidia-smi vgpu [-i ID] -shm 0|1       set mixed-size (heterogeneous) mode
  nvidia-smi vgpu [-i ID] -ghm           get it
  nvidia-smi vgpu [-i ID] -s [-v]        supported vGPU types (names; with -v ID, FB, max instances,
                                         GI profile of MIG-backed types)
  nvidia-smi [-i ID] -mig 0|1            MIG mode
  nvidia-smi [-i ID] --query-gpu=pci.bus_id,name,mig.mode.current --format=csv[,noheader]
  nvidia-smi mig [-i ID] -lgip | -lgipp | -lgi
  nvidia-smi mig [-i ID] -cgi ID[:START][,...] [-C]  GPU instances (by profile ID or name, at placement START),
                                                  -C: with compute instances
  nvidia-smi mig [-i ID] -dci|-cci|-dgi [-gi ID[,ID...]]
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


def field(key, value, depth=0):
    """One `key : value` line of `nvidia-smi -q`: driver 580 pads the key to column 55
    (captures/nvidia-smi-q-h100-580.txt)."""
    return ("    " * depth + key).ljust(55) + ": " + value


def query(snapshot, gpus):
    """`nvidia-smi -q`, the lines the engine and the tests read, in the order and layout of driver 580
    (captures/nvidia-smi-q-h100-580.txt). No GPU reset is simulated, so MIG Pending is always Current."""
    lines = ["", "==============NVSMI LOG==============", "",
             field("Driver Version", snapshot["nvidia"]["version"]), "",
             field("Attached GPUs", "%d" % len(gpus))]
    for gpu in gpus:
        mig = ("Enabled" if gpu["mig_mode"] else "Disabled") if gpu["mig_supported"] else "N/A"
        vgpu_host = gpu["framework"] != "none"
        lines += ["GPU %s" % bus_id(gpu["address"]),
                  field("Product Name", gpu["product"], 1),
                  "    MIG Mode", field("Current", mig, 2), field("Pending", mig, 2),
                  "    GPU Virtualization Mode",
                  # a vGPU host's PF says "Host VGPU"; a GPU passed whole into a VM "Pass-Through" (capture)
                  field("Virtualization Mode", "Host VGPU" if vgpu_host else "Pass-Through", 2),
                  field("Host VGPU Mode", ("SR-IOV" if gpu["sriov"] else "Non SR-IOV") if vgpu_host else "N/A", 2),
                  field("vGPU Heterogeneous Mode",
                        ("Enabled" if gpu["mixed_size"] else "Disabled") if vgpu_host else "N/A", 2)]
        if vgpu_host:
            # ASSUMPTION: the section name and line as cubecos#1316 quotes them (not in the capture: no vGPU manager)
            lines += ["    vGPU Device Capability",
                      field("Heterogeneous Time-Slice Sizes",
                            "Supported" if gpu["mixed_size_supported"] else "Not Supported", 2)]
        lines.append("")
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
            if vgpu_type.get("gi_profile") is not None:
                lines += ["        GPU Instance Profile ID           : %d" % vgpu_type["gi_profile"],
                          "        Max Instances Per GI              : 1"]
    print("\n".join(lines))
    return 0


def control(command):
    with open(os.path.join(ROOT, ".gpusim", "ctl"), "w") as handle:
        handle.write(command)


def set_mode(gpus, value):
    for gpu in gpus:
        try:
            control("mixed %s %s" % (gpu["address"], value))
        except OSError as exc:
            reason = {errno.EBUSY: "In use by another client", errno.EOPNOTSUPP: "Not Supported"}.get(
                exc.errno, exc.strerror)
            print("Unable to set vGPU heterogeneous mode for GPU %s: %s" % (bus_id(gpu["address"]), reason))
            return 3 if exc.errno == errno.EOPNOTSUPP else 1
        print("vGPU heterogeneous mode %s for GPU %s." % ("enabled" if value == "1" else "disabled",
                                                          bus_id(gpu["address"])))
    return 0


# ---- MIG: wording and table layout after NVIDIA's MIG user guide examples (ASSUMPTION beyond the
# columns the engine reads: profile name, ID, free/total; GI name, profile ID, instance ID, start:size)
REASONS = {errno.EBUSY: "In use by another client", errno.EOPNOTSUPP: "Not Supported",
           errno.ENOSPC: "Insufficient Resources", errno.ENOENT: "Not Found",
           errno.EINVAL: "Invalid Argument"}


def _reason(exc):
    return REASONS.get(exc.errno, exc.strerror)


def set_mig(gpus, value):
    for gpu in gpus:
        try:
            control("mig %s %s" % (gpu["address"], value))
        except OSError as exc:
            print("Unable to %s MIG Mode for GPU %s: %s" % ("enable" if value == "1" else "disable",
                                                            bus_id(gpu["address"]), _reason(exc)))
            return 3 if exc.errno == errno.EOPNOTSUPP else 1
        print("%s MIG Mode for GPU %s" % ("Enabled" if value == "1" else "Disabled", bus_id(gpu["address"])))
    print("All done.")
    return 0


def query_gpu(gpus, fields, fmt):
    known = {"pci.bus_id": lambda g: bus_id(g["address"]), "name": lambda g: g["product"],
             "mig.mode.current": lambda g: ("Enabled" if g["mig_mode"] else "Disabled") if g["mig_supported"]
             else "[N/A]", "mig.mode.pending": lambda g: ("Enabled" if g["mig_mode"] else "Disabled")
             if g["mig_supported"] else "[N/A]"}
    unknown = [f for f in fields if f not in known]
    if unknown or not fmt.startswith("csv"):
        print('Field "%s" is not a valid field to query.' % (unknown[0] if unknown else fmt))
        return 2
    if "noheader" not in fmt:
        print(", ".join(fields))
    for gpu in gpus:
        print(", ".join(known[f](gpu) for f in fields))
    return 0


def mig_gpus(snapshot, gpus):
    """(index, gpu) of the selected GPUs; index as nvidia-smi numbers them (all GPUs bound to nvidia)."""
    every = [g["address"] for g in snapshot["pfs"] if g["driver"] == "nvidia"]
    return [(every.index(g["address"]), g) for g in gpus]


def list_profiles(pairs):
    """`nvidia-smi mig -lgip` as driver 580 prints it (captures/nvidia-smi-mig-lgip-h100.txt): every
    MIG-capable GPU, MIG mode on or off; Free/Total, memory GiB, SM DEC ENC / CE JPEG OFA per profile."""
    rule = "+" + "-" * 79 + "+"
    lines = [rule, "| GPU instance profiles:".ljust(80) + "|",
             "| GPU   Name               ID    Instances   Memory     P2P    SM    DEC   ENC  |",
             "|                                Free/Total   GiB              CE    JPEG  OFA  |", "|" + "=" * 79 + "|"]
    for index, gpu in pairs:
        for profile in gpu["gi_profiles"]:
            sm, dec, enc, ce, jpeg, ofa = profile["engines"]
            lines += ["|  %2d  MIG %-14s %3d     %d/%-8d %-10.2f No     %-6d %-5d %-4d|"
                      % (index, profile["name"], profile["id"], free_count(gpu, profile), profile["max_instances"],
                         profile["memory_gib"], sm, dec, enc),
                      "|" + " " * 63 + "%-6d%-6d%-4d|" % (ce, jpeg, ofa), rule]
    print("\n".join(lines))
    return 0


def free_count(gpu, profile):
    """How many more GIs of `profile` fit next to the existing ones (highest start, as the simulator places)."""
    taken = set()
    for gi in gpu["gis"]:
        taken |= set(range(gi["start"], gi["start"] + gi["size"]))
    compute = sum(p["compute_slices"] for gi in gpu["gis"] for p in gpu["gi_profiles"] if p["id"] == gi["profile"])
    count = sum(1 for gi in gpu["gis"] if gi["profile"] == profile["id"])
    free = 0
    while count + free < profile["max_instances"] and compute + profile["compute_slices"] <= 7:
        start = next((s for s in reversed(profile["starts"]) if not taken & set(range(s, s + profile["size"]))
                      and s + profile["size"] <= 8), None)
        if start is None:
            break
        taken |= set(range(start, start + profile["size"]))
        compute += profile["compute_slices"]
        free += 1
    return free


def list_placements(pairs):
    for index, gpu in pairs:
        if not gpu["mig_mode"]:
            continue
        for profile in gpu["gi_profiles"]:
            print("GPU %2d Profile ID %2d Placements: {%s}:%d"
                  % (index, profile["id"], ",".join(str(s) for s in profile["starts"]), profile["size"]))
    return 0


def list_instances(pairs):
    found = [(index, gi) for index, gpu in pairs if gpu["mig_mode"] for gi in gpu["gis"]]
    if not found:
        print("No GPU instances found: Not Found")
        return 6
    rule = "+" + "-" * 55 + "+"
    lines = [rule, "| GPU instances:" + " " * 40 + "|",
             "| GPU   Name             Profile  Instance   Placement  |",
             "|                          ID       ID       Start:Size |", "|" + "=" * 55 + "|"]
    for index, gi in found:
        lines += ["|  %2d  MIG %-13s %5d    %5d       %2d:%-2d     |"
                  % (index, gi["name"], gi["profile"], gi["id"], gi["start"], gi["size"]), rule]
    print("\n".join(lines))
    return 0


def _profile_id(gpu, text):
    for profile in gpu["gi_profiles"]:
        if text == str(profile["id"]) or text.lower() == profile["name"]:
            return profile["id"]
    return None


def create_instances(snapshot, pairs, items, with_ci):
    for index, gpu in pairs:
        if not gpu["mig_supported"] or not gpu["mig_mode"]:
            why = "Not Supported" if not gpu["mig_supported"] else "MIG mode is not enabled"
            print("Unable to create a GPU instance on GPU %2d: %s" % (index, why))
            return 3 if not gpu["mig_supported"] else 1
        for item in items:
            item, dummy, start = item.partition(":")     # `<ID>:<start>`: at that placement (the start index)
            profile_id = _profile_id(gpu, item)
            if profile_id is None or (start and not start.isdigit()):
                print("Unable to create a GPU instance on GPU %2d using profile %s: Invalid Argument" % (index, item))
                return 2
            before = {gi["id"] for gi in _gpu(gpu["address"])["gis"]}
            try:
                at = " " + start if start else ""
                control("gi-create %s %d %d%s" % (gpu["address"], profile_id, 1 if with_ci else 0, at))
            except OSError as exc:
                print("Unable to create a GPU instance on GPU %2d using profile %s: %s" % (index, item, _reason(exc)))
                return 1
            created = [gi for gi in _gpu(gpu["address"])["gis"] if gi["id"] not in before][0]
            print("Successfully created GPU instance ID %2d on GPU %2d using profile MIG %s (ID %2d)"
                  % (created["id"], index, created["name"], profile_id))
            if with_ci:
                print("Successfully created compute instance ID  0 on GPU %2d GPU instance ID %2d using profile "
                      "MIG %s (ID  0)" % (index, created["id"], created["name"]))
    return 0


def _gpu(address):
    return next(g for g in state()["pfs"] if g["address"] == address)


def instance_op(pairs, op, gi_ids):
    """-dci / -cci / -dgi on the listed GIs, or on every GI of the selected GPUs."""
    verbs = {"-dci": ("ci-destroy", "destroy compute instance", "Successfully destroyed compute instance ID  0 from "
                      "GPU instance ID %2d"),
             "-cci": ("ci-create", "create compute instance", "Successfully created compute instance ID  0 on GPU "
                      "instance ID %2d"),
             "-dgi": ("gi-destroy", "destroy GPU instance", "Successfully destroyed GPU instance ID %2d")}
    command, what, done = verbs[op]
    for index, gpu in pairs:
        targets = gi_ids if gi_ids is not None else [gi["id"] for gi in gpu["gis"]]
        if op == "-dci" and gi_ids is None:
            targets = [gi["id"] for gi in gpu["gis"] if gi["compute_instance"]]
        if not targets:
            print("No %s found: Not Found" % ("GPU instances" if op == "-dgi" else "compute instances"))
            return 6
        for gi_id in targets:
            try:
                control("%s %s %d" % (command, gpu["address"], gi_id))
            except OSError as exc:
                print("Unable to %s ID %2d from GPU %2d: %s" % (what, gi_id, index, _reason(exc)))
                return 1
            print((done % gi_id) + " from GPU %2d" % index)
    return 0


def mig(snapshot, gpus, args):
    pairs = mig_gpus(snapshot, gpus)
    if args == ["-lgip"]:
        return list_profiles(pairs)
    if args == ["-lgipp"]:
        return list_placements(pairs)
    if args == ["-lgi"]:
        return list_instances(pairs)
    if args[:1] == ["-cgi"] and len(args) in (2, 3) and args[2:] in ([], ["-C"]):
        return create_instances(snapshot, pairs, [a for a in args[1].split(",") if a], args[2:] == ["-C"])
    if args[:1] in (["-dci"], ["-cci"], ["-dgi"]) and len(args) in (1, 3) and args[1:2] in ([], ["-gi"]):
        ids = None
        if len(args) == 3:
            if not all(part.isdigit() for part in args[2].split(",")):
                print("Invalid GPU instance ID %s" % args[2])
                return 2
            ids = [int(part) for part in args[2].split(",")]
        return instance_op(pairs, args[0], ids)
    return None


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
    if len(args) == 2 and args[0] == "-mig" and args[1] in ("0", "1"):
        return set_mig(gpus, args[1])
    queries = [a for a in args if a.startswith("--query-gpu=")]
    formats = [a for a in args if a.startswith("--format=")]
    if queries and len(args) == len(queries) + len(formats) == 2:
        return query_gpu(gpus, queries[0].split("=", 1)[1].split(","), formats[0].split("=", 1)[1] if formats else "")
    if args[:1] == ["mig"]:
        result = mig(snapshot, gpus, args[1:])
        if result is not None:
            return result
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
          "vgpu [-i ID] -ghm, vgpu [-i ID] -s [-v], -mig 0|1, --query-gpu=..., mig -lgip|-lgipp|-lgi|-cgi|-dci|"
          "-cci|-dgi" % " ".join(argv), file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
