"""A part again in a pid namespace of its own, where this machine's /proc cannot be walked completely.

In a sandbox whose pid 1 cannot be inspected (or under hidepid) every walk of /proc is incomplete, so every
apply also asks the kernel about each VFIO group in its scope (node/holders/inuse.py: unsure = held); a module or an
agent running as root on a node walks every process. `unshare --pid --fork --mount-proc` (root) gives the part
that walk: the same code, the same gpusim nodes, a /proc that shows only the bench's own processes. Both
results are reported, each with the walk it had.

    python -m tests.bench.pidns PART < settings.json     (the child: prints {"scan", "result"} as JSON)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys

from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import inuse
from tests.bench import REPO, simnodes


def scan_state(proc_root="/proc"):
    """'complete', or why a walk of this machine's /proc is not."""
    scan = inuse.ProcessScan(proc_root)
    if not scan.incomplete:
        return "complete"
    pids = sorted(scan.uninspectable)
    return "incomplete (%s)" % ("pid %s not inspectable" % ", ".join(str(p) for p in pids[:3]) if pids else scan.hidden)


def again_in_own_pid_namespace(part, settings):
    """None where this machine's walk is complete; else {"scan", "result"} of `part` run in a new pid namespace
    with `settings` (the bench's settings dict), or {"skipped": why}."""
    if scan_state() == "complete":
        return None
    unshare = shutil.which("unshare")
    if os.geteuid() != 0 or unshare is None:
        return {"skipped": "needs root and unshare(1)"}
    argv = [unshare, "--pid", "--fork", "--mount-proc", sys.executable, "-m", "tests.bench.pidns", part]
    proc = subprocess.run(argv, cwd=REPO, input=json.dumps(settings), capture_output=True, text=True, check=False,
                          timeout=3600)
    if proc.returncode != 0:
        raise simnodes.BenchError("%s in its own pid namespace failed: %s" % (part.upper(), proc.stderr.strip()[-2000:]))
    return json.loads(proc.stdout)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    from tests.bench.__main__ import run_part    # the parent's own dispatch, imported late (it imports this module)
    settings = argparse.Namespace(**json.load(sys.stdin))
    result = {"scan": scan_state(), "result": run_part(argv[0], settings)}
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
