"""tools/junit_skips.py: skips listed per stage; on CI (--strict) a skip outside the allow-list fails."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "tools", "junit_skips.py")
REPORT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="3" skipped="2">
<testcase classname="tests.gpusim.tests.test_podman" name="test_runs[a]"><skipped type="pytest.skip"
 message="podman cannot run containers here">skip</skipped></testcase>
<testcase classname="tests.unit.test_x.TestY" name="test_z"><skipped message="no Debian python3 here"/></testcase>
<testcase classname="tests.unit.test_x" name="test_ok"/></testsuite></testsuites>"""


def run(tmp_path, *args, allow=None):
    (tmp_path / "units.xml").write_text(REPORT)
    argv = [sys.executable, TOOL] + list(args) + [str(tmp_path / "units.xml")]
    if allow is not None:
        (tmp_path / "allow.txt").write_text(allow)
        argv[2:2] = ["--allow", str(tmp_path / "allow.txt")]
    return subprocess.run(argv, capture_output=True, text=True, check=False)


def test_skips_are_listed_per_stage_and_only_fail_with_strict(tmp_path):
    proc = run(tmp_path)
    assert proc.returncode == 0
    assert proc.stdout.splitlines() == [
        "skips in units: 2",
        "  SKIP tests/gpusim/tests/test_podman.py::test_runs[a]: podman cannot run containers here",
        "  SKIP tests/unit/test_x.py::TestY::test_z: no Debian python3 here"]
    assert run(tmp_path, "--strict").returncode == 1


def test_an_allowed_skip_shows_its_justification_and_passes_ci(tmp_path):
    allow = "# comment\ntests/unit/test_x.py::TestY::* | the Y tests need Z, which CI cannot have\n"
    proc = run(tmp_path, "--strict", allow=allow)
    assert proc.returncode == 1 and "1 skip(s) outside the allow-list" in proc.stdout
    assert "(allowed: the Y tests need Z, which CI cannot have)" in proc.stdout
    allow += "tests/gpusim/tests/test_podman.py::* | podman needs a kernel feature\n"
    assert run(tmp_path, "--strict", allow=allow).returncode == 0


def test_an_allow_line_without_a_justification_is_an_error(tmp_path):
    proc = run(tmp_path, allow="tests/unit/test_x.py::*\n")
    assert proc.returncode == 1 and "want '<node id pattern> | <justification>'" in proc.stderr
