import os

import pytest

from fake_node import FakeNode

from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import nvdriver
from ansible_collections.accelops.vgpu.plugins.module_utils.runner import CommandRunner
from ansible_collections.accelops.vgpu.tests.fakes.driver_tools import (
    FAKE_KERNEL, changing_calls, fail_calls, make_fake_node, modules_dir, read_calls)
from ansible_collections.accelops.vgpu.tests.fakes.runfile import write_runfile

OLD, NEW = "550.54.16", "570.124.03"
SERVICES = ["nvidia-vgpud.service", "nvidia-vgpu-mgr.service"]


@pytest.fixture
def node(tmp_path, monkeypatch):
    """A plain-directory sysfs (FakeNode: devices, /dev, processes) + fake tools; returns a helper namespace."""
    devices = FakeNode(tmp_path)
    sysfs = devices.sys
    (sysfs / "module").mkdir(parents=True)
    fake = tmp_path    # the fake tools share FakeNode's proc/ (modules, osrelease, processes)
    for key, value in make_fake_node(fake, sysfs).items():
        monkeypatch.setenv(key, value)

    class Node:
        root, dir, modprobe_dir, sim, kubelet_dir = sysfs, fake, tmp_path / "modprobe.d", devices, tmp_path / "kubelet"

        def runfile(self, version, **kwargs):
            (tmp_path / "runfiles").mkdir(exist_ok=True)
            return write_runfile(tmp_path / "runfiles", version, **kwargs)

        def manager(self):
            return nvdriver.DriverManager(CommandRunner(), str(sysfs), str(self.modprobe_dir), str(fake / "proc"),
                                          str(devices.dev), modules_dir(fake), str(self.kubelet_dir))

        def run(self, check_mode=False, **overrides):
            params = dict(state="present", runfile=None, dkms=False, allow_downgrade=False, installer_args=[],
                          blacklist_nouveau=True, load_modules=True, manage_services=True, services=SERVICES)
            params.update(overrides)
            return self.manager().apply(params, check_mode=check_mode)

        def loaded_version(self):
            path = sysfs / "module/nvidia/version"
            return path.read_text().strip() if path.exists() else None

        def clear_calls(self):
            (fake / "calls.log").write_text("")

    return Node()


def install(node, version):
    node.run(runfile=node.runfile(version))
    node.clear_calls()


def test_fresh_install_runs_the_runfile_silently_then_loads_and_starts(node):
    result = node.run(runfile=node.runfile(NEW))
    assert result["changed"] and result["previous_version"] is None and result["version"] == NEW
    assert node.loaded_version() == NEW
    assert (node.root / "module/nvidia_vgpu_vfio").is_dir()
    calls = changing_calls(node.dir)
    assert calls[0] == ["runfile", NEW, "--ui=none", "--no-questions", "--silent"]
    assert calls[1:3] == [["modprobe", "nvidia"], ["modprobe", "nvidia_vgpu_vfio"]]
    assert calls[3:] == [["systemctl", verb, unit] for unit in SERVICES for verb in ("enable", "start")]
    blacklist = node.modprobe_dir / nvdriver.BLACKLIST_NAME
    assert "blacklist nouveau" in blacklist.read_text()
    assert oct(blacklist.stat().st_mode & 0o7777) == "0o644"


def test_already_installed_is_no_change_and_no_changing_call(node):
    install(node, NEW)
    result = node.run(runfile=node.runfile(NEW))
    assert not result["changed"] and result["actions"] == []
    assert changing_calls(node.dir) == []


def test_upgrade_stops_unloads_installs_and_reloads(node):
    install(node, OLD)
    result = node.run(runfile=node.runfile(NEW))
    assert result["changed"] and result["previous_version"] == OLD and node.loaded_version() == NEW
    calls = changing_calls(node.dir)
    assert calls[:3] == [["systemctl", "stop", SERVICES[0]], ["systemctl", "stop", SERVICES[1]],
                         ["modprobe", "-r", "nvidia_vgpu_vfio", "nvidia"]]
    assert calls[3][:2] == ["runfile", NEW]


def test_downgrade_is_refused_without_any_change(node):
    install(node, NEW)
    with pytest.raises(nvdriver.DriverError, match="refusing to downgrade to %s" % OLD) as err:
        node.run(runfile=node.runfile(OLD))
    assert "\n" not in str(err.value)
    assert changing_calls(node.dir) == [] and node.loaded_version() == NEW


def test_downgrade_with_allow_downgrade(node):
    install(node, NEW)
    assert node.run(runfile=node.runfile(OLD), allow_downgrade=True)["changed"]
    assert node.loaded_version() == OLD


@pytest.mark.parametrize("make, message", [
    (lambda n: str(n.root / "NVIDIA-Linux-x86_64-570.124.03-vgpu-kvm.run"), "no such file"),
    (lambda n: n.runfile(NEW, name="NVIDIA-Linux-x86_64-570.124.03.run"), "not a vGPU-KVM runfile name"),
    (lambda n: n.runfile(NEW, makeself=False), "not a makeself archive"),
    (lambda n: n.runfile(NEW, reported=OLD), "its name says %s but '--version' reports %s" % (NEW, OLD)),
])
def test_wrong_runfile_fails_in_one_line_before_any_write(node, make, message):
    path = make(node)
    with pytest.raises(nvdriver.DriverError, match=message) as err:
        node.run(runfile=path)
    assert path in str(err.value) and "\n" not in str(err.value)
    assert changing_calls(node.dir) == [] and not node.modprobe_dir.exists()


def test_aie_runfile_is_accepted(node):
    assert node.run(runfile=node.runfile(NEW, aie=True))["version"] == NEW


def test_check_mode_makes_no_change_and_reports_the_same_plan(node):
    install(node, OLD)
    path = node.runfile(NEW)
    checked = node.run(check_mode=True, runfile=path)
    assert changing_calls(node.dir) == [] and node.loaded_version() == OLD
    real = node.run(runfile=path)
    assert checked["changed"] and checked["actions"] == real["actions"]
    assert checked["after"]["version"] == NEW and checked["before"]["version"] == OLD


def test_check_mode_on_a_bare_node_writes_no_blacklist(node):
    assert node.run(check_mode=True, runfile=node.runfile(NEW))["changed"]
    assert not node.modprobe_dir.exists() and changing_calls(node.dir) == []
    assert ["runfile", NEW, "--version"] in read_calls(node.dir)


def test_blacklist_mode_is_repaired(node):
    install(node, NEW)
    os.chmod(node.modprobe_dir / nvdriver.BLACKLIST_NAME, 0o600)
    result = node.run(runfile=node.runfile(NEW))
    assert result["actions"] == ["blacklist nouveau in %s" % (node.modprobe_dir / nvdriver.BLACKLIST_NAME)]
    assert oct((node.modprobe_dir / nvdriver.BLACKLIST_NAME).stat().st_mode & 0o7777) == "0o644"


def test_stopped_service_is_started_without_reinstall(node):
    install(node, NEW)
    os.unlink(node.dir / "systemd" / (SERVICES[1] + ".active"))
    result = node.run(runfile=node.runfile(NEW))
    assert result["actions"] == ["start %s" % SERVICES[1]]
    assert changing_calls(node.dir) == [["systemctl", "start", SERVICES[1]]]


def test_without_services_and_with_dkms_and_extra_args(node):
    node.run(runfile=node.runfile(NEW), manage_services=False, dkms=True, installer_args=["--no-drm"])
    calls = changing_calls(node.dir)
    assert calls[0][2:] == ["--ui=none", "--no-questions", "--silent", "--dkms", "--no-drm"]
    assert not [call for call in calls if call[0] == "systemctl"]


def test_installed_but_unloaded_driver_is_loaded_not_reinstalled(node):
    install(node, NEW)
    CommandRunner().run(["modprobe", "-r", "nvidia_vgpu_vfio", "nvidia"])  # as after a reboot
    result = node.run(runfile=node.runfile(NEW))
    assert result["previous_version"] == NEW and result["actions"] == ["load nvidia", "load nvidia_vgpu_vfio"]
    assert node.loaded_version() == NEW


def test_failed_install_is_one_line(node):
    with pytest.raises(nvdriver.DriverError, match="Unable to build the NVIDIA kernel module") as err:
        node.run(runfile=node.runfile(NEW, fail_install=True))
    assert "\n" not in str(err.value) and str(err.value).endswith("nothing to restore (nothing ran before)")


def test_absent_uninstalls_and_is_then_idempotent(node):
    install(node, NEW)
    result = node.run(state="absent")
    assert result["changed"] and result["previous_version"] == NEW and node.loaded_version() is None
    # nvidia-uninstall (dropped by the install) hands over to the runfile's --uninstall
    assert changing_calls(node.dir)[-1] == ["runfile", NEW, "--uninstall", "--ui=none", "--no-questions", "--silent"]
    assert not (node.dir / "installed_version").exists()
    node.clear_calls()
    assert not node.run(state="absent")["changed"] and changing_calls(node.dir) == []


def test_absent_with_a_runfile_uses_its_uninstall(node):
    install(node, NEW)
    result = node.run(state="absent", runfile=node.runfile(NEW), manage_services=False)
    assert result["actions"] == ["unload nvidia_vgpu_vfio nvidia", "uninstall driver %s" % NEW]
    assert changing_calls(node.dir)[-1][:3] == ["runfile", NEW, "--uninstall"]
    assert result["version"] is None and node.loaded_version() is None


def test_absent_without_uninstaller_names_the_tool(node, monkeypatch):
    install(node, NEW)
    os.unlink(node.dir / "bin" / "nvidia-uninstall")
    monkeypatch.setattr(nvdriver, "_which", lambda runner, name: None if name == "nvidia-uninstall"
                        else runner.which(name))
    with pytest.raises(nvdriver.DriverError, match="nvidia-uninstall: not found"):
        node.run(state="absent")
    assert node.loaded_version() == NEW


# --- the promise: never take the vGPU from a running VM; a failure leaves the node as it was ---------------

def held_vf(node):
    """An L40S-like PF with 4 vendor-VFIO VFs; a VM (a process) holds the second one."""
    node.sim.pf("0000:41:00.0", total=4)
    node.sim.set_numvfs("0000:41:00.0", 4)
    return node.sim.hold(node.sim.group_of("0000:41:00.5"))


def services_active(node):
    return sorted(p.name for p in (node.dir / "systemd").glob("*.active"))


@pytest.mark.parametrize("check_mode", [False, True])
def test_upgrade_with_a_held_vf_is_refused_naming_it_and_touches_nothing(node, check_mode):
    install(node, OLD)
    pid = held_vf(node)
    with pytest.raises(nvdriver.DriverError, match="refusing to install %s while the vGPU stack is in use" % NEW) as err:
        node.run(check_mode=check_mode, runfile=node.runfile(NEW))
    assert "0000:41:00.5 held by pid %d" % pid in str(err.value) and "\n" not in str(err.value)
    assert changing_calls(node.dir) == [] and node.loaded_version() == OLD
    assert services_active(node) == sorted(name + ".active" for name in SERVICES)


@pytest.mark.parametrize("check_mode", [False, True])
def test_upgrade_with_a_prepared_dra_claim_is_refused_naming_it(node, check_mode):
    """No process holds the VF yet, but a claim prepared for it means its VM may start any moment."""
    from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.checkpoint import COMPLETED, Checkpoint
    from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders.claim_holders import plugin_dir

    install(node, OLD)
    node.sim.pf("0000:41:00.0", total=2)
    node.sim.set_numvfs("0000:41:00.0", 2)
    claim = Checkpoint(plugin_dir(str(node.kubelet_dir)))
    claim.set("uid-1", "vms", "vm-a-gpu", COMPLETED, [{"key": "0000:41:00.5", "typeID": 1155}])
    claim.save()
    with pytest.raises(nvdriver.DriverError, match="refusing to install %s while the vGPU stack is in use" % NEW) as err:
        node.run(check_mode=check_mode, runfile=node.runfile(NEW))
    assert "0000:41:00.5 held by DRA claim vms/vm-a-gpu" in str(err.value) and "\n" not in str(err.value)
    assert changing_calls(node.dir) == [] and node.loaded_version() == OLD


@pytest.mark.parametrize("check_mode", [False, True])
def test_upgrade_with_a_vgpu_the_device_plugin_allocated_to_a_pod_is_refused_naming_it(node, check_mode):
    """Allocated, the VM not started yet (image pull): the device plugin's record holds the VF."""
    from ansible_collections.accelops.vgpu.tests.integration.pod_allocations import allocate_to_pod

    install(node, OLD)
    node.sim.pf("0000:41:00.0", total=2)
    node.sim.set_numvfs("0000:41:00.0", 2)
    pod = allocate_to_pod(node.kubelet_dir, "0000:41:00.5")
    with pytest.raises(nvdriver.DriverError, match="refusing to install %s while the vGPU stack is in use" % NEW) as err:
        node.run(check_mode=check_mode, runfile=node.runfile(NEW))
    assert "0000:41:00.5 held by %s" % pod in str(err.value) and "\n" not in str(err.value)
    assert changing_calls(node.dir) == [] and node.loaded_version() == OLD


def test_a_held_non_nvidia_vf_does_not_block_the_upgrade(node):
    install(node, OLD)
    node.sim.nic("0000:81:00.0", total=2)
    node.sim.set_numvfs("0000:81:00.0", 2)
    node.sim.hold(node.sim.group_of("0000:81:00.4"))
    assert node.run(runfile=node.runfile(NEW))["version"] == NEW


def test_vfio_module_with_users_refuses_absent(node):
    install(node, NEW)
    modules = node.dir / "proc" / "modules"
    modules.write_text(modules.read_text().replace("nvidia_vgpu_vfio 1 0", "nvidia_vgpu_vfio 1 2"))
    with pytest.raises(nvdriver.DriverError, match="refusing to remove it .*module nvidia_vgpu_vfio has 2 user"):
        node.run(state="absent")
    assert changing_calls(node.dir) == [] and node.loaded_version() == NEW


def test_missing_kernel_headers_refuse_the_upgrade_before_the_first_stop(node):
    install(node, OLD)
    os.rmdir(os.path.join(modules_dir(node.dir), FAKE_KERNEL, "build"))
    with pytest.raises(nvdriver.DriverError, match="no kernel source tree at .*%s/build" % FAKE_KERNEL) as err:
        node.run(runfile=node.runfile(NEW))
    assert "install the kernel headers for %s" % FAKE_KERNEL in str(err.value)
    assert changing_calls(node.dir) == [] and node.loaded_version() == OLD
    # a kernel source tree named to the installer is used instead
    other = node.dir / "src"
    other.mkdir()
    assert node.run(runfile=node.runfile(NEW), installer_args=["--kernel-source-path=%s" % other])["version"] == NEW


def test_dkms_requested_but_not_installed_is_refused(node):
    install(node, OLD)
    os.unlink(node.dir / "bin" / "dkms")
    with pytest.raises(nvdriver.DriverError, match="dkms is true but dkms is not installed"):
        node.run(runfile=node.runfile(NEW), dkms=True)
    assert changing_calls(node.dir) == []


def test_unload_in_use_restarts_the_stopped_services_and_says_so(node):
    install(node, OLD)
    fail_calls(node.dir, "modprobe", "-r", "modprobe: FATAL: Module nvidia is in use.")
    with pytest.raises(nvdriver.DriverError) as err:
        node.run(runfile=node.runfile(NEW))
    message = str(err.value)
    assert message.startswith("driver %s: 'unload nvidia_vgpu_vfio nvidia' failed (" % OLD)
    assert "Module nvidia is in use" in message and "\n" not in message
    assert message.endswith("restored: started %s, started %s" % tuple(SERVICES))
    assert services_active(node) == sorted(name + ".active" for name in SERVICES)
    assert node.loaded_version() == OLD


def test_failed_installer_reloads_the_old_modules_and_services(node):
    install(node, OLD)
    with pytest.raises(nvdriver.DriverError) as err:
        node.run(runfile=node.runfile(NEW, fail_install=True))
    message = str(err.value)
    assert "'install %s from" % NEW in message and "Unable to build the NVIDIA kernel module" in message
    assert message.endswith("restored: loaded nvidia, loaded nvidia_vgpu_vfio, started %s, started %s"
                            % tuple(SERVICES))
    assert node.loaded_version() == OLD and (node.root / "module/nvidia_vgpu_vfio").is_dir()
    assert services_active(node) == sorted(name + ".active" for name in SERVICES)
    calls = changing_calls(node.dir)
    assert calls[-4:] == [["modprobe", "nvidia"], ["modprobe", "nvidia_vgpu_vfio"],
                          ["systemctl", "start", SERVICES[0]], ["systemctl", "start", SERVICES[1]]]


def test_a_restore_that_cannot_bring_everything_back_says_what_is_missing(node):
    install(node, OLD)
    fail_calls(node.dir, "systemctl", "start", "Job for nvidia-vgpu-mgr.service failed.")
    with pytest.raises(nvdriver.DriverError) as err:
        node.run(runfile=node.runfile(NEW, fail_install=True))
    message = str(err.value)
    assert "restore incomplete: service %s, service %s not back (did: loaded nvidia, loaded nvidia_vgpu_vfio)" \
        % tuple(SERVICES) in message
    assert node.loaded_version() == OLD


def test_check_mode_shows_the_whole_sequence_and_its_restore(node):
    install(node, OLD)
    checked = node.run(check_mode=True, runfile=node.runfile(NEW))
    assert checked["actions"][:3] == ["stop %s" % SERVICES[0], "stop %s" % SERVICES[1],
                                      "unload nvidia_vgpu_vfio nvidia"]
    assert checked["on_failure"] == ["load nvidia", "load nvidia_vgpu_vfio"] + ["start %s" % s for s in SERVICES]
    assert changing_calls(node.dir) == []
    # a run that stops nothing has nothing to restore
    install(node, NEW)
    assert node.run(check_mode=True, runfile=node.runfile(NEW))["on_failure"] == []
