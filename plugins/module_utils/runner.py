# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Injectable command runner: the engine runs tools (sriov-manage, nvidia-smi) only through it.

`CommandRunner` uses subprocess (node CLI, tests); modules wrap AnsibleModule.run_command with
`FunctionRunner` so Ansible's environment and logging rules apply.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError


class CommandError(EngineError):
    def __init__(self, argv, rc, stdout="", stderr="", detail=None):
        self.argv, self.rc, self.stdout, self.stderr = list(argv), rc, stdout, stderr
        last = (stderr or stdout or "").strip().splitlines()
        why = detail or (last[-1] if last else "exit status %s" % rc)
        super().__init__("%s: %s" % (" ".join(self.argv), why))


class CommandRunner:
    """Runs argv lists (never a shell); `calls` records the last KEPT_CALLS of them for callers and tests (the agent's
    DRA driver keeps one runner for its whole life: an unbounded record would grow with every MIG-backed prepare)."""

    KEPT_CALLS = 4096

    def __init__(self, timeout=600):
        self.timeout = timeout
        self.calls = []

    def which(self, name, extra_paths=()):
        for path in extra_paths:
            if os.access(path, os.X_OK):
                return path
        return shutil.which(name)

    def _execute(self, argv):
        # The node CLI runs outside Ansible; modules never get here (they use FunctionRunner).
        try:
            proc = subprocess.run(  # pylint: disable=ansible-bad-function
                argv, capture_output=True, text=True, timeout=self.timeout, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return 127, "", str(exc)
        return proc.returncode, proc.stdout, proc.stderr

    def run(self, argv, check=True):
        """(rc, stdout, stderr); with check=True a non-zero rc raises CommandError."""
        argv = [str(a) for a in argv]
        self.calls.append(argv)
        if len(self.calls) > self.KEPT_CALLS:
            del self.calls[:-self.KEPT_CALLS]
        rc, out, err = self._execute(argv)
        if check and rc != 0:
            raise CommandError(argv, rc, out, err)
        return rc, out, err


class FunctionRunner(CommandRunner):
    """Adapts a `run_command(argv) -> (rc, out, err)` callable, e.g. AnsibleModule.run_command."""

    def __init__(self, run_command, timeout=600):
        super().__init__(timeout)
        self._run_command = run_command

    def _execute(self, argv):
        return self._run_command(argv)
