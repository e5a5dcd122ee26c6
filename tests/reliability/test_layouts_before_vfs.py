"""A layout that cannot fit a GPU whose VFs are not enabled yet writes nothing, not even the VFs
(sriov-manage rebinds the PF): the node CLI's apply (which enables VFs itself), its --check, and the
vgpu_profile module in check mode all refuse it in one line naming the GPU, before the first write."""

from __future__ import annotations

import pytest

from ansible_collections.accelops.vgpu.tests.reliability import cli_runs
from ansible_collections.accelops.vgpu.tests.reliability.assertions import one_line_naming
from ansible_collections.accelops.vgpu.tests.reliability.module_runs import run_module
from gpusim.testing import GpuSimNode

PF = "0000:41:00.0"
# id -> (layout, what the one line must say besides the GPU)
LAYOUTS = {
    "three-24q-on-a-48gb-l40s": ([{"devices": [PF], "profiles": {"L40S-24Q": 3}}], "the GPU has 48 GB"),
    "profile-of-another-model": ([{"devices": [PF], "profiles": {"A16-4Q": 1}}], "A16-4Q"),
    "profile-the-gpu-lacks": ([{"devices": [PF], "profiles": {"L40S-7Q": 1}}], "L40S-7Q"),
    "mixed-sizes-without-mixed-size": ([{"devices": [PF], "profiles": {"L40S-24Q": 1, "L40S-12Q": 2}}],
                                       "different framebuffer sizes"),
    "more-vgpus-than-vfs": ([{"device_filter": "0x26B910DE", "profiles": {"L40S-1Q": 33}}], "only 32 slots"),
}
SURFACES = ("cli-apply", "cli-apply-check", "module-check-mode")


@pytest.fixture(scope="module")
def fresh():
    """An L40S whose VFs were never enabled; a case that wrote (a bug) is undone by a simulated reboot."""
    with GpuSimNode("l40s:1") as node:
        yield node


@pytest.fixture(scope="module")
def pyz(tmp_path_factory):
    return cli_runs.build(tmp_path_factory.mktemp("node-cli"))


def attempt(surface, node, pyz, tmp_path, layout):
    """(failed, the one line) of one surface on `layout`."""
    if surface == "module-check-mode":
        run = run_module("vgpu_profile", {"layout": layout, "sysfs_root": node.root, "dev_root": node.dev_root},
                         env=node.env, check=True)
        return run.failed, run.message
    extra = ["--check"] if surface == "cli-apply-check" else []
    proc = cli_runs.run_verb(pyz, node, "apply", "--config", cli_runs.write_layout(tmp_path, layout), *extra)
    return proc.returncode == 2 and proc.stdout == "", proc.stderr.rstrip("\n") or proc.stdout


@pytest.mark.parametrize("surface", SURFACES)
@pytest.mark.parametrize("case", sorted(LAYOUTS))
def test_a_layout_that_cannot_fit_writes_nothing_before_the_vfs_exist(fresh, pyz, tmp_path, failure_writes,
                                                                      surface, case):
    layout, says = LAYOUTS[case]
    fresh.clear_log()
    try:
        failed, message = attempt(surface, fresh, pyz, tmp_path, layout)
    finally:
        attempts = failure_writes.gpusim(fresh)
        if attempts:
            fresh.ctl("reboot")
    assert failed and attempts == [], message
    one_line_naming(message, PF)
    assert says in message, message
    assert fresh.state()["pfs"][0]["numvfs"] == 0 and fresh.state()["pfs"][0]["driver"] == "nvidia"


def test_a_gpu_nothing_can_describe_fails_closed(pyz, tmp_path, failure_writes):
    """H200 without nvidia-smi: not in the catalog, the driver cannot list its types: refuse, write nothing."""
    with GpuSimNode("h200:1") as node:
        tools = tmp_path / "tools"
        tools.mkdir()
        (tools / "sriov-manage").symlink_to(node.tools_dir + "/sriov-manage")
        node.env["PATH"] = str(tools) + ":/usr/bin:/bin"   # sriov-manage, but no nvidia-smi
        proc = cli_runs.run_verb(pyz, node, "apply", "--config",
                                 cli_runs.write_layout(tmp_path, [{"profiles": {"H200X-70C": 2}}]))
        attempts = failure_writes.gpusim(node)
    assert proc.returncode == 2 and attempts == [], proc.stdout + proc.stderr
    one_line_naming(proc.stderr.rstrip("\n"), "cannot check the layout before its VFs are enabled")
