"""A driver upgrade on a gpusim node whose vGPU manager runs (fake modprobe/systemctl/runfile, tests/fakes):
refused before the first stop while a VM holds a VF (0 writes), and every failure after the first stop
restores the old modules and services, verified on the node (gpusim's loaded driver, the service markers)."""

from __future__ import annotations

import os

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine.nvdriver import DEFAULT_SERVICES, DriverManager
from ansible_collections.accelops.vgpu.plugins.module_utils.runner import CommandRunner
from ansible_collections.accelops.vgpu.tests.fakes.driver_tools import (
    fail_calls, hold, make_fake_node, modules_dir)
from ansible_collections.accelops.vgpu.tests.fakes.runfile import write_runfile
from ansible_collections.accelops.vgpu.tests.reliability import node_lab
from ansible_collections.accelops.vgpu.tests.reliability.assertions import one_line_naming

OLD, NEW = "550.54.16", "570.124.03"
PF, HELD = "0000:41:00.0", "0000:41:00.4"


@pytest.fixture
def host(gpusim_node, monkeypatch, tmp_path):
    """One L40S running the OLD vGPU manager (modules loaded, services active), its VFs enabled."""
    node = gpusim_node("l40s:1")
    node.ctl("driver", "unload")
    fake = tmp_path / "node"
    env = make_fake_node(fake, node.root)
    env["PATH"] = env["PATH"].split(":", 1)[0] + ":" + node_lab.environment(node)["PATH"]
    for name, value in env.items():
        monkeypatch.setenv(name, value)

    class Host:
        sim, dir = node, fake

        def apply(self, version, **overrides):
            params = dict(state="present", runfile=write_runfile(tmp_path, version, **overrides.pop("runfile", {})),
                          dkms=False, allow_downgrade=False, installer_args=[], blacklist_nouveau=False,
                          load_modules=True, manage_services=True, services=list(DEFAULT_SERVICES))
            params.update(overrides)
            return DriverManager(CommandRunner(timeout=60), node.root, str(tmp_path / "modprobe.d"),
                                 str(fake / "proc"), node.dev_root, modules_dir(fake)).apply(params)

        def running(self):
            """(loaded driver version, active services) as the node says."""
            active = sorted(p.name[:-len(".active")] for p in (fake / "systemd").glob("*.active"))
            return node.state()["nvidia"].get("version") if node.state()["nvidia"]["loaded"] else None, active

    host = Host()
    host.apply(OLD)
    node_lab.run_sriov(node_lab.Lab(node, tmp_path / "cache"), devices=[PF])
    (fake / "calls.log").write_text("")
    node.clear_log()
    return host


def test_upgrade_under_a_held_vf_is_refused_without_a_write(host, failure_writes):
    # QEMU holds the VF's VFIO group (the fake tools' process table is the node's /proc here)
    group = os.path.basename(os.readlink(host.sim.device_path(HELD, "iommu_group")))
    pid = hold(host.dir, os.path.join(host.sim.dev_root, "vfio", group))
    with pytest.raises(EngineError) as caught:
        host.apply(NEW)
    writes = failure_writes.node_calls(host.dir) + failure_writes.gpusim(host.sim)
    assert writes == [] and host.running() == (OLD, sorted(DEFAULT_SERVICES))
    one_line_naming(str(caught.value), "%s held by pid %d" % (HELD, pid))


@pytest.mark.no_failure_path("recovery cases: the writes after the first stop are the rollback; the case checks "
                             "the restored modules and services")
@pytest.mark.parametrize("fault", ["unload-in-use", "installer-fails"])
def test_a_failure_after_the_first_stop_restores_the_running_manager(host, fault):
    if fault == "unload-in-use":
        fail_calls(host.dir, "modprobe", "-r", "modprobe: FATAL: Module nvidia is in use.")
        runfile = {}
    else:
        runfile = {"fail_install": True}
    with pytest.raises(EngineError) as caught:
        host.apply(NEW, runfile=runfile)
    one_line_naming(str(caught.value), "driver %s" % OLD)
    assert "restored: " in str(caught.value)
    assert host.running() == (OLD, sorted(DEFAULT_SERVICES))
