# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""`accelops-vgpu`: the node CLI (boot-time unit, vGPU manager image entrypoint), stdlib only.

    accelops-vgpu apply  --config FILE [--selected NAME] [--agent-applied FILE] [--mixed-size] [--check] [--json]
                         [--lock-timeout S] [--wait-timeout S] [--sriov-manage PATH]
                         [--retry-for S] [--state-file FILE]
    accelops-vgpu assert --config FILE [--selected NAME] [--agent-applied FILE]
    accelops-vgpu export [--format layout|vdm]
    accelops-vgpu idle [--then COMMAND...]      (exit 0: nothing uses the vGPU stack; 1: something does)
    accelops-vgpu agent  [--node-name ... ]     (in-cluster node agent; `agent --help` lists its settings)

The node agent is in the agent CLI only (the node agent image's, cli_zipapp.py): the node CLI that
vgpu_profile installs for the boot unit carries the node engine alone, and its `agent` exits 2 in one line.

FILE (`-` = stdin) is a vgpu-device-manager config (`version: v1`, `vgpu-configs`) or a layout
list (`[{devices, device_filter, profiles}]`, optionally under a `layout:` key), JSON or YAML when
PyYAML is importable. `apply` first enables the maximum number of VFs on selected SR-IOV GPUs that
have none (sriov-manage when present), then programs the profiles; a GPU passed through (bound to
vfio-pci, or to another driver than nvidia) is skipped and printed as such, naming one in the layout is
an error, and --take-over ADDRESS lets apply rebind it (node/holders/pf_driver.py); --wait-timeout (default 120 s)
bounds the wait for those VFs, separately from --lock-timeout (the wait for another apply's node
lock). --sriov-manage names the tool when it is not /usr/lib/nvidia/sriov-manage or on PATH (GPU
Operator nodes: /run/nvidia/driver/usr/lib/nvidia/sriov-manage). `assert` exits 0 when the node
matches, 1 (printing each difference) when not. `idle` exits 0 when no process holds a VF or mdev of
an NVIDIA GPU and nvidia_vgpu_vfio has no users, 1 (printing each holder) when something does: what
the vGPU manager image asks before it disables VFs or unloads the driver (vgpu_busy.users, the same
answer vgpu_driver uses). Errors exit 2 with one line on stderr (for `idle`: cannot tell, treat as held).
`idle --then COMMAND...` asks under the node lock (the key the modules, the boot unit and the agent use)
and runs COMMAND before letting go when nothing uses the stack: the manager image's stop, whose VF
disable must not race an apply or a claim being prepared.
Roots: --sysfs-root/--dev-root/--proc-root (defaults /sys, /dev, /proc); a missing root, or a sysfs root
without bus/pci/devices, is an error (exit 2), never an empty node.
--agent-applied names the file the node agent writes after each apply (handover.py): while it exists
it is the layout and --config/--selected are not read (the agent owns the node). --retry-for S retries
a failing apply with backoff for up to S seconds (not a broken layout), --state-file records each
outcome as JSON (boot_retry.py): what the boot unit runs.
Environment defaults: ACCELOPS_VGPU_CONFIG, ACCELOPS_VGPU_SELECTED, ACCELOPS_VGPU_AGENT_APPLIED,
ACCELOPS_VGPU_RETRY_FOR, ACCELOPS_VGPU_STATE_FILE (the boot unit sets the last two).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys

from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw import pci
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import kubelet_holders, vgpu_busy
from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout import vgpu_layout
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import mig, vgpu_apply
from ansible_collections.accelops.vgpu.plugins.module_utils.node.boot import boot_retry, handover
from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError, one_line
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders.node_lock import node_lock
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders.roots import check_kubelet_dir, check_roots
from ansible_collections.accelops.vgpu.plugins.module_utils.runner import CommandRunner
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import Sysfs

PROG = "accelops-vgpu"
# Imported by name when the verb is `agent`: Ansible's module packer follows every import statement
# (ansible-core lib/ansible/executor/module_common.py, ModuleDepFinder), so an import here would ship and
# parse the agent and the kubelet plugins with every module that installs this CLI (cli_zipapp.py).
AGENT_PACKAGE = "ansible_collections.accelops.vgpu.plugins.module_utils.agent"
EXIT_OK, EXIT_DIFFERS, EXIT_ERROR = 0, 1, 2


def _say(text, stream=None):
    """One line of output (the CLI's own channel; modules never import this file)."""
    (stream or sys.stdout).write(text + "\n")


def _positive_seconds(text):
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError("%r is not a positive number of seconds" % text)
    return value


def _parser():
    roots = argparse.ArgumentParser(add_help=False)
    roots.add_argument("--sysfs-root", default="/sys", help="node sysfs (default /sys)")
    roots.add_argument("--dev-root", default="/dev", help="node /dev, for VFIO device nodes (default /dev)")
    roots.add_argument("--proc-root", default="/proc", help="node /proc, to find open VFIO handles (default /proc)")
    roots.add_argument("--kubelet-dir", default=os.environ.get("KUBELET_DIR") or None,
                       help="the kubelet's root directory: vGPUs of DRA claims prepared there "
                            "(plugins/vgpu.accelops.io/checkpoint.json) count as held; one given must exist "
                            "(env KUBELET_DIR, default /var/lib/kubelet, which may be absent)")
    roots.add_argument("--json", action="store_true", help="print the result as JSON")
    layout = argparse.ArgumentParser(add_help=False)
    layout.add_argument("--config", "-f", default=os.environ.get("ACCELOPS_VGPU_CONFIG"),
                        help="vgpu-device-manager config or layout file, - for stdin (env ACCELOPS_VGPU_CONFIG)")
    layout.add_argument("--selected", "-c", default=os.environ.get("ACCELOPS_VGPU_SELECTED"),
                        help="config name in a vgpu-device-manager file (env ACCELOPS_VGPU_SELECTED)")
    layout.add_argument("--agent-applied", metavar="FILE", default=os.environ.get("ACCELOPS_VGPU_AGENT_APPLIED"),
                        help="the node agent's last applied config; when the file exists it wins over --config "
                             "and --selected (env ACCELOPS_VGPU_AGENT_APPLIED)")
    parser = argparse.ArgumentParser(prog=PROG, description="Program NVIDIA vGPU profiles on this node.")
    verbs = parser.add_subparsers(dest="verb", metavar="{apply,assert,export,idle,agent}")
    verbs.required = True
    apply_p = verbs.add_parser("apply", parents=[roots, layout], help="enable VFs and program the layout")
    apply_p.add_argument("--mixed-size", action="store_true", help="allow different framebuffer sizes per GPU")
    apply_p.add_argument("--check", action="store_true", help="plan and validate only, write nothing")
    apply_p.add_argument("--state", choices=vgpu_apply.STATES, default="present",
                         help="absent removes the selected GPUs' vGPUs that no VM holds")
    apply_p.add_argument("--lock-timeout", type=float, default=120.0, help="seconds to wait for the node lock")
    apply_p.add_argument("--wait-timeout", type=_positive_seconds, default=vgpu_apply.WAIT_TIMEOUT,
                         help="seconds enabled VFs may take to appear (default 120); a PF that loses its driver "
                              "fails at once")
    apply_p.add_argument("--sriov-manage", metavar="PATH", default=None,
                         help="sriov-manage to enable VFs with (default: /usr/lib/nvidia/sriov-manage, then PATH; "
                              "GPU Operator nodes: /run/nvidia/driver/usr/lib/nvidia/sriov-manage)")
    apply_p.add_argument("--no-enable-vfs", dest="enable_vfs", action="store_false",
                         help="fail instead of enabling VFs on GPUs that have none")
    apply_p.add_argument("--take-over", metavar="PCI_ADDRESS", action="append", default=[],
                         help="a GPU passed through (bound to vfio-pci or another driver than nvidia) that apply may "
                              "rebind to nvidia anyway, unless a VM holds it; repeatable (default: such GPUs are "
                              "skipped, and naming one in the layout is an error)")
    apply_p.add_argument("--retry-for", type=float, default=os.environ.get("ACCELOPS_VGPU_RETRY_FOR") or "0",
                         metavar="S", help="retry a failing apply with backoff (2 s doubling, at most 60 s) for up to "
                                           "S seconds; a broken layout is not retried (default 0: once; env "
                                           "ACCELOPS_VGPU_RETRY_FOR)")
    apply_p.add_argument("--state-file", metavar="FILE", default=os.environ.get("ACCELOPS_VGPU_STATE_FILE"),
                         help="write each outcome (applied/retrying/failed, attempts, error) as JSON to FILE "
                              "(env ACCELOPS_VGPU_STATE_FILE)")
    _mig_options(apply_p)
    _mig_options(verbs.add_parser("assert", parents=[roots, layout], help="exit 0 when the node matches the layout"))
    export_p = verbs.add_parser("export", parents=[roots], help="print the current layout")
    export_p.add_argument("--format", choices=("layout", "vdm"), default="layout",
                          help="a layout list (default) or a vgpu-device-manager config")
    idle_p = verbs.add_parser("idle", parents=[roots],
                              help="exit 0 when no VM holds an NVIDIA VF/mdev and nvidia_vgpu_vfio has no users, else 1")
    idle_p.add_argument("--then", nargs=argparse.REMAINDER, metavar="COMMAND",
                        help="take the node lock, and when nothing uses the vGPU stack run COMMAND (the rest of the "
                             "line) before letting it go: exit 0 when it ran and succeeded, 1 in use (not run), 2 when "
                             "it failed (the manager image's stop: the check and the VF disable as one step)")
    idle_p.add_argument("--lock-timeout", type=float, default=120.0,
                        help="with --then, seconds to wait for the node lock (default 120)")
    # listed only: main() hands everything after `agent` to the agent's own parser (cmd_agent)
    verbs.add_parser("agent", help="in-cluster node agent (vgpu-device-manager's label protocol; "
                                   "`agent --help` lists its settings)")
    return parser


def _agent_modules():
    """(agent.agent, agent.settings); EngineError when this CLI has no agent package (the node CLI)."""
    try:
        return tuple(importlib.import_module(AGENT_PACKAGE + name) for name in (".agent", ".settings"))
    except ModuleNotFoundError as err:
        if err.name not in (AGENT_PACKAGE, AGENT_PACKAGE + ".agent", AGENT_PACKAGE + ".settings"):
            raise    # a module the agent imports is missing: not this CLI's flavour, a real error
        raise EngineError("this node CLI has no node agent: the agent runs from its image "
                          "(accelops.vgpu.agent_image; the vgpu_node_agent role deploys it)") from None


def cmd_agent(argv):
    agent, agent_settings = _agent_modules()
    parser = argparse.ArgumentParser(prog=PROG + " agent", description=agent.DESCRIPTION)
    agent_settings.add_arguments(parser)
    return agent.main(parser.parse_args(argv))


def _mig_options(parser):
    """MIG-backed vGPU: the unconfirmed steps as options (docs/design.md, MIG-backed vGPU)."""
    parser.add_argument("--mig-mode-order", choices=mig.MODE_ORDERS, default="after-vfs",
                        help="MIG mode after the VFs are enabled (default) or before")
    parser.add_argument("--no-mig-compute-instances", dest="mig_compute_instances", action="store_false",
                        help="create GPU instances without a compute instance (no -C)")
    parser.add_argument("--mig-gi-cleanup", choices=mig.GI_CLEANUPS, default="destroy",
                        help="destroy GPU instances the layout no longer needs (default) or keep them")


def _node(args):
    check_roots(args.sysfs_root, args.dev_root, args.proc_root)
    options = mig.MigOptions(args.mig_mode_order, args.mig_compute_instances, args.mig_gi_cleanup) \
        if hasattr(args, "mig_mode_order") else None
    return vgpu_apply.NodeEngine(Sysfs(args.sysfs_root), CommandRunner(), args.dev_root, args.proc_root,
                                 sriov_manage_path=getattr(args, "sriov_manage", None), mig_options=options,
                                 kubelet_dir=check_kubelet_dir(args.kubelet_dir),
                                 take_over=_addresses(getattr(args, "take_over", ())))


def _addresses(items):
    try:
        return tuple(pci.parse_address(item) for item in items)
    except pci.PciAddressError as err:
        raise vgpu_layout.LayoutError("--take-over: %s" % err) from None


def _entries(args):
    if handover.applied_by_agent(args.agent_applied):
        _say("%s: applying the node agent's last applied config from %s (the agent owns this node)"
             % (PROG, args.agent_applied), sys.stderr)
        return vgpu_layout.from_file(args.agent_applied)
    if not args.config:
        raise vgpu_layout.LayoutError("--config FILE is required (or ACCELOPS_VGPU_CONFIG)")
    return vgpu_layout.from_file(args.config, args.selected)


def _print_apply(result, check):
    verb = "would change" if check else "changed"
    for address in result["vfs_enabled"]:
        _say("%s: enabled SR-IOV VFs" % address)
    for gpu in result["gpus"]:
        moved = [v for v in gpu["vgpus"] if v["before"] != v["after"]]
        mig_diff = result["diff"]["after"].get(gpu["address"], {}).get("mig")
        if mig_diff:
            instances = ", ".join(mig_diff["gpu_instances"]) or "none"
            _say("%s (%s): %s MIG mode %s, GPU instances %s"
                 % (gpu["address"], gpu["model"], verb, mig_diff["mode"], instances))
        pending = result["diff"]["after"].get(gpu["address"], {})
        if gpu["framework"] is None and pending.get("vfs") == "enabled":   # planned before its VFs exist
            _say("%s (%s): awaits SR-IOV VFs: %s enable them, then create %s" % (
                gpu["address"], gpu["model"], "would" if check else "will",
                _counts_text(pending.get("profiles") or {})))
            continue
        if not moved:
            _say("%s (%s, %s): unchanged" % (gpu["address"], gpu["model"], gpu["framework"]))
            continue
        _say("%s (%s, %s): %s %d vGPU slot(s)" % (gpu["address"], gpu["model"], gpu["framework"], verb, len(moved)))
        for vgpu in moved:
            slot = vgpu["address"] + ("/" + vgpu["uuid"] if vgpu.get("uuid") else "")
            _say("  %s: %s -> %s" % (slot, vgpu["before"] or "-", vgpu["after"] or "-"))
    for gpu in result.get("claim_time") or ():
        if gpu.get("reserved"):
            continue    # a warning says why (passed through)
        if gpu.get("held_whole"):
            _say("%s (%s, claim-time): given whole to %s (on vfio-pci, VFs off; step %s): left alone" % (
                gpu["address"], gpu["model"] or "unknown model", gpu["held_whole"]["by"], gpu["held_whole"]["step"]))
            continue
        if not gpu["vfs"]:
            enabling = result["diff"]["after"].get(gpu["address"], {}).get("vfs") == "enabled"
            _say("%s (%s, claim-time): awaits SR-IOV VFs: %s" % (
                gpu["address"], gpu["model"] or "unknown model",
                "would enable them" if enabling else "offers no vGPU until they are enabled"))
        else:
            offered = ", ".join("%s (up to %d)" % (p["profile"], p["max_instances"]) for p in gpu["profiles"])
            _say("%s (%s, claim-time): offers %s; DRA claims type its VFs"
                 % (gpu["address"], gpu["model"], offered or "nothing"))
    for warning in result["warnings"]:
        _say("warning: %s" % warning, sys.stderr)


def _counts_text(profiles):
    return ", ".join("%d x %s" % (count, profile) for profile, count in profiles.items()) or "no vGPUs"


def cmd_apply(args):
    def once():
        return vgpu_apply.apply(_node(args), _entries(args), state=args.state, mixed_size=args.mixed_size,
                                check_mode=args.check, lock_timeout=args.lock_timeout, enable_vfs=args.enable_vfs,
                                wait_timeout=args.wait_timeout)

    if args.retry_for > 0 or args.state_file:
        source = args.agent_applied if handover.applied_by_agent(args.agent_applied) else args.config
        result = boot_retry.run(once, args.retry_for, lambda line: _say("%s apply: %s" % (PROG, line), sys.stderr),
                                args.state_file, source)
    else:
        result = once()
    if args.json:
        _say(json.dumps(result, indent=2))
    else:
        _print_apply(result, args.check)
    return EXIT_OK


def cmd_assert(args):
    problems = vgpu_apply.check(_node(args), _entries(args))
    if args.json:
        _say(json.dumps({"matches": not problems, "differences": problems}, indent=2))
    else:
        for problem in problems:
            _say(problem)
        if not problems:
            _say("the node matches the layout")
    return EXIT_DIFFERS if problems else EXIT_OK


def cmd_export(args):
    node = _node(args)
    current = vgpu_apply.export(node)
    if args.format == "vdm":
        index = dict((g.address, g.index) for g in vgpu_layout.nvidia_gpus(node.sysfs))
        document = {"version": "v1", "vgpu-configs": {"exported": [
            {"devices": [index[a]], "vgpu-devices": p} for a, p in current.items()] or [
            {"devices": "all", "vgpu-devices": {}}]}}
    else:
        document = {"layout": vgpu_layout.export_layout(current)}
    _say(json.dumps(document, indent=2))
    return EXIT_OK


def holder_sources(kubelet_dir):
    """Every holder source besides the VFIO scan (inuse.held_devices' `sources`), as the engine has them
    (node/holders/kubelet_holders.py: DRA claims prepared under the kubelet directory, device plugin allocations)."""
    return kubelet_holders.holder_sources(check_kubelet_dir(kubelet_dir))


def cmd_idle(args):
    check_roots(args.sysfs_root, args.dev_root, args.proc_root)
    sysfs = Sysfs(args.sysfs_root)
    if args.then is None:
        return _idle_report(args, vgpu_busy.users(sysfs, args.dev_root, args.proc_root,
                                                  holder_sources(args.kubelet_dir)))
    if not args.then:
        raise vgpu_layout.LayoutError("--then needs a command")
    with node_lock(sysfs.root, args.lock_timeout):
        found = vgpu_busy.users(sysfs, args.dev_root, args.proc_root, holder_sources(args.kubelet_dir))
        if found:
            return _idle_report(args, found)
        _idle_report(args, found)
        # its output on ours, as it comes (the manager image's pod log); the node CLI runs outside Ansible
        try:
            ran = subprocess.run(args.then, check=False)   # pylint: disable=ansible-bad-function
        except OSError as err:
            raise vgpu_layout.LayoutError("--then %s: %s" % (args.then[0], err.strerror)) from None
    if ran.returncode != 0:
        raise vgpu_layout.LayoutError("--then %s exited %d" % (" ".join(args.then), ran.returncode))
    return EXIT_OK


def _idle_report(args, found):
    if args.json:
        _say(json.dumps({"idle": not found, "in_use": found}, indent=2))
    else:
        for line in found:
            _say("in use: %s" % line)
        if not found:
            _say("nothing uses the vGPU stack")
    return EXIT_DIFFERS if found else EXIT_OK


VERBS = {"apply": cmd_apply, "assert": cmd_assert, "export": cmd_export, "idle": cmd_idle}


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["agent"]:     # the agent parses its own arguments (its settings)
        verb, run, arg = "agent", cmd_agent, argv[1:]
    else:
        arg = _parser().parse_args(argv)
        verb, run = arg.verb, VERBS[arg.verb]
    try:
        return run(arg)
    except EngineError as err:
        _say("%s %s: %s" % (PROG, verb, one_line(err)), sys.stderr)
        return EXIT_ERROR
