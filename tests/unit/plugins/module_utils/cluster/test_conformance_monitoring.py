"""The report's monitoring section: the PromQL to graph and what each node's series must add up to."""

from __future__ import annotations

from ansible_collections.accelops.vgpu.plugins.module_utils.cluster.conformance import monitoring, report
from ansible_collections.accelops.vgpu.plugins.module_utils.cluster.conformance.checks import summary

PREFIX = "accelops.io/vgpu.profile."


def node(name, labels):
    return {"metadata": {"name": name, "labels": labels}}


def test_expected_series_come_from_the_profile_labels_and_show_in_the_markdown():
    nodes = [node("gpu-b", {PREFIX + "L40S-8Q": "6", "team": "ml"}),
             node("gpu-a", {PREFIX + "L40S-24Q": "2", PREFIX + "A16-2B": "16"}), node("cpu-1", {})]
    section = monitoring.section(nodes, PREFIX)
    assert section["expected"] == [
        'node gpu-a: sum(accelops_vgpu_agent_vgpus{profile="A16-2B"}) == 16',
        'node gpu-a: sum(accelops_vgpu_agent_vgpus{profile="L40S-24Q"}) == 2',
        'node gpu-b: sum(accelops_vgpu_agent_vgpus{profile="L40S-8Q"}) == 6']
    context = {"generated": "2026-11-25T19:00:00Z", "run_id": "abc", "check_mode": True, "namespace": "ns",
               "cluster": {}, "profiles": [], "created": [], "cleanup": {}, "monitoring": section}
    md = report.markdown(report.build([], summary([]), context))
    assert "## Monitoring" in md and "    " + monitoring.QUERY in md
    assert '- `node gpu-b: sum(accelops_vgpu_agent_vgpus{profile="L40S-8Q"}) == 6`' in md


def test_no_profile_labels_says_so():
    assert monitoring.markdown_lines(monitoring.section([node("cpu-1", {})], PREFIX))[-1] == \
        "No node carries profile labels yet."
    assert monitoring.markdown_lines(None) == []
