# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Prometheus metrics with the standard library: counters, gauges and histograms with labels, rendered in the
Prometheus text exposition format 0.0.4 (what `/metrics` serves; `promtool check metrics` checks it in the tests).

Not prometheus_client: the agent is a stdlib-only zipapp (docs/design.md, "Node agent"); the handful of metric
kinds it needs are ~100 lines here, thread-safe with one lock per registry.

    registry = Registry()
    applies = registry.counter("accelops_vgpu_agent_applies_total", "Reconciles by result.", ["result"])
    applies.inc(result="changed")
    registry.render()  # text format
"""

from __future__ import annotations

import math
import threading

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DEFAULT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


def _escape_label(value):
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text):
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _number(value):
    if value == math.inf:
        return "+Inf"
    if value == -math.inf:
        return "-Inf"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value)) if isinstance(value, float) else str(value)


def _labels_text(names, values, extra=()):
    pairs = list(zip(names, values)) + list(extra)
    if not pairs:
        return ""
    return "{%s}" % ",".join('%s="%s"' % (name, _escape_label(value)) for name, value in pairs)


class _Family:
    kind = None

    def __init__(self, registry, name, help_text, labels=()):
        self.registry, self.name, self.help, self.labels = registry, name, help_text, tuple(labels)
        self.samples = {}  # label values tuple -> value

    def _key(self, labels):
        if set(labels) != set(self.labels):
            raise ValueError("%s takes the labels %s, not %s" % (self.name, sorted(self.labels), sorted(labels)))
        return tuple(str(labels[name]) for name in self.labels)

    def value(self, **labels):
        with self.registry.lock:
            return self.samples.get(self._key(labels), 0)

    def header(self):
        return ["# HELP %s %s" % (self.name, _escape_help(self.help)), "# TYPE %s %s" % (self.name, self.kind)]

    def lines(self):
        return ["%s%s %s" % (self.name, _labels_text(self.labels, key), _number(value))
                for key, value in sorted(self.samples.items())]


class Counter(_Family):
    kind = "counter"

    def inc(self, amount=1, **labels):
        if amount < 0:
            raise ValueError("%s: a counter only goes up" % self.name)
        with self.registry.lock:
            key = self._key(labels)
            self.samples[key] = self.samples.get(key, 0) + amount


class Gauge(_Family):
    kind = "gauge"

    def set(self, value, **labels):
        with self.registry.lock:
            self.samples[self._key(labels)] = value

    def replace(self, values):
        """All samples at once: {label values tuple: value}; label sets not given are dropped."""
        with self.registry.lock:
            self.samples = dict((tuple(str(v) for v in key), value) for key, value in values.items())


class Histogram(_Family):
    kind = "histogram"

    def __init__(self, registry, name, help_text, labels=(), buckets=DEFAULT_BUCKETS):
        super().__init__(registry, name, help_text, labels)
        self.buckets = tuple(sorted(buckets)) + (math.inf,)

    def observe(self, value, **labels):
        with self.registry.lock:
            key = self._key(labels)
            counts, total = self.samples.get(key, ([0] * len(self.buckets), 0.0))
            counts = [n + (1 if value <= bound else 0) for n, bound in zip(counts, self.buckets)]
            self.samples[key] = (counts, total + value)

    def count(self, **labels):
        with self.registry.lock:
            return self.samples.get(self._key(labels), ([0] * len(self.buckets), 0.0))[0][-1]

    def lines(self):
        out = []
        for key, (counts, total) in sorted(self.samples.items()):
            for bound, count in zip(self.buckets, counts):
                out.append("%s_bucket%s %d" % (self.name, _labels_text(self.labels, key, [("le", _number(bound))]),
                                               count))
            out.append("%s_sum%s %s" % (self.name, _labels_text(self.labels, key), _number(total)))
            out.append("%s_count%s %d" % (self.name, _labels_text(self.labels, key), counts[-1]))
        return out


class Registry:
    """The metric families of one process, rendered in registration order."""

    def __init__(self):
        self.lock = threading.RLock()
        self.families = []

    def _add(self, family):
        if any(f.name == family.name for f in self.families):
            raise ValueError("metric %s is registered twice" % family.name)
        self.families.append(family)
        return family

    def counter(self, name, help_text, labels=()):
        return self._add(Counter(self, name, help_text, labels))

    def gauge(self, name, help_text, labels=()):
        return self._add(Gauge(self, name, help_text, labels))

    def histogram(self, name, help_text, labels=(), buckets=DEFAULT_BUCKETS):
        return self._add(Histogram(self, name, help_text, labels, buckets))

    def render(self):
        with self.lock:
            lines = []
            for family in self.families:
                lines.extend(family.header())
                lines.extend(family.lines())
        return "\n".join(lines) + "\n"
