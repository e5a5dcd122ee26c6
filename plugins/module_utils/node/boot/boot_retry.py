# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The boot unit's apply, retried with backoff for a bounded time, and the state it leaves behind.

At boot the vGPU manager may not be ready when the unit starts (no VFs yet, types not published,
the node lock held by the manager image's own apply). `accelops-vgpu apply --retry-for S` runs the
apply again after 2, 4, 8 ... (at most 60) seconds until it succeeds or S seconds have passed. An error
in the layout itself (a broken file, an unknown config: vgpu_layout.LayoutError) is not retried: the next
attempt would read the same file.

Every attempt's outcome goes to stderr (the journal under systemd) and, with `--state-file`, into a
small JSON file the node agent and a metrics collector can read:

    {"state": "applied" | "retrying" | "failed", "attempts": N, "error": "<one line>" or null,
     "config": "<config file>", "time": "<UTC ISO 8601>",
     "reserved": [{"address", "driver", "reason"}, ...]}   # applied only: GPUs passed through, left alone

"failed" means the unit gave up (the journal has the same line, starting "giving up").
"""

from __future__ import annotations

import datetime
import json
import time

from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError, one_line
from ansible_collections.accelops.vgpu.plugins.module_utils.atomic_file import write_file
from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout.vgpu_layout import LayoutError

FIRST_DELAY, MAX_DELAY = 2.0, 60.0
APPLIED, RETRYING, FAILED = "applied", "retrying", "failed"


def write_state(path, state, attempts, error, config, skipped=None):
    """Atomically replace the state file (its directory is created); an unwritable path is only reported."""
    if not path:
        return None
    record = {"state": state, "attempts": attempts, "error": error, "config": config,
              "time": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
    if skipped is not None:
        record["reserved"] = skipped
    try:
        write_file(path, json.dumps(record) + "\n", 0o644)
    except OSError as err:
        return "cannot write the state file %s: %s" % (path, err.strerror or err)
    return None


def read_state(path):
    """The state file as a dict, None when it is missing or unreadable."""
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def run(attempt, retry_for, say, state_file=None, config=None, clock=None, sleep=None):
    """attempt() until it returns (its value is returned) or `retry_for` seconds have passed; then the
    last EngineError is raised with "giving up after N attempts in S s" in front. retry_for 0: once."""
    clock, sleep = clock or time.monotonic, sleep or time.sleep
    deadline = clock() + max(0.0, retry_for)
    delay, attempts = FIRST_DELAY, 0
    while True:
        attempts += 1
        try:
            result = attempt()
        except LayoutError as err:
            _note(say, write_state(state_file, FAILED, attempts, one_line(err), config))
            raise
        except EngineError as err:
            left = deadline - clock()
            if left <= 0:
                message = "giving up after %d attempt(s) in %.0f s: %s" % (attempts, retry_for, one_line(err))
                _note(say, write_state(state_file, FAILED, attempts, message, config))
                raise EngineError(message) from None
            wait = min(delay, left)
            say("attempt %d failed (%s); retrying in %.0f s" % (attempts, one_line(err), wait))
            _note(say, write_state(state_file, RETRYING, attempts, one_line(err), config))
            sleep(wait)
            delay = min(delay * 2, MAX_DELAY)
            continue
        skipped = result.get("reserved") if isinstance(result, dict) else None
        _note(say, write_state(state_file, APPLIED, attempts, None, config, skipped))
        return result


def _note(say, problem):
    if problem:
        say(problem)
