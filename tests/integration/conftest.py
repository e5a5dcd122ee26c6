"""Playbook-level test helpers: run ansible-playbook from the checkout against a gpusim node.

    def test_enable(gpusim_node, run_playbook):
        node = gpusim_node("l40s:2,nic:1")
        run = run_playbook([{"name": "enable", "accelops.vgpu.sriov_vfs": {"devices": "all"}}], node)
        assert run.rc == 0 and run.task("enable")["changed"]

The play runs on `localhost` over the local connection with the node's environment (GPUSIM_ROOT and
the fake sriov-manage / nvidia-smi first on PATH). Every module that uses the doc fragment
accelops.vgpu.node_roots gets the node's sysfs_root and dev_root through module_defaults, so tasks
name only their own options. Results come from the ansible.posix.json callback, one per task.
"""

import glob
import json
import os
import subprocess

import pytest
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ANSIBLE_PLAYBOOK = os.path.join(REPO, ".venv", "bin", "ansible-playbook")
COLLECTIONS = os.path.join(REPO, ".build", "collections")
# Modules run like on a GPU host: the system Python (Debian's 3.11), not the controller's venv;
# interpreter discovery would pick a pyenv shim that is not runnable here.
NODE_PYTHON = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else os.path.join(
    REPO, ".venv", "bin", "python")


def node_modules():
    """FQCNs of the collection's modules that take the node roots (sysfs_root, dev_root, proc_root)."""
    found = []
    for path in sorted(glob.glob(os.path.join(REPO, "plugins", "modules", "*.py"))):
        with open(path) as handle:
            if "accelops.vgpu.node_roots" in handle.read():
                found.append("accelops.vgpu." + os.path.basename(path)[:-3])
    return found


class PlaybookRun:
    """rc, stdout, stderr and `results`: one dict per task run (task name under `task`)."""

    def __init__(self, rc, stdout, stderr):
        self.rc, self.stdout, self.stderr = rc, stdout, stderr
        self.results = []
        try:
            report = json.loads(stdout)
        except ValueError:
            return
        for play in report.get("plays", []):
            for task in play.get("tasks", []):
                for result in task.get("hosts", {}).values():
                    self.results.append(dict(result, task=task["task"]["name"]))

    def task(self, name):
        """The result of the task called `name` (the last one, if it ran more than once)."""
        matches = [r for r in self.results if r["task"] == name]
        assert matches, "task %r did not run; ran %s\n%s" % (name, [r["task"] for r in self.results], self.stderr)
        return matches[-1]

    def __repr__(self):
        failed = dict((r["task"], r.get("msg")) for r in self.results if r.get("failed"))
        return "PlaybookRun(rc=%d, tasks=%s, failed=%s, stderr=%r)" % (
            self.rc, [r["task"] for r in self.results], failed, self.stderr[-2000:])


def node_env(node):
    """The process environment for a playbook against `node` (a gpusim.testing.GpuSimNode or None)."""
    return dict(node.env) if node is not None else dict(os.environ)


def playbook(tasks, node=None, play_vars=None):
    play = {"name": "accelops.vgpu integration test", "hosts": "localhost", "gather_facts": False,
            "tasks": tasks}
    if node is not None:
        roots = {"sysfs_root": node.root, "dev_root": node.dev_root}
        play["module_defaults"] = dict((module, roots) for module in node_modules())
    if play_vars:
        play["vars"] = play_vars
    return [play]


@pytest.fixture
def run_playbook(tmp_path):
    """run_playbook(tasks, node=None, check=False, diff=False, extra_vars=None, timeout=300) -> PlaybookRun."""
    counter = [0]

    def run(tasks, node=None, check=False, diff=False, extra_vars=None, timeout=300):
        counter[0] += 1
        path = tmp_path / ("playbook-%d.yml" % counter[0])
        path.write_text(yaml.safe_dump(playbook(tasks, node), sort_keys=False))
        argv = [ANSIBLE_PLAYBOOK, "-i", "localhost,", "-c", "local", str(path)]
        if check:
            argv.append("--check")
        if diff:
            argv.append("--diff")
        if extra_vars:
            argv += ["--extra-vars", json.dumps(extra_vars)]
        env = node_env(node)
        env.update(ANSIBLE_COLLECTIONS_PATH=COLLECTIONS, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"),
                   ANSIBLE_STDOUT_CALLBACK="ansible.posix.json", ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-tmp"),
                   ANSIBLE_REMOTE_TEMP=str(tmp_path / "ansible-tmp"), ANSIBLE_NOCOLOR="1",
                   ANSIBLE_PYTHON_INTERPRETER=NODE_PYTHON)
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout, cwd=str(tmp_path),
                              check=False)
        return PlaybookRun(proc.returncode, proc.stdout, proc.stderr)

    return run
