"""Run modules as Ansible does (JSON args on stdin, JSON result), playbooks verbosely, and the API
server process.

Unlike the integration helper, a module that crashes is not an assertion error here but a result:
its message is its whole output, so the one-line check reports the traceback as what users see.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import yaml

from ansible_collections.accelops.vgpu.tests.integration import conftest as integration
from ansible_collections.accelops.vgpu.tests.integration.cluster.cluster_helpers import INJECT_INVOCATION, ROOT

COLLECTIONS = ROOT / ".build" / "collections"
MODULES = "ansible_collections.accelops.vgpu.plugins.modules."


class ModuleRun:
    def __init__(self, rc, stdout, stderr):
        self.rc, self.stdout, self.stderr = rc, stdout, stderr
        try:
            self.result = json.loads(stdout[stdout.index("{"):])
        except ValueError:
            self.result = None

    @property
    def failed(self):
        return self.rc != 0

    @property
    def message(self):
        """What the user reads: the module's msg, or everything it printed when it crashed."""
        if self.result is not None and "msg" in self.result:
            return self.result["msg"]
        return (self.stdout + self.stderr).strip()


def run_module(module, args, env=None, check=False):
    """The module's result carries its `invocation` (arguments), as with ANSIBLE_INJECT_INVOCATION."""
    payload = {"ANSIBLE_MODULE_ARGS": dict(args, _ansible_check_mode=check, **INJECT_INVOCATION)}
    environ = dict((k, v) for k, v in (env or os.environ).items() if not k.startswith("K8S_AUTH_"))
    environ["PYTHONPATH"] = str(COLLECTIONS)
    proc = subprocess.run([sys.executable, "-m", MODULES + module], input=json.dumps(payload),
                          capture_output=True, text=True, env=environ, timeout=120, check=False)
    return ModuleRun(proc.returncode, proc.stdout, proc.stderr)


def run_playbook_verbose(tasks, tmp_path, play_vars=None, python=integration.NODE_PYTHON, verbosity="-vvv"):
    """ansible-playbook with the default callback at `verbosity` (what an operator pastes into a
    ticket), module invocations (their arguments) injected into the results; returns the CompletedProcess. The play is integration.playbook()'s, on localhost;
    cluster modules need `python=sys.executable` (the controller's, with the kubernetes client)."""
    path = tmp_path / "verbose-playbook.yml"
    path.write_text(yaml.safe_dump(integration.playbook(tasks, None, play_vars), sort_keys=False))
    environ = dict(os.environ)
    environ.update(ANSIBLE_COLLECTIONS_PATH=str(COLLECTIONS), ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
                   ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-tmp"), ANSIBLE_REMOTE_TEMP=str(tmp_path / "ansible-tmp"),
                   ANSIBLE_NOCOLOR="1", ANSIBLE_PYTHON_INTERPRETER=python,
                   ANSIBLE_INJECT_INVOCATION="1")
    environ.pop("ANSIBLE_STDOUT_CALLBACK", None)
    argv = [integration.ANSIBLE_PLAYBOOK, "-i", "localhost,", "-c", "local", "--diff", verbosity, str(path)]
    return subprocess.run(argv, capture_output=True, text=True, env=environ, timeout=300, cwd=str(tmp_path),
                          check=False)
