"""Sum JUnit XML reports into one closing line: 'tests: N passed, N failed, N skipped'."""
import sys
import xml.etree.ElementTree as ET

passed = failed = skipped = 0
for path in sys.argv[1:]:
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        continue
    for suite in root.iter("testsuite"):
        total = int(suite.get("tests", 0))
        bad = int(suite.get("failures", 0)) + int(suite.get("errors", 0))
        skip = int(suite.get("skipped", 0))
        failed += bad
        skipped += skip
        passed += total - bad - skip
print(f"tests: {passed} passed, {failed} failed, {skipped} skipped")
sys.exit(1 if failed or not passed else 0)
