# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The text of accelops-vgpu.service, the systemd unit that re-applies the layout (boot_files `unit`).

Built on the node by the apply module from its own options, not by Jinja on the controller: a
controller compiles every template string again in each forked worker, and this unit and its
command line were most of the node play's template work per host (issue 34, P4b).

- boot: WantedBy=multi-user.target, after the vGPU manager, before the kubelet, so the device
  plugin only ever sees the declared layout;
- vGPU manager restart: PartOf= propagates its stop/restart to this unit, and WantedBy=<manager>
  pulls this unit in whenever the manager is started again;
- the command is `accelops-vgpu apply` with the options the module applied the layout with, so the
  boot applies what this run applied; the node agent's last applied config wins over --selected
  while its file exists (one owner per node; node/handover.py).
"""

from __future__ import annotations

import shlex

STATE_FILE = "/run/accelops-vgpu/boot-state.json"
MANAGER_UNITS = ("nvidia-vgpud.service", "nvidia-vgpu-mgr.service")
BEFORE_UNITS = ("kubelet.service",)
RETRY_FOR = 300
# one more attempt after retry_for may take its wait and lock timeouts
START_TIMEOUT_MARGIN = 300


def exec_start(cli, layout, selected, agent_applied, roots, options):
    """The unit's command line. `roots` (sysfs, dev, proc, kubelet_dir or None) and `options` (dict:
    mixed_size, sriov_manage_path, mig_mode_order, mig_compute_instances, mig_gi_cleanup) are the
    module's; only what differs from the CLI's defaults is spelled out."""
    sysfs, dev, proc, kubelet_dir = roots
    argv = [cli, "apply", "--config", layout, "--selected", selected, "--agent-applied", agent_applied,
            "--sysfs-root", sysfs, "--dev-root", dev, "--proc-root", proc]
    if kubelet_dir:
        argv += ["--kubelet-dir", kubelet_dir]
    if options.get("mixed_size"):
        argv.append("--mixed-size")
    if options.get("sriov_manage_path"):
        argv += ["--sriov-manage", options["sriov_manage_path"]]
    if options.get("mig_mode_order", "after-vfs") != "after-vfs":
        argv += ["--mig-mode-order", options["mig_mode_order"]]
    if not options.get("mig_compute_instances", True):
        argv.append("--no-mig-compute-instances")
    if options.get("mig_gi_cleanup", "destroy") != "destroy":
        argv += ["--mig-gi-cleanup", options["mig_gi_cleanup"]]
    return " ".join(shlex.quote(str(arg)) for arg in argv)


def text(selected, layout, command, manager_units=MANAGER_UNITS, before_units=BEFORE_UNITS,
         retry_for=RETRY_FOR, state_file=STATE_FILE):
    """The unit file's content (byte for byte what the role's template wrote before: no rewrite,
    no daemon-reload on the nodes an upgrade of the collection reaches)."""
    managers = " ".join(manager_units)
    lines = [
        "# Managed by Ansible (accelops.vgpu.vgpu_profiles): re-applies the vGPU layout, which does not",
        "# survive a reboot or a restart of the vGPU manager.",
        "[Unit]",
        "Description=accelops vGPU layout (%s)" % selected,
        "Documentation=file://%s" % layout,
        "After=%s" % managers,
    ]
    if before_units:
        lines.append("Before=%s" % " ".join(before_units))
    lines += ["PartOf=%s" % unit for unit in manager_units]
    lines += [
        "ConditionPathExists=%s" % layout,
        "",
        "[Service]",
        "Type=oneshot",
        "RemainAfterExit=yes",
        "# apply retries for vgpu_profiles_boot_retry_for s and records its outcome (environment: ExecStart stays",
        "# the command `assert` can replace apply in); one more attempt may take its wait and lock timeouts",
        "Environment=ACCELOPS_VGPU_RETRY_FOR=%d ACCELOPS_VGPU_STATE_FILE=%s" % (retry_for, state_file),
        "TimeoutStartSec=%d" % (retry_for + START_TIMEOUT_MARGIN),
        "ExecStart=%s" % command,
        "",
        "[Install]",
        # the template's "multi-user.target {{ units | join(' ') }}": a space even with no manager unit
        "WantedBy=multi-user.target %s" % " ".join(manager_units),
    ]
    return "\n".join(lines) + "\n"
