"""`gpusim tools DIR`: install the fake sriov-manage and nvidia-smi (stdlib-only single files)."""

from __future__ import annotations

import os

SOURCES = {"sriov-manage": "sriov_manage.py", "nvidia-smi": "nvidia_smi.py"}
_HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_tools")


def install(directory):
    """Write each tool to DIR/<name> with a python3 shebang, executable; returns the paths written."""
    os.makedirs(directory, exist_ok=True)
    written = []
    for name, source in SOURCES.items():
        target = os.path.join(directory, name)
        with open(os.path.join(_HERE, source)) as handle:
            text = handle.read()
        with open(target, "w") as handle:
            handle.write("#!/usr/bin/env python3\n" + text)
        os.chmod(target, 0o755)
        written.append(target)
    return written
