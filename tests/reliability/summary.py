"""The reliability summary: cases tried, passed, and writes observed on failure paths.

Every case that drives a failure path reports how many writes it saw (gpusim write-log entries,
mutating API requests, mutating commands) through the `failure_writes` fixture; the terminal
summary and `.build/reports/reliability-summary.txt` carry the one line `make test` shows:

    reliability: 92 cases, 92 passed, 0 writes on failure paths
"""

from __future__ import annotations

import os

REPORT = os.path.join(".build", "reports", "reliability-summary.txt")


class Tally:
    """Outcomes of this directory's tests and the writes they observed on failure paths."""

    def __init__(self, prefix):
        self.prefix = prefix          # node id prefix of this directory, e.g. "tests/reliability/"
        self.outcomes = {}            # node id -> passed / failed / xfailed / xpassed / skipped
        self.writes = {}              # node id -> writes seen on failure paths

    def owns(self, nodeid):
        return nodeid.startswith(self.prefix)

    def record_writes(self, nodeid, count, what):
        entry = self.writes.setdefault(nodeid, [])
        entry.append((count, what))

    def record_report(self, report):
        """pytest_runtest_logreport: one outcome per test; a failing setup or teardown counts too."""
        if not self.owns(report.nodeid):
            return
        if hasattr(report, "wasxfail"):
            outcome = "xpassed" if report.passed else "xfailed"
        else:
            outcome = report.outcome
        if report.when == "call" or outcome != "passed":
            previous = self.outcomes.get(report.nodeid)
            if previous in (None, "passed"):
                self.outcomes[report.nodeid] = outcome

    def count(self, outcome):
        return sum(1 for value in self.outcomes.values() if value == outcome)

    def total_writes(self):
        return sum(count for entries in self.writes.values() for count, dummy in entries)

    def lines(self):
        line = "reliability: %d cases, %d passed, %d writes on failure paths" % (
            len(self.outcomes), self.count("passed"), self.total_writes())
        extra = []
        for outcome in ("failed", "xfailed", "xpassed", "skipped"):
            if self.count(outcome):
                extra.append("%d %s" % (self.count(outcome), outcome))
        lines = [line]
        if extra:
            lines.append("reliability: also %s (xfailed = known bugs, see their reasons)" % ", ".join(extra))
        for nodeid, entries in sorted(self.writes.items()):
            for count, what in entries:
                if count:
                    lines.append("reliability: %d write(s) on a failure path in %s: %s" % (count, nodeid, what))
        return lines

    def write_report(self, rootdir):
        path = os.path.join(str(rootdir), REPORT)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write("\n".join(self.lines()) + "\n")
        return path
