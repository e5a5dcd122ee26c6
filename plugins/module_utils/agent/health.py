# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The agent's probes: liveness that fails when the reconcile loop or the node watch is stuck, readiness once
a reconcile succeeded.

- The main loop beats at every turn (it wakes at least every CONFIG_POLL_INTERVAL seconds). A reconcile in
  progress may legitimately take long (the node lock, enabling VFs, waiting for operand pods): while one runs,
  the loop is stuck only when it has run longer than `reconcile_limit` (the sum of those timeouts plus a margin).
- The watch thread reports activity whenever a stream starts, delivers an event or ends, and whenever it
  retries after an error. An idle node delivers nothing, but the server ends each stream after WATCH_TIMEOUT
  (timeoutSeconds) and the watcher starts the next: no activity for WATCH_TIMEOUT plus `watch_grace` means a
  stream hangs (a half-open connection) or the thread is gone. A watch that fails and retries is not stuck:
  restarting the pod would not fix an API server outage.
- Ready: after the first reconcile that ended `success`; it stays ready when a later one fails (the state label
  reports that; taking the pod out of rotation would only stop the metrics).
"""

from __future__ import annotations

import threading
import time


class Health:
    def __init__(self, loop_limit, reconcile_limit, watch_limit, clock=time.monotonic):
        self.loop_limit, self.reconcile_limit, self.watch_limit = loop_limit, reconcile_limit, watch_limit
        self.clock = clock
        self.lock = threading.Lock()
        now = clock()
        self.loop_beat = now
        self.reconcile_since = None
        self.watch_beat = now
        self.ready = False

    @classmethod
    def for_settings(cls, settings, clock=time.monotonic):
        """Limits from the agent's settings: the loop must turn within 3 poll intervals (at least 30 s); a
        reconcile may take the lock, VF and operand timeouts plus 120 s; a watch stream its timeout plus 60 s
        (and the request timeout of a reconnect)."""
        poll = float(getattr(settings, "config_poll_interval", 5))
        reconcile = sum(float(getattr(settings, name, default)) for name, default in (
            ("lock_timeout", 300), ("wait_timeout", 120), ("operand_wait_timeout", 120))) + 120.0
        watch = float(getattr(settings, "watch_timeout", 300)) + 60.0 + 30.0
        return cls(max(30.0, 3 * poll), reconcile, watch, clock)

    # --- reports -------------------------------------------------------------------------------------------
    def beat(self):
        with self.lock:
            self.loop_beat = self.clock()

    def reconcile_started(self):
        with self.lock:
            self.reconcile_since = self.clock()

    def reconcile_finished(self, succeeded):
        with self.lock:
            self.reconcile_since = None
            self.loop_beat = self.clock()
            self.ready = self.ready or bool(succeeded)

    def watch_active(self):
        with self.lock:
            self.watch_beat = self.clock()

    # --- verdicts ------------------------------------------------------------------------------------------
    def live(self):
        """(True, "ok") or (False, why)."""
        with self.lock:
            now = self.clock()
            if self.reconcile_since is not None:
                if now - self.reconcile_since > self.reconcile_limit:
                    return False, "a reconcile has run for %.0f s (limit %.0f s)" % (
                        now - self.reconcile_since, self.reconcile_limit)
            elif now - self.loop_beat > self.loop_limit:
                return False, "the reconcile loop has not turned for %.0f s (limit %.0f s)" % (
                    now - self.loop_beat, self.loop_limit)
            if now - self.watch_beat > self.watch_limit:
                return False, "the node watch has been silent for %.0f s (limit %.0f s)" % (
                    now - self.watch_beat, self.watch_limit)
            return True, "ok"

    def readiness(self):
        with self.lock:
            return (True, "ok") if self.ready else (False, "no reconcile has succeeded yet")
