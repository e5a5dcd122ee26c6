"""The skipped tests of JUnit XML reports, one stage per report, and the CI rule on them.

    junit_skips.py [--allow FILE] [--strict] REPORT.xml...

Prints, per report (a stage of tools/test-all.sh), how many tests were skipped and each one with
its reason; a skip matching the allow-list (FILE: `<node id pattern> | <why it may skip on CI>` per
line, fnmatch patterns, `#` comments) is shown with its justification. With --strict (CI=true) any
skip outside the allow-list fails (exit 1): on CI (root, `make system-deps` done) a skip means the
setup is broken, not that the test does not apply.
"""
import argparse
import fnmatch
import os
import sys
import xml.etree.ElementTree as ET


def allow_list(path):
    """[(pattern, justification)] of the allow-list file; a line without a justification is an error."""
    rules = []
    if not path:
        return rules
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            line = line.split("#", 1)[0].strip() if line.lstrip().startswith("#") else line.strip()
            if not line:
                continue
            pattern, dummy, why = (part.strip() for part in line.partition("|"))
            if not pattern or not why:
                sys.exit("%s:%d: want '<node id pattern> | <justification>'" % (path, number))
            rules.append((pattern, why))
    return rules


def skips(report):
    """[(node id, reason)] of the skipped test cases in one JUnit XML report."""
    try:
        root = ET.parse(report).getroot()
    except (OSError, ET.ParseError):
        return []
    found = []
    for case in root.iter("testcase"):
        skipped = case.find("skipped")
        if skipped is None:
            continue
        classname = case.get("classname", "")
        module, dummy, cls = classname.partition(".Test")
        path = module.replace(".", "/") + ".py"
        nodeid = path + ("::Test" + cls if cls else "") + "::" + case.get("name", "")
        found.append((nodeid, (skipped.get("message") or skipped.text or "").strip()))
    return found


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--allow", help="the allow-list file")
    parser.add_argument("--strict", action="store_true", help="fail on a skip outside the allow-list (CI)")
    parser.add_argument("reports", nargs="*")
    args = parser.parse_args(argv)
    rules = allow_list(args.allow)
    refused = []
    for report in args.reports:
        stage = os.path.splitext(os.path.basename(report))[0]
        found = skips(report)
        print("skips in %s: %d" % (stage, len(found)))
        for nodeid, reason in found:
            why = next((why for pattern, why in rules if fnmatch.fnmatchcase(nodeid, pattern)), None)
            if why is None:
                refused.append(nodeid)
            print("  SKIP %s: %s%s" % (nodeid, reason, " (allowed: %s)" % why if why else ""))
    if args.strict and refused:
        print("CI: %d skip(s) outside the allow-list %s; on CI a skip means a broken setup: fix it or "
              "allow it with a justification" % (len(refused), args.allow or "(none)"))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
