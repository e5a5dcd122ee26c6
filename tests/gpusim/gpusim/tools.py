"""`gpusim tools DIR`: install the fake sriov-manage and nvidia-smi (stdlib-only single files)."""

from __future__ import annotations

import os
import shutil

SOURCES = {"sriov-manage": "sriov_manage.py", "nvidia-smi": "nvidia_smi.py"}
_HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_tools")


def install(directory):
    """Copy each tool to DIR/<name>, executable; returns the paths written."""
    os.makedirs(directory, exist_ok=True)
    written = []
    for name, source in SOURCES.items():
        target = os.path.join(directory, name)
        shutil.copyfile(os.path.join(_HERE, source), target)
        os.chmod(target, 0o755)
        written.append(target)
    return written
