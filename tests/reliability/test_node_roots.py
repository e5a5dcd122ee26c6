"""A node root that is missing or not what it should be (a typo in a boot unit, a DaemonSet mount that
went elsewhere) is one line naming it, in every node module, every node CLI verb and the agent, and
nothing is written: never "no GPU, nothing to do", never "no VF is held". Writes are observed in the
lab node's write log and below the case's tmp_path, where the broken root (and all else it was
given) lives: a write into the wrong root counts."""

from __future__ import annotations

import os
import subprocess

import pytest

from ansible_collections.accelops.vgpu.tests.reliability import cli_runs
from ansible_collections.accelops.vgpu.tests.reliability.assertions import one_line_naming
from ansible_collections.accelops.vgpu.tests.reliability.module_runs import run_module

LAYOUT = [{"device_filter": "0x26B910DE", "profiles": {"L40S-24Q": 2}}]
# broken root -> (option, how the path is made below the case's tmp_path, what the line says)
BROKEN = {
    "sysfs-missing": ("sysfs_root", "typo", "no such directory"),
    "sysfs-not-a-sysfs": ("sysfs_root", "empty-dir", "no bus/pci/devices below it"),
    "sysfs-a-file": ("sysfs_root", "a-file", "not a directory"),
    "dev-missing": ("dev_root", "typo", "no such directory"),
    "proc-missing": ("proc_root", "typo", "no such directory"),
}
MODULES = {
    "sriov_vfs": {"devices": ["all"]},
    "vgpu_profile": {"layout": LAYOUT},
    "vgpu_facts": {},
    "vgpu_driver": {"runfile": "{tmp}/NVIDIA-Linux-x86_64-570.172.07-vgpu-kvm.run", "modprobe_dir": "{tmp}/modprobe.d"},
}
# Every node module takes all three roots.
# Check mode too, for the modules that write: the verdict must not depend on it.
MODULE_ROWS = [pytest.param(module, broken, False, id="%s-%s" % (module, broken)) for module in MODULES
               for broken in BROKEN] + [
    pytest.param(module, broken, True, id="check-%s-%s" % (module, broken))
    for module, broken in (("sriov_vfs", "dev-missing"), ("vgpu_profile", "dev-missing"),
                           ("vgpu_profile", "sysfs-not-a-sysfs"))]


def broken_path(tmp_path, kind):
    path = tmp_path / kind
    if kind == "empty-dir":
        path.mkdir()
    elif kind == "a-file":
        path.write_text("")
    return str(path)


def roots(lab, tmp_path, broken, module=None):
    option, kind, dummy = BROKEN[broken]
    given = {"sysfs_root": lab.node.root, "dev_root": lab.node.dev_root, "proc_root": "/proc"}
    given[option] = broken_path(tmp_path, kind)
    return given, given[option]


def expect(broken, path):
    option, dummy, says = BROKEN[broken]
    return "%s %s: %s" % (option, path, says)


def module_args(module, tmp_path):
    return dict((k, v.replace("{tmp}", str(tmp_path)) if isinstance(v, str) else v) for k, v in MODULES[module].items())


@pytest.mark.parametrize("module,broken,check", MODULE_ROWS)
def test_every_node_module_fails_on_an_unusable_root_without_writes(lab, tmp_path, failure_writes, module, broken,
                                                                    check):
    given, path = roots(lab, tmp_path, broken, module)
    lab.node.clear_log()
    failure_writes.files(tmp_path)
    run = run_module(module, dict(module_args(module, tmp_path), **given), env=lab.node.env, check=check)
    attempts, written = failure_writes.gpusim(lab.node), failure_writes.changed()
    assert run.failed and attempts == [] and written == [], run.message
    one_line_naming(run.message, expect(broken, path))


@pytest.fixture(scope="module")
def pyz(tmp_path_factory):
    return cli_runs.build(tmp_path_factory.mktemp("node-cli"))


def run_cli(pyz, node, verb, given, *args, env=None):
    argv = [cli_runs.NODE_PYTHON, pyz, verb] + list(args)
    for option, value in given.items():
        argv += ["--" + option.replace("_", "-"), value]
    return subprocess.run(argv, env=dict(node.env, **(env or {})), capture_output=True, text=True, timeout=120,
                          check=False)


@pytest.mark.parametrize("verb", ["apply", "assert", "export"])
@pytest.mark.parametrize("broken", ["sysfs-missing", "sysfs-not-a-sysfs", "dev-missing", "proc-missing"])
def test_every_cli_verb_exits_2_on_an_unusable_root_without_writes(lab, pyz, tmp_path, failure_writes, verb, broken):
    given, path = roots(lab, tmp_path, broken)
    args = ["--config", cli_runs.write_layout(tmp_path, LAYOUT)] if verb != "export" else []
    lab.node.clear_log()
    failure_writes.files(tmp_path)
    proc = run_cli(pyz, lab.node, verb, given, *args)
    attempts, written = failure_writes.gpusim(lab.node), failure_writes.changed()
    assert proc.returncode == 2 and proc.stdout == "" and attempts == [] and written == [], proc.stdout + proc.stderr
    one_line_naming(proc.stderr.rstrip("\n"), expect(broken, path))


@pytest.mark.parametrize("broken", ["sysfs-not-a-sysfs", "dev-missing", "proc-missing"])
def test_the_agent_does_not_start_on_an_unusable_root(lab, pyz, tmp_path, failure_writes, broken):
    given, path = roots(lab, tmp_path, broken)
    env = {"NODE_NAME": "gpu-a", "CONFIG_FILE": cli_runs.write_layout(tmp_path, LAYOUT),
           "DEFAULT_VGPU_CONFIG": "default", "KUBECONFIG": str(tmp_path / "kubeconfig")}
    lab.node.clear_log()
    failure_writes.files(tmp_path)
    proc = run_cli(pyz, lab.node, "agent", given, env=env)
    attempts, written = failure_writes.gpusim(lab.node), failure_writes.changed()
    assert proc.returncode == 2 and attempts == [] and written == [], proc.stdout + proc.stderr
    one_line_naming(proc.stderr.rstrip("\n"), expect(broken, path))
    assert not os.path.exists(tmp_path / "kubeconfig")
