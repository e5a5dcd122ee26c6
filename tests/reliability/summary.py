"""The reliability summary: cases tried, passed, and writes observed on failure paths.

Every case that drives a failure path observes the writes it caused (gpusim write-log entries,
mutating API requests, mutating commands, files below the roots it gave) through the
`failure_writes` fixture (observers.py); the others say why they have none. The terminal summary
and `.build/reports/reliability-summary.txt` carry the line `make test` shows:

    reliability: 92 cases, 92 passed, 0 writes on failure paths (observed in 84 cases)
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
        self.unobserved = {}          # node id -> why the case has no failure path to observe

    def owns(self, nodeid):
        return nodeid.startswith(self.prefix)

    def record_writes(self, nodeid, count, what):
        entry = self.writes.setdefault(nodeid, [])
        entry.append((count, what))

    def record_unobserved(self, nodeid, reason):
        self.unobserved[nodeid] = reason

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
        line = "reliability: %d cases, %d passed, %d writes on failure paths (observed in %d cases)" % (
            len(self.outcomes), self.count("passed"), self.total_writes(), len(self.writes))
        extra = []
        for outcome in ("failed", "xfailed", "xpassed", "skipped"):
            if self.count(outcome):
                extra.append("%d %s" % (self.count(outcome), outcome))
        lines = [line]
        if extra:
            lines.append("reliability: also %s (xfailed = known bugs, see their reasons)" % ", ".join(extra))
        if self.unobserved:
            lines.append("reliability: %d cases with no failure path to observe: %s" % (
                len(self.unobserved), "; ".join(sorted(set(self.unobserved.values())))))
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
