"""gpusim command line: up, down, models, ctl, log, tools."""

from __future__ import annotations

import argparse
import json
import os
import sys

from gpusim import daemon, tools
from gpusim.layout import SpecError
from gpusim.models import DEFAULT_DRIVER_VERSION, MODELS


def _parser():
    parser = argparse.ArgumentParser(prog="gpusim", description="Simulated GPU node: a FUSE /sys tree.")
    sub = parser.add_subparsers(dest="command", required=True)

    p_up = sub.add_parser("up", help="mount a simulated sysfs at ROOT")
    p_up.add_argument("root")
    p_up.add_argument("--gpus", required=True, metavar="SPEC", help="e.g. l40s:2,t4:1,nic:1")
    p_up.add_argument("--vf-enable-latency-ms", type=int, default=0, metavar="N")
    p_up.add_argument("--driver-version", default=DEFAULT_DRIVER_VERSION)
    p_up.add_argument("--foreground", action="store_true", help="serve in this process")

    p_down = sub.add_parser("down", help="unmount ROOT, stop its server and holders")
    p_down.add_argument("root")

    p_models = sub.add_parser("models", help="print the model catalogue")
    p_models.add_argument("--json", action="store_true")

    p_ctl = sub.add_parser("ctl", help="control a running simulator")
    p_ctl.add_argument("root")
    ctl = p_ctl.add_subparsers(dest="action", required=True)
    for name in ("hold", "release"):
        ctl.add_parser(name, help="a VM opens/closes the VFIO device").add_argument("device")
    ctl.add_parser("reboot", help="VFs, types, mdevs vanish (driver stays loaded)")
    ctl.add_parser("manager-restart", help="the vGPU manager restarts: GPUs stay bound, all VFs again, no types")
    p_fail = ctl.add_parser("fail-next", help="the next write to RELPATH fails with ERRNO")
    p_fail.add_argument("relpath")
    p_fail.add_argument("errno")
    p_driver = ctl.add_parser("driver", help="unload or load the nvidia module")
    p_driver.add_argument("operation", choices=["unload", "load"])
    p_driver.add_argument("--version")
    p_mixed = ctl.add_parser("mixed", help="vGPU heterogeneous mode of a GPU (as nvidia-smi vgpu -shm)")
    p_mixed.add_argument("pf")
    p_mixed.add_argument("enable", choices=["0", "1"])
    p_mig = ctl.add_parser("mig", help="MIG mode of a GPU (as nvidia-smi -i PF -mig)")
    p_mig.add_argument("pf")
    p_mig.add_argument("enable", choices=["0", "1"])

    p_block = ctl.add_parser("block-timeout", help="how long a write blocked on a held device waits (the kernel: "
                                                   "for ever) before it fails with ETIMEDOUT; default 3")
    p_block.add_argument("seconds", type=float)

    p_log = sub.add_parser("log", help="print the write log as JSON lines")
    p_log.add_argument("root")
    p_log.add_argument("--clear", action="store_true", help="print, then empty the log")

    p_tools = sub.add_parser("tools", help="write the fake sriov-manage and nvidia-smi into DIR")
    p_tools.add_argument("dir")
    return parser


def models_table():
    """One line per model; types as NAME=ID x MAX-PER-GPU."""
    rows = [("MODEL", "PCI ID", "FRAMEWORK", "GPUS", "VFS", "OFFSET/STRIDE", "FB", "TYPES")]
    for model in MODELS.values():
        types = ", ".join("%s=%dx%d" % (t.short_name, t.type_id, t.max_instances) for t in model.all_types) or "-"
        rows.append((model.key, model.pci_id, model.framework, str(model.gpus_per_board), str(model.total_vfs),
                     "%d/%d" % (model.vf_offset, model.vf_stride) if model.sriov else "-",
                     "%dG" % model.framebuffer_gib if model.framebuffer_gib else "-", types))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[-1]
                     for row in rows)


def models_json():
    return json.dumps({key: {"product": m.product, "pci_id": m.pci_id, "class": m.pci_class,
                             "framework": m.framework, "driver": m.driver, "total_vfs": m.total_vfs,
                             "vf_offset": m.vf_offset, "vf_stride": m.vf_stride, "gpus_per_board": m.gpus_per_board,
                             "framebuffer_gib": m.framebuffer_gib, "mixed_size": m.mixed_size,
                             "types": [{"id": t.type_id, "name": t.name, "framebuffer_gib": t.framebuffer_gib,
                                        "max_instances": t.max_instances, "gi_profile": t.gi_profile}
                                       for t in m.all_types],
                             "gi_profiles": [{"id": p.profile_id, "name": p.name, "placements": list(p.starts),
                                              "size": p.size, "max_instances": p.max_instances}
                                             for p in m.gi_profiles],
                             "sources": m.sources} for key, m in MODELS.items()}, indent=1)


def _ctl(args):
    root = args.root
    if args.action == "hold":
        print(daemon.hold(root, args.device))
    elif args.action == "release":
        daemon.release(root, args.device)
    elif args.action == "reboot":
        daemon.kill_holders(root)        # VMs do not survive a reboot
        daemon.control(root, "reboot")
    elif args.action == "manager-restart":
        daemon.control(root, "manager-restart")
    elif args.action == "fail-next":
        daemon.control(root, "fail-next %s %s" % (args.relpath, args.errno))
    elif args.action == "driver":
        daemon.control(root, "driver %s%s" % (args.operation, " " + args.version if args.version else ""))
    elif args.action in ("mixed", "mig"):
        daemon.control(root, "%s %s %s" % (args.action, args.pf, args.enable))
    elif args.action == "block-timeout":
        daemon.control(root, "block-timeout %s" % args.seconds)


def run(argv=None):
    args = _parser().parse_args(argv)
    if args.command == "up":
        if args.foreground:
            daemon.serve_foreground(args.root, args.gpus, args.vf_enable_latency_ms, args.driver_version)
        else:
            daemon.up(args.root, args.gpus, args.vf_enable_latency_ms, args.driver_version)
    elif args.command == "down":
        daemon.down(args.root)
    elif args.command == "models":
        print(models_json() if args.json else models_table())
    elif args.command == "ctl":
        _ctl(args)
    elif args.command == "log":
        with open(os.path.join(args.root, ".gpusim", "log")) as handle:
            sys.stdout.write(handle.read())
        if args.clear:
            daemon.control(args.root, "clear-log")
    elif args.command == "tools":
        for path in tools.install(args.dir):
            print(path)


def main(argv=None):
    try:
        run(argv)
    except (daemon.GpuSimError, SpecError) as exc:
        sys.exit("gpusim: %s" % exc)
    except OSError as exc:
        sys.exit("gpusim: %s: %s" % (exc.filename or "", exc.strerror))


if __name__ == "__main__":
    main()
