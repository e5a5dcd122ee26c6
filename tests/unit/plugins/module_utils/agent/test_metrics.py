"""The stdlib Prometheus registry: the text format, checked by the real promtool where it is installed."""

import shutil
import subprocess

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.agent import metrics


def test_counters_gauges_and_histograms_render_in_the_text_format():
    registry = metrics.Registry()
    applies = registry.counter("demo_applies_total", "Applies by result.", ["result"])
    state = registry.gauge("demo_state", 'A "quoted" label\nand a line.', ["config"])
    duration = registry.histogram("demo_duration_seconds", "Durations.", buckets=(0.5, 2.0))
    applies.inc(result="changed")
    applies.inc(2, result="changed")
    state.set(1, config='l40s "a"\\b\n')
    duration.observe(0.25)
    duration.observe(1.5)
    assert registry.render() == (
        "# HELP demo_applies_total Applies by result.\n"
        "# TYPE demo_applies_total counter\n"
        'demo_applies_total{result="changed"} 3\n'
        '# HELP demo_state A "quoted" label\\nand a line.\n'
        "# TYPE demo_state gauge\n"
        'demo_state{config="l40s \\"a\\"\\\\b\\n"} 1\n'
        "# HELP demo_duration_seconds Durations.\n"
        "# TYPE demo_duration_seconds histogram\n"
        'demo_duration_seconds_bucket{le="0.5"} 1\n'
        'demo_duration_seconds_bucket{le="2"} 2\n'
        'demo_duration_seconds_bucket{le="+Inf"} 2\n'
        "demo_duration_seconds_sum 1.75\n"
        "demo_duration_seconds_count 2\n")
    assert applies.value(result="changed") == 3 and duration.count() == 2


def test_wrong_use_is_refused():
    registry = metrics.Registry()
    counter = registry.counter("demo_total", "x", ["result"])
    with pytest.raises(ValueError, match="only goes up"):
        counter.inc(-1, result="x")
    with pytest.raises(ValueError, match="takes the labels"):
        counter.inc(code="x")
    with pytest.raises(ValueError, match="registered twice"):
        registry.gauge("demo_total", "again")


def test_gauge_replace_drops_label_sets_not_given():
    registry = metrics.Registry()
    gauge = registry.gauge("demo_vgpus", "x", ["profile", "state"])
    gauge.replace({("A", "free"): 2, ("B", "free"): 1})
    gauge.replace({("A", "free"): 1})
    assert 'profile="B"' not in registry.render() and gauge.value(profile="A", state="free") == 1


@pytest.mark.skipif(not shutil.which("promtool"), reason="promtool (Debian: prometheus) not installed")
def test_promtool_accepts_the_output_and_catches_a_bad_one():
    registry = metrics.Registry()
    registry.counter("demo_applies_total", "Applies.", ["result"]).inc(result="ok")
    registry.histogram("demo_duration_seconds", "Durations.").observe(3)
    good = subprocess.run(["promtool", "check", "metrics"], input=registry.render(), capture_output=True, text=True,
                          check=False)
    assert good.returncode == 0, good.stdout + good.stderr
    bad = subprocess.run(["promtool", "check", "metrics"], input="demo_total{a=b} 1\n", capture_output=True,
                         text=True, check=False)
    assert bad.returncode != 0
