"""vgpu_driver and the vgpu_host_driver role against a gpusim node, a fake runfile and fake node tools.

gpusim is the kernel (module/nvidia/version, loaded through its ctl channel); the fake modprobe,
modinfo, systemctl and runfile (tests/fakes) record every call, so "no change" and check mode are
proven by the calls that did not happen.
"""

import pytest

from ansible_collections.accelops.vgpu.tests.fakes.driver_tools import changing_calls, make_fake_node, modules_dir
from ansible_collections.accelops.vgpu.tests.fakes.runfile import write_runfile

OLD, NEW = "550.54.16", "570.124.03"


@pytest.fixture
def host(gpusim_node, tmp_path, run_playbook):
    node = gpusim_node("l40s:1")
    node.ctl("driver", "unload")  # a node without a driver
    fake = tmp_path / "fake-node"
    env = make_fake_node(fake, node.root)
    env["PATH"] = env["PATH"].split(":", 1)[0] + ":" + node.env["PATH"]
    node.env.update(env)

    class Host:
        sim, dir = node, fake
        modprobe_dir = tmp_path / "modprobe.d"

        def runfile(self, version, **kwargs):
            return write_runfile(tmp_path, version, **kwargs)

        def driver(self, check=False, diff=False, **options):
            task = {"name": "driver", "accelops.vgpu.vgpu_driver": dict(
                dict(sysfs_root=node.root, proc_root=str(fake / "proc"), modprobe_dir=str(self.modprobe_dir),
                     modules_dir=modules_dir(fake), dev_root=node.dev_root),
                **options)}
            return run_playbook([task], node, check=check, diff=diff).task("driver")

        def kernel_version(self):
            try:
                return node.read("module/nvidia/version")
            except FileNotFoundError:
                return None

        def clear_calls(self):
            (fake / "calls.log").write_text("")

    return Host()


def test_fresh_install_then_rerun_is_no_change(host):
    result = host.driver(runfile=host.runfile(NEW))
    assert result["changed"] and result["version"] == NEW and result["previous_version"] is None
    assert host.kernel_version() == NEW
    host.clear_calls()
    again = host.driver(runfile=host.runfile(NEW))
    assert not again["changed"] and again["actions"] == [] and changing_calls(host.dir) == []


def test_upgrade(host):
    host.driver(runfile=host.runfile(OLD))
    result = host.driver(runfile=host.runfile(NEW))
    assert result["changed"] and result["previous_version"] == OLD and host.kernel_version() == NEW
    assert "unload nvidia_vgpu_vfio nvidia" in result["actions"]


def test_downgrade_is_refused(host):
    host.driver(runfile=host.runfile(NEW))
    host.clear_calls()
    result = host.driver(runfile=host.runfile(OLD))
    assert result.get("failed") and "refusing to downgrade to %s" % OLD in result["msg"]
    assert "\n" not in result["msg"]
    assert host.kernel_version() == NEW and changing_calls(host.dir) == []


def test_wrong_runfile_is_refused_before_any_change(host):
    path = host.runfile(NEW, name="NVIDIA-Linux-x86_64-%s-grid.run" % NEW)
    result = host.driver(runfile=path)
    assert result.get("failed") and result["msg"].startswith("runfile %s: not a vGPU-KVM runfile" % path)
    assert host.kernel_version() is None and changing_calls(host.dir) == []
    assert not host.modprobe_dir.exists()


def test_check_mode_changes_nothing_and_diffs(host):
    host.driver(runfile=host.runfile(OLD))
    host.clear_calls()
    host.sim.clear_log()
    result = host.driver(check=True, diff=True, runfile=host.runfile(NEW))
    assert result["changed"] and result["version"] == NEW
    assert result["diff"]["before"]["version"] == OLD and result["diff"]["after"]["version"] == NEW
    assert "install %s from %s" % (NEW, "NVIDIA-Linux-x86_64-%s-vgpu-kvm.run" % NEW) in result["diff"]["after"]["actions"]
    assert changing_calls(host.dir) == [] and host.kernel_version() == OLD and host.sim.writes() == []


def test_role_copies_the_runfile_and_is_idempotent(host, run_playbook, tmp_path):
    role = {"name": "role", "ansible.builtin.include_role": {"name": "accelops.vgpu.vgpu_host_driver"}}
    role_vars = dict(vgpu_host_driver_runfile_src=host.runfile(NEW),
                     vgpu_host_driver_runfile_dir=str(tmp_path / "cache"),
                     vgpu_host_driver_modprobe_dir=str(host.modprobe_dir),
                     vgpu_host_driver_sysfs_root=host.sim.root,
                     vgpu_host_driver_proc_root=str(host.dir / "proc"),
                     vgpu_host_driver_modules_dir=modules_dir(host.dir), vgpu_host_driver_dev_root=host.sim.dev_root)
    # check mode on a fresh node: only the copy reports a change, nothing is written
    checked = run_playbook([role], host.sim, check=True, extra_vars=role_vars)
    assert checked.rc == 0, checked
    assert checked.task("accelops.vgpu.vgpu_host_driver : Copy the runfile to the node")["changed"]
    assert checked.task("accelops.vgpu.vgpu_host_driver : Install, upgrade or remove the NVIDIA vGPU manager")[
        "skipped"]
    assert not (tmp_path / "cache").exists() and changing_calls(host.dir) == [] and host.kernel_version() is None
    first = run_playbook([role], host.sim, extra_vars=role_vars)
    assert first.rc == 0, first
    assert host.kernel_version() == NEW
    assert (tmp_path / "cache" / ("NVIDIA-Linux-x86_64-%s-vgpu-kvm.run" % NEW)).is_file()
    host.clear_calls()
    second = run_playbook([role], host.sim, extra_vars=role_vars)
    assert second.rc == 0 and not [r for r in second.results if r.get("changed")], second
    assert changing_calls(host.dir) == []
