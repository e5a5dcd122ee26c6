import json

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError
from ansible_collections.accelops.vgpu.plugins.module_utils.node.boot import boot_retry
from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout.vgpu_layout import LayoutError


class Clock:
    """Time that only moves when the retry loop sleeps."""

    def __init__(self):
        self.now, self.slept = 100.0, []

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.slept.append(seconds)
        self.now += seconds


def failing(times, error=EngineError("0000:41:00.0: no VFs yet")):
    calls = []

    def attempt():
        calls.append(1)
        if len(calls) <= times:
            raise error
        return "done"
    return attempt, calls


def test_retries_with_doubling_backoff_then_records_applied(tmp_path):
    clock, said, state = Clock(), [], tmp_path / "run" / "boot.json"
    attempt, calls = failing(3)
    assert boot_retry.run(attempt, 300, said.append, str(state), "layout.json", clock, clock.sleep) == "done"
    assert clock.slept == [2.0, 4.0, 8.0] and len(calls) == 4
    assert said[0] == "attempt 1 failed (0000:41:00.0: no VFs yet); retrying in 2 s"
    recorded = json.loads(state.read_text())
    assert (recorded["state"], recorded["attempts"], recorded["error"], recorded["config"]) == (
        "applied", 4, None, "layout.json")


def test_gives_up_after_the_bound_and_leaves_a_failed_state(tmp_path):
    clock, said, state = Clock(), [], tmp_path / "boot.json"
    attempt, calls = failing(1000)
    with pytest.raises(EngineError, match=r"^giving up after 7 attempt\(s\) in 100 s: 0000:41:00.0: no VFs yet$"):
        boot_retry.run(attempt, 100, said.append, str(state), "layout.json", clock, clock.sleep)
    # 2 + 4 + 8 + 16 + 32 = 62, then the last 38 s (never past the bound) and a last attempt at the bound
    assert clock.slept == [2.0, 4.0, 8.0, 16.0, 32.0, 38.0] and clock.now == 200.0
    recorded = boot_retry.read_state(str(state))
    assert recorded["state"] == "failed" and recorded["attempts"] == 7 and recorded["error"].startswith("giving up")


def test_backoff_is_capped_at_a_minute():
    clock = Clock()
    attempt, dummy = failing(9)
    boot_retry.run(attempt, 3600, lambda line: None, None, None, clock, clock.sleep)
    assert clock.slept == [2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0, 60.0, 60.0]


def test_a_broken_layout_is_not_retried(tmp_path):
    clock, state = Clock(), tmp_path / "boot.json"
    attempt, calls = failing(5, LayoutError("layout.json: selected config 'x' not present"))
    with pytest.raises(LayoutError):
        boot_retry.run(attempt, 300, lambda line: None, str(state), "layout.json", clock, clock.sleep)
    assert len(calls) == 1 and clock.slept == [] and boot_retry.read_state(str(state))["state"] == "failed"


def test_an_unwritable_state_file_is_said_not_fatal(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    said = []
    attempt, dummy = failing(0)
    assert boot_retry.run(attempt, 10, said.append, str(blocker / "boot.json"), None) == "done"
    assert said and said[0].startswith("cannot write the state file %s" % (blocker / "boot.json"))
