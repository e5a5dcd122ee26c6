"""Summaries of repeated measurements: median with min and max, and ratios of paired runs.

The machine is noisy, so every number is reported as the median of several runs with its spread,
and ratios are taken per run pair (measurement and baseline run back to back) before summarizing.
"""

from __future__ import annotations

import statistics


def summary(samples, digits=6):
    """{median, min, max, n, samples} of a non-empty list of numbers."""
    values = [float(v) for v in samples]
    if not values:
        raise ValueError("no samples to summarize")
    return {"median": round(statistics.median(values), digits), "min": round(min(values), digits),
            "max": round(max(values), digits), "n": len(values), "samples": [round(v, digits) for v in values]}


def paired_ratios(measured, baseline):
    """measured[i] / baseline[i] for runs taken side by side; both lists have the same length."""
    if len(measured) != len(baseline):
        raise ValueError("paired ratios need as many measurements (%d) as baselines (%d)"
                         % (len(measured), len(baseline)))
    if any(b <= 0 for b in baseline):
        raise ValueError("a baseline of zero or less cannot be divided by")
    return [m / b for m, b in zip(measured, baseline)]


def ratio_summary(measured, baseline):
    """summary() of the paired ratios."""
    return summary(paired_ratios(measured, baseline))


def ratio_of_medians(numerator, denominator):
    """median(numerator summary) / median(denominator summary), for unpaired series."""
    if denominator["median"] <= 0:
        raise ValueError("a median of zero or less cannot be divided by")
    return round(numerator["median"] / denominator["median"], 4)


def within(value, limit):
    """Whether a measured value meets an upper-bound target (value <= limit)."""
    return value <= limit
