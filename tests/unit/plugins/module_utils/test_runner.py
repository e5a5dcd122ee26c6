# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The command runner's record of calls stays bounded in a long-lived process (the agent's DRA driver)."""

from __future__ import annotations

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.runner import CommandError, CommandRunner


class _Quiet(CommandRunner):
    """Executes nothing: the record is what is tested."""

    def _execute(self, argv):
        return (1 if argv[0] == "false" else 0), "", "failed" if argv[0] == "false" else ""


def test_the_record_keeps_the_last_calls_only():
    runner = _Quiet()
    runner.KEPT_CALLS = 3
    for index in range(5):
        runner.run(["nvidia-smi", "mig", "-lgi", index])
    assert runner.calls == [["nvidia-smi", "mig", "-lgi", str(index)] for index in (2, 3, 4)]


def test_a_failed_call_is_recorded_and_raises_naming_it():
    runner = _Quiet()
    with pytest.raises(CommandError, match="^false -x: failed$"):
        runner.run(["false", "-x"])
    assert runner.calls == [["false", "-x"]]
