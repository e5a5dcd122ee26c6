"""The report renderers: the same rows as JSON, Markdown and JUnit XML."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from ansible_collections.accelops.vgpu.plugins.module_utils.cluster.conformance import report
from ansible_collections.accelops.vgpu.plugins.module_utils.cluster.conformance.checks import Check, summary

ROWS = [Check("inventory", "KAR-0003", "nvidia.com/NVIDIA_L40S-24Q", "PASS", "on 1 node(s)"),
        Check("sharing", "KAR-0003", "L40S-24Q@a", "FAIL", "not Running after 5s: v-1 (Pending) | <x>"),
        Check("health.guest", "KAR-0004", "L40S-24Q@a", "UNKNOWN", "no guest command configured")]
CONTEXT = {"generated": "2026-11-23T23:00:00Z", "run_id": "abc", "check_mode": False, "namespace": "ns",
           "cluster": {"server": "https://k8s:6443", "kubevirt": "KubeVirt kubevirt/kubevirt", "version": "v1.9.0"},
           "profiles": ["L40S-24Q"], "created": ["Namespace ns"], "cleanup": {"deleted": ["Namespace ns"], "left": []}}


def test_files_carry_the_same_rows(tmp_path):
    rep = report.build(ROWS, summary(ROWS), CONTEXT)
    files = report.write(rep, str(tmp_path), "r")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json", "r.junit.xml", "r.md"]
    assert json.loads((tmp_path / "r.json").read_text()) == rep
    assert rep["summary"] == {"pass": 1, "fail": 1, "unknown": 1, "total": 3}
    md = (tmp_path / "r.md").read_text()
    assert "| sharing | KAR-0003 | L40S-24Q@a | FAIL | not Running after 5s: v-1 (Pending) \\| <x> |" in md
    assert "Created and deleted again:\n- Namespace ns" in md
    root = ET.parse(files["junit"]).getroot()
    assert (root.get("tests"), root.get("failures"), root.get("skipped")) == ("3", "1", "1")
    cases = root.findall("./testsuite/testcase")
    assert [c.get("classname") for c in cases] == ["KAR-0003.inventory", "KAR-0003.sharing", "KAR-0004.health.guest"]
    assert cases[1].find("failure").get("message") == "not Running after 5s: v-1 (Pending) | <x>"
    assert cases[2].find("skipped").get("message") == "UNKNOWN: no guest command configured"
    assert cases[0].find("failure") is None and cases[0].find("skipped") is None


def test_check_mode_markdown_lists_what_would_be_created_and_leftovers_are_loud():
    context = dict(CONTEXT, check_mode=True, cleanup={"deleted": [], "left": ["Namespace ns (forbidden)"]})
    md = report.markdown(report.build(ROWS, summary(ROWS), context))
    assert "(check mode: nothing created)" in md and "Would create:\n- Namespace ns" in md
    assert "**Left behind (delete by hand):** Namespace ns (forbidden)" in md
