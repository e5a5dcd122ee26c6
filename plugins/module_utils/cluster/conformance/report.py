# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The report: one dict (the JSON file and the module result), rendered as Markdown and JUnit XML.

JUnit mapping, as CI systems show it: a row is a testcase (classname `<requirement>.<check>`, name the
subject); FAIL -> <failure>, UNKNOWN -> <skipped> (manual verification needed), PASS -> passed.
"""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET

from ansible_collections.accelops.vgpu.plugins.module_utils.atomic_file import write_file
from ansible_collections.accelops.vgpu.plugins.module_utils.cluster.conformance import monitoring

SCHEMA = "accelops.vgpu/conformance/v1"
SUFFIXES = {"json": ".json", "markdown": ".md", "junit": ".junit.xml"}


def build(rows, summary, context):
    """context: generated (ISO time), cluster (server, kubevirt, version), namespace, run_id, check_mode,
    created (what the run created or would create), cleanup."""
    report = {"schema": SCHEMA}
    report.update(context)
    report["summary"] = summary
    report["checks"] = [row.as_dict() for row in rows]
    return report


def _cell(text):
    return " ".join(str(text).split()).replace("|", "\\|")


def markdown(report):
    summary = report["summary"]
    cluster = report["cluster"]
    mode = " (check mode: nothing created)" if report["check_mode"] else ""
    lines = ["# vGPU conformance report (KAR-0003 / KAR-0004)", "",
             "Cluster: %s, %s (%s)" % (cluster.get("server") or "?", cluster.get("kubevirt") or "?",
                                       cluster.get("version") or "?"),
             "Generated: %s, run %s%s" % (report["generated"], report["run_id"], mode), "",
             "**%(pass)d PASS, %(fail)d FAIL, %(unknown)d UNKNOWN** of %(total)d checks" % summary, "",
             "| Check | Requirement | Subject | Status | Why |", "|---|---|---|---|---|"]
    for row in report["checks"]:
        lines.append("| %s | %s | %s | %s | %s |" % tuple(_cell(row[key]) for key in (
            "check", "requirement", "subject", "status", "reason")))
    created = report.get("created") or []
    if created:
        lines += ["", "%s:" % ("Would create" if report["check_mode"] else "Created and deleted again")]
        lines += ["- %s" % item for item in created]
    left = (report.get("cleanup") or {}).get("left") or []
    if left:
        lines += ["", "**Left behind (delete by hand):** %s" % ", ".join(left)]
    lines += monitoring.markdown_lines(report.get("monitoring"))
    lines.append("")
    return "\n".join(lines)


def junit(report):
    summary = report["summary"]
    suites = ET.Element("testsuites", name="accelops.vgpu conformance", tests=str(summary["total"]),
                        failures=str(summary["fail"]), skipped=str(summary["unknown"]), errors="0")
    suite = ET.SubElement(suites, "testsuite", name="KAR-0003/KAR-0004 vGPU conformance", tests=str(summary["total"]),
                          failures=str(summary["fail"]), skipped=str(summary["unknown"]), errors="0",
                          timestamp=report["generated"])
    for row in report["checks"]:
        case = ET.SubElement(suite, "testcase", classname="%s.%s" % (row["requirement"], row["check"]),
                             name=row["subject"])
        if row["status"] == "FAIL":
            ET.SubElement(case, "failure", message=row["reason"], type="FAIL").text = row["reason"]
        elif row["status"] == "UNKNOWN":
            ET.SubElement(case, "skipped", message="UNKNOWN: " + row["reason"])
        else:
            ET.SubElement(case, "system-out").text = row["reason"]
    return ET.tostring(suites, encoding="unicode") + "\n"


def paths(report_dir, name):
    return dict((kind, os.path.join(report_dir, name + suffix)) for kind, suffix in SUFFIXES.items())


def write(report, report_dir, name):
    """Write the three files (each through a temporary file and a rename); returns their paths."""
    files = paths(report_dir, name)
    texts = {"json": json.dumps(report, indent=2, sort_keys=False) + "\n", "markdown": markdown(report),
             "junit": junit(report)}
    for kind, path in files.items():
        write_file(path, texts[kind])
    return files
