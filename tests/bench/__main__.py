"""python -m tests.bench [--quick] [--parts p1,p2,p3,p4,p5,p6,p7,p8,p9,p10,p11] [--out bench-results] [--runs-p1 N ...]

Every option also reads an environment variable (BENCH_QUICK=1, BENCH_PARTS, BENCH_RUNS_P1, ...,
BENCH_GPUS, BENCH_LATENCY_MS, BENCH_FLEET=4,16,32, BENCH_FORKS_RATIO, BENCH_OUT). Writes
<out>/bench.json and <out>/bench.md and prints the table. Exit status 1 when a measurement could
not be taken or did not do what it claims (a wrong layout, unexpected writes); missed targets are
reported in the table, not as a failure: they are goals, not timed tests.
"""

from __future__ import annotations

import argparse
import datetime
import os
import signal
import sys
import time

from tests.bench import REPO, pidns, report

PARTS = ("p1", "p2", "p3", "p4", "p5", "p6", "p7", "p8", "p9", "p10", "p11")
# parts that walk /proc on every apply: run again in their own pid namespace where this machine's walk is
# incomplete (tests/bench/pidns.py)
WALKING_PARTS = ("p1", "p2")
# P2 is the ratio of two ansible-playbook wall times a few seconds long, each moving about 15 % from run to
# run on a small VM: five alternating pairs (about 20 s more than three) keep the median off single outliers.
FULL = {"runs": {"p1": 5, "p2": 5, "p3": 5, "p4": 3, "p5": 5, "p6": 5, "p7": 3, "p8": 3, "p9": 3, "p10": 3, "p11": 1},
        "allocate_calls": 1000,
        "claims_p7": 128, "gpus": 8, "gpus_p3": 8, "gpus_p4": 1,
        "latency_ms": 1000, "fleet": "4,16,32", "forks_ratio": 4, "idle_p5": 30, "resync_p5": 10}
QUICK = {"runs": {"p1": 1, "p2": 1, "p3": 1, "p4": 1, "p5": 1, "p6": 1, "p7": 1, "p8": 1, "p9": 1, "p10": 1, "p11": 1},
         "allocate_calls": 100,
         "claims_p7": 8, "gpus": 2, "gpus_p3": 2, "gpus_p4": 1,
         "latency_ms": 300, "fleet": "1,2", "forks_ratio": 1, "idle_p5": 4, "resync_p5": 2}


def _env(name, default=None):
    return os.environ.get("BENCH_" + name.upper(), default)


def _int_list(text):
    values = [int(v) for v in str(text).split(",") if v.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("expected a comma-separated list of positive integers, not %r" % text)
    return values


def _positive(text):
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError("expected a positive integer, not %r" % text)
    return value


def _parts(text):
    chosen = [p.strip().lower() for p in str(text).split(",") if p.strip()]
    unknown = [p for p in chosen if p not in PARTS]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError("parts must be a comma-separated subset of %s" % ",".join(PARTS))
    return [p for p in PARTS if p in chosen]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tests.bench", description=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", default=_env("quick", "") not in ("", "0"),
                        help="smoke run: tiny cases, one run each (defaults below are for the full run)")
    parser.add_argument("--parts", type=_parts, default=_env("parts", ",".join(PARTS)),
                        help="which parts to run (default all: %s)" % ",".join(PARTS))
    parser.add_argument("--out", default=_env("out", os.path.join(REPO, "bench-results")),
                        help="output directory (default bench-results/)")
    for part in PARTS:
        parser.add_argument("--runs-" + part, type=_positive, default=_env("runs_" + part),
                            help="runs of %s (full: %d)" % (part.upper(), FULL["runs"][part]))
    parser.add_argument("--gpus", type=_positive, default=_env("gpus"), help="L40S GPUs for P1/P2/P7/P8/P9 (full: 8)")
    parser.add_argument("--gpus-p3", type=_positive, default=_env("gpus_p3"), help="L40S GPUs for P3 (full: 8)")
    parser.add_argument("--gpus-p4", type=_positive, default=_env("gpus_p4"), help="L40S GPUs per P4 host (full: 1)")
    parser.add_argument("--latency-ms", type=_positive, default=_env("latency_ms"),
                        help="P3 VF-enable latency per PF (full: 1000)")
    parser.add_argument("--fleet", type=_int_list, default=_env("fleet"), help="P4 fleet sizes (full: 4,16,32)")
    parser.add_argument("--forks-ratio", type=_positive, default=_env("forks_ratio"),
                        help="P4 hosts per fork (full: 4)")
    parser.add_argument("--idle-p5", type=_positive, default=_env("idle_p5"),
                        help="seconds P5 watches the idle agent (full: 30)")
    parser.add_argument("--resync-p5", type=_positive, default=_env("resync_p5"),
                        help="the idle agent's RESYNC_INTERVAL in P5 (full: 10)")
    parser.add_argument("--allocate-calls", type=_positive, default=_env("allocate_calls"),
                        help="Allocate calls P6 times (full: 1000)")
    parser.add_argument("--claims-p7", type=_positive, default=_env("claims_p7"),
                        help="ResourceClaims P7 prepares, one per vGPU (full: 128)")
    args = parser.parse_args(argv)
    defaults = QUICK if args.quick else FULL
    args.runs = dict((p, int(getattr(args, "runs_" + p) or defaults["runs"][p])) for p in PARTS)
    for name in ("gpus", "gpus_p3", "gpus_p4", "latency_ms", "forks_ratio", "idle_p5", "resync_p5", "allocate_calls", "claims_p7"):
        setattr(args, name, int(getattr(args, name) or defaults[name]))
    # argparse converts string defaults (from the environment) with `type` already
    args.fleet = sorted(args.fleet or _int_list(defaults["fleet"]))
    return args


def settings_dict(args):
    return {"quick": args.quick, "parts": args.parts, "runs": args.runs, "gpus": args.gpus,
            "gpus_p3": args.gpus_p3, "gpus_p4": args.gpus_p4, "latency_ms": args.latency_ms,
            "fleet": args.fleet, "forks_ratio": args.forks_ratio, "idle_p5": args.idle_p5,
            "resync_p5": args.resync_p5, "allocate_calls": args.allocate_calls, "claims_p7": args.claims_p7}


def _stop(signum, dummy_frame):
    # SIGTERM/SIGHUP unwind like Ctrl-C, so every gpusim mount is taken down on the way out.
    raise KeyboardInterrupt("signal %d" % signum)


def run_part(part, args):
    # Imported late: a part's imports (the engine, gpusim) fail with a clear traceback only when used.
    if part == "p1":
        from tests.bench import converge
        return converge.run(args)
    if part == "p3":
        from tests.bench import vf_enable
        return vf_enable.run(args)
    if part == "p5":
        from tests.bench import agent
        return agent.run(args)
    if part == "p6":
        from tests.bench import device_plugin
        return device_plugin.run(args)
    if part == "p7":
        from tests.bench import dra
        return dra.run(argparse.Namespace(gpus=args.gpus, claims=args.claims_p7, runs=args.runs["p7"]))
    if part == "p8":
        from tests.bench import manager_restart
        return manager_restart.run(args)
    if part == "p9":
        from tests.bench import claim_time
        return claim_time.run(argparse.Namespace(gpus=args.gpus, runs=args.runs["p9"]))
    if part == "p10":
        from tests.bench import whole_gpu
        return whole_gpu.run(argparse.Namespace(gpus=min(args.gpus, 2), runs=args.runs["p10"]))
    if part == "p11":
        from tests.bench import claim_time_mig
        return claim_time_mig.run(argparse.Namespace(gpus=args.gpus, runs=args.runs["p11"]))
    from tests.bench import playbooks
    return playbooks.run(args, part)


def main(argv=None):
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGHUP, _stop)
    started = time.monotonic()
    result = {"machine": report.machine(), "settings": settings_dict(args),
              "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "results": {}, "durations_s": {}}
    for part in args.parts:
        print("bench: %s ..." % part.upper(), file=sys.stderr, flush=True)
        part_start = time.monotonic()
        result["results"][part] = run_part(part, args)
        if part in WALKING_PARTS:
            own = pidns.again_in_own_pid_namespace(part, settings_dict(args))
            if own is not None:
                result["results"][part]["own_pid_namespace"] = own
        result["durations_s"][part] = round(time.monotonic() - part_start, 1)
        print("bench: %s done in %.0f s" % (part.upper(), result["durations_s"][part]), file=sys.stderr, flush=True)
    result["duration_s"] = round(time.monotonic() - started, 1)
    print(report.write(result, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
