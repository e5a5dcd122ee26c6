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
  while its file exists (one owner per node; node/boot/handover.py).

Written for systemd, not for a shell: `%` starts a specifier in every setting used here, even inside
quotes (systemd.unit(5) "Specifiers"): `%%`; `$` starts a variable in a command line's arguments (not in
the executable's path): `$$`; an argument
with anything else systemd reads specially is put in double quotes with `\\` and `\"` (systemd.service(5)
"Command lines": C-style escapes inside quotes), an Environment= assignment likewise (systemd.exec(5));
the layout's path becomes a file: URL (percent-encoded) in Documentation=. A control character (a newline
would start a new setting) is refused, one line naming the option, before anything is written; so is a
`selected` that is no vgpu-device-manager config name (a label value), a unit name systemd would not
take, and a command path with a quote or a backslash (systemd runs no such path). Values without special
characters come out byte for byte as the role's old template wrote them.
"""

from __future__ import annotations

import re
import unicodedata
from urllib.parse import quote

from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError, shown

STATE_FILE = "/run/accelops-vgpu/boot-state.json"
MANAGER_UNITS = ("nvidia-vgpud.service", "nvidia-vgpu-mgr.service")
BEFORE_UNITS = ("kubelet.service",)
RETRY_FOR = 300
# one more attempt after retry_for may take its wait and lock timeouts
START_TIMEOUT_MARGIN = 300


# what systemd reads as is in an argument (shlex's safe set, % and $ are doubled); anything else is quoted
_PLAIN = re.compile(r"[A-Za-z0-9_@+=:,./%$-]+\Z")
# vgpu-device-manager selects its config by the node label nvidia.com/vgpu.config: a label value
# (k8s.io/apimachinery validation.IsValidLabelValue: 63 characters at most, alphanumeric at both ends)
CONFIG_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?\Z")
# systemd's unit name characters (src/basic/unit-name.c VALID_CHARS, "@" for template instances)
_UNIT_NAME = re.compile(r"[A-Za-z0-9:_.\\@-]+\Z")


class UnitValueError(EngineError):
    """A value the boot unit cannot carry; the message names the option and the value."""


def _checked(option, value):
    text = str(value)
    if any(unicodedata.category(char) == "Cc" for char in text):
        raise UnitValueError("boot unit: %s %s has a control character, which a systemd unit cannot carry"
                             % (option, shown(text)))
    return text


def _specifiers(text):
    return text.replace("%", "%%")


def _word(option, value, variables=True):
    """One command line argument (`variables`) or Environment= assignment, as systemd reads it back."""
    text = _checked(option, value)
    if not _PLAIN.match(text):
        text = '"%s"' % text.replace("\\", "\\\\").replace('"', '\\"')
    text = _specifiers(text)
    return text.replace("$", "$$") if variables else text


def exec_start(cli, layout, selected, agent_applied, roots, options):
    """The unit's command line. `roots` (sysfs, dev, proc, kubelet_dir or None) and `options` (dict:
    mixed_size, sriov_manage_path, mig_mode_order, mig_compute_instances, mig_gi_cleanup) are the
    module's; only what differs from the CLI's defaults is spelled out."""
    sysfs, dev, proc, kubelet_dir = roots
    # the executable's path is not searched for variables (systemd.service(5)): its $ stays as is
    argv = [("node_cli", _executable(cli), False), "apply", "--config", ("layout", layout),
            "--selected", ("selected", _selected(selected)),
            "--agent-applied", ("agent_applied", agent_applied), "--sysfs-root", ("sysfs_root", sysfs),
            "--dev-root", ("dev_root", dev), "--proc-root", ("proc_root", proc)]
    if kubelet_dir:
        argv += ["--kubelet-dir", ("kubelet_dir", kubelet_dir)]
    if options.get("mixed_size"):
        argv.append("--mixed-size")
    if options.get("sriov_manage_path"):
        argv += ["--sriov-manage", ("sriov_manage_path", options["sriov_manage_path"])]
    if options.get("mig_mode_order", "after-vfs") != "after-vfs":
        argv += ["--mig-mode-order", ("mig_mode_order", options["mig_mode_order"])]
    if not options.get("mig_compute_instances", True):
        argv.append("--no-mig-compute-instances")
    if options.get("mig_gi_cleanup", "destroy") != "destroy":
        argv += ["--mig-gi-cleanup", ("mig_gi_cleanup", options["mig_gi_cleanup"])]
    return " ".join(_word(*arg) if isinstance(arg, tuple) else arg for arg in argv)


def _executable(path):
    """The command's path: systemd will not run one with a quote or a backslash, quoted or not
    (src/core/load-fragment.c config_parse_exec, string_is_safe: 'Executable name contains special characters',
    a fatal unit)."""
    if any(char in _checked("node_cli", path) for char in "\\'\""):
        raise UnitValueError("boot unit: node_cli %s has a quote or a backslash, which systemd does not take in "
                             "the path of the command it runs" % shown(path))
    return path


def _selected(name):
    if not CONFIG_NAME.match(_checked("selected", name)):
        raise UnitValueError("boot unit: selected %s is not a vgpu-device-manager config name (a label value: letters, "
                             "digits, '-', '_', '.', alphanumeric at both ends, 63 characters at most)" % shown(name))
    return name


def _units(option, names):
    for name in names:
        if not _UNIT_NAME.match(_checked(option, name)):
            raise UnitValueError("boot unit: %s: %s is not a systemd unit name" % (option, shown(name)))
    return " ".join(names)


def _verbatim(option, path):
    """A path in a setting systemd takes as is (no quotes, no escapes): a trailing backslash would join the next
    line to it, trailing blanks would be stripped."""
    text = _checked(option, path)
    if text != text.rstrip() or text.endswith("\\"):
        raise UnitValueError("boot unit: %s %r ends with a blank or a backslash, which a systemd unit cannot carry"
                             % (option, text))
    return _specifiers(text)


def text(selected, layout, command, manager_units=MANAGER_UNITS, before_units=BEFORE_UNITS,
         retry_for=RETRY_FOR, state_file=STATE_FILE):
    """The unit file's content (for values without characters systemd reads specially, byte for byte what the
    role's template wrote before: no rewrite, no daemon-reload on the nodes an upgrade of the collection reaches)."""
    managers = _units("manager_units", manager_units)
    lines = [
        "# Managed by Ansible (accelops.vgpu.vgpu_profiles): re-applies the vGPU layout, which does not",
        "# survive a reboot or a restart of the vGPU manager.",
        "[Unit]",
        "Description=accelops vGPU layout (%s)" % _selected(selected),
        # a URL: percent-encoded (a blank would split the list, a quote open one), its % then doubled for specifiers
        "Documentation=file://%s" % _specifiers(quote(_checked("layout", layout), safe="/!$&()*+,;=:@")),
        "After=%s" % managers,
    ]
    if before_units:
        lines.append("Before=%s" % _units("before_units", before_units))
    lines += ["PartOf=%s" % unit for unit in manager_units]
    lines += [
        "ConditionPathExists=%s" % _verbatim("layout", layout),
        "",
        "[Service]",
        "Type=oneshot",
        "RemainAfterExit=yes",
        "# apply retries for vgpu_profiles_boot_retry_for s and records its outcome (environment: ExecStart stays",
        "# the command `assert` can replace apply in); one more attempt may take its wait and lock timeouts",
        "Environment=ACCELOPS_VGPU_RETRY_FOR=%d %s" % (retry_for, _word(
            "state_file", "ACCELOPS_VGPU_STATE_FILE=" + _checked("state_file", state_file), variables=False)),
        "TimeoutStartSec=%d" % (retry_for + START_TIMEOUT_MARGIN),
        "ExecStart=%s" % command,
        "",
        "[Install]",
        # the template's "multi-user.target {{ units | join(' ') }}": a space even with no manager unit
        "WantedBy=multi-user.target %s" % " ".join(manager_units),
    ]
    return "\n".join(lines) + "\n"
