"""The suite's own layout: a newcomer's plain `pytest` from the repository root collects all of it.

The test directories are not packages (pytest's default `prepend` import mode), so two test modules
with the same file name anywhere under tests/ break collection of a run that sees both
("import file mismatch"); pytest.ini's testpaths name every pytest directory."""

from __future__ import annotations

import collections
import configparser
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SKIP = {".venv", ".build", ".cache", "__pycache__", "molecule", ".hypothesis"}


def python_test_modules():
    found = collections.defaultdict(list)
    for directory, dirs, names in os.walk(os.path.join(ROOT, "tests")):
        dirs[:] = [d for d in dirs if d not in SKIP and not d.endswith(".egg-info")]
        for name in names:
            if (name.startswith("test_") and name.endswith(".py")) or name == "conftest.py":
                found[name].append(os.path.relpath(os.path.join(directory, name), ROOT))
    return found


def test_every_test_module_name_is_unique():
    clashes = {name: paths for name, paths in python_test_modules().items() if len(paths) > 1 and name != "conftest.py"}
    assert clashes == {}


def test_testpaths_cover_every_pytest_directory():
    config = configparser.ConfigParser()
    config.read(os.path.join(ROOT, "pytest.ini"))
    testpaths = config["pytest"]["testpaths"].split()
    uncovered = [path for paths in python_test_modules().values() for path in paths
                 if not any(path.startswith(top.rstrip("/") + "/") for top in testpaths)]
    assert uncovered == []
