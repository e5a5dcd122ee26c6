# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The systemd state of the boot unit that re-applies the layout (`systemctl`, read first).

Present: `daemon-reload` when a boot file was (re)written in this run, `enable` unless
`is-enabled` says `enabled`, `start` unless `is-active` says `active` (started, not only enabled:
`PartOf=` only propagates restarts of the vGPU manager to an active unit). A unit that is already
active is not restarted: it is a oneshot that applied the same layout this run just checked.
Absent: `stop` while active, `disable` while enabled (before its files go), `daemon-reload` after.
`is-enabled` / `is-active` only read, so check mode asks them too and reports the same actions.

`converge()` is the whole boot persistence after a layout apply: the files (boot_files.py), then
the unit (or, absent, the unit first and the files after).
"""

from __future__ import annotations

from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError
from ansible_collections.accelops.vgpu.plugins.module_utils.node.boot import boot_files

SYSTEMCTL = "systemctl"


class BootUnitError(EngineError):
    """systemctl is missing or refused an action; the message names the unit."""


def _systemctl(runner, unit, *args):
    rc, out, err = runner.run([SYSTEMCTL] + list(args), check=False)
    if rc == 127:  # the runner's "could not execute"
        raise BootUnitError("boot unit %s: systemctl cannot be run (%s); set manage_service false where systemd "
                            "does not run" % (unit, (err or out or "not found").strip().splitlines()[-1]))
    return rc, (out or "").strip(), (err or "").strip()


def _is(runner, unit, question, answer):
    dummy, out, dummy2 = _systemctl(runner, unit, question, unit)
    return out.splitlines()[-1:] == [answer]


def plan(runner, unit, present, files_changed):
    """The systemctl actions, in order, as argv tails: [["daemon-reload"], ["enable", unit], ...]."""
    actions = []
    if present:
        if files_changed:
            actions.append(["daemon-reload"])
        if not _is(runner, unit, "is-enabled", "enabled"):
            actions.append(["enable", unit])
        if not _is(runner, unit, "is-active", "active"):
            actions.append(["start", unit])
        return actions
    if _is(runner, unit, "is-active", "active"):
        actions.append(["stop", unit])
    if _is(runner, unit, "is-enabled", "enabled"):
        actions.append(["disable", unit])
    return actions


def run(runner, unit, actions):
    """Carry out `actions`; the first refusal raises BootUnitError naming the unit and the action."""
    for action in actions:
        rc, out, err = _systemctl(runner, unit, *action)
        if rc != 0:
            said = (err or out or "exit %d" % rc).splitlines()[-1]
            raise BootUnitError("boot unit %s: systemctl %s failed: %s" % (unit, " ".join(action), said))


def converge(runner, unit, files, present=True, check_mode=False):
    """Boot files and, when `unit` is given, its systemd state. Returns {changed, outdated, installed,
    removed, actions (command lines), diff}; in check mode nothing is written and the same is reported."""
    if present:
        boot_files.validate(files)
        # the files to remove first: a removal that fails then stops before a unit file is written, so the
        # next run still sees it outdated and reloads (written first, it would be current without a reload)
        gone = boot_files.remove([entry for entry in files if entry.get("remove")], check_mode)
        done = boot_files.install(files, check_mode)
        done["removed"] = gone["removed"]
        for side in ("before", "after"):
            done["diff"][side].update(gone["diff"][side])
        actions = plan(runner, unit, True, bool(done["installed"])) if unit else []
        if not check_mode:
            run(runner, unit, actions)
        touched = done["installed"] + done["removed"]
    else:
        actions = plan(runner, unit, False, False) if unit else []
        if not check_mode:
            run(runner, unit, actions)
        done = boot_files.remove(files, check_mode)
        touched = done["removed"]
        if unit and touched:
            reload = [["daemon-reload"]]
            if not check_mode:
                run(runner, unit, reload)
            actions += reload
    return {"changed": bool(touched or actions), "outdated": done.get("outdated", []),
            "installed": done.get("installed", []), "removed": done.get("removed", []),
            "actions": [" ".join([SYSTEMCTL] + action) for action in actions], "diff": done["diff"]}
