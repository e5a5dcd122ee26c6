"""The node CLI zipapp (what the boot unit and the vGPU manager image run) as real processes.

Each apply is its own process group, so a test can SIGKILL it together with the sriov-manage it
started, exactly as a node losing the process would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NODE_PYTHON = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else os.path.join(
    REPO, ".venv", "bin", "python")


def build(directory):
    """Build the zipapp into `directory`; returns its path."""
    out = os.path.join(str(directory), "accelops-vgpu.pyz")
    subprocess.run([NODE_PYTHON, os.path.join(REPO, "tools", "build-node-cli.py"), out], check=True,
                   capture_output=True)
    return out


def write_layout(directory, layout, name="layout.json"):
    path = os.path.join(str(directory), name)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump({"layout": layout}, handle)
    return path


def argv(pyz, node, verb, *args):
    return [NODE_PYTHON, pyz, verb] + list(args) + ["--sysfs-root", node.root, "--dev-root", node.dev_root]


def run_verb(pyz, node, verb, *args):
    """Run a verb to completion (assert, export, apply)."""
    return subprocess.run(argv(pyz, node, verb, *args), env=node.env, capture_output=True, text=True, timeout=120,
                          check=False)


class Apply:
    """`accelops-vgpu apply --config FILE` on a gpusim node, started in the background."""

    def __init__(self, pyz, node, config, *extra):
        self.started = time.monotonic()
        self.proc = subprocess.Popen(argv(pyz, node, "apply", "--config", config, *extra), env=node.env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.stdout = self.stderr = None
        self.seconds = None

    def wait(self, timeout=120):
        self.stdout, self.stderr = self.proc.communicate(timeout=timeout)
        self.seconds = time.monotonic() - self.started
        return self.proc.returncode

    def kill(self):
        """SIGKILL the apply and everything it started (its process group)."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.communicate(timeout=30)


def wait_until(predicate, timeout=30.0, interval=0.05):
    """Poll `predicate` until it is true; False after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False
