"""vgpu_manager_image role + module: real podman build from a fake runfile on the local base image,
pushed to a real registry (docker-registry with htpasswd) on 127.0.0.1, checked over its HTTP API.
"""

import hashlib
import json
import os
import subprocess
import time

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils import cli_zipapp
from ansible_collections.accelops.vgpu.tests.fakes.driver_tools import hold, make_fake_node, read_calls
from ansible_collections.accelops.vgpu.tests.fakes.registry import LocalRegistry
from ansible_collections.accelops.vgpu.tests.fakes.runfile import write_runfile
from ansible_collections.accelops.vgpu.tests.unit.plugins.module_utils.node.fake_node import FakeNode

BASE = "localhost/accelops-debian:bookworm"
VERSION = "570.124.03"
OWNER = "accelops-tests"
REPO = "accelops/vgpu-manager"
pytestmark = pytest.mark.skipif(not os.path.exists("/usr/bin/docker-registry"), reason="needs docker-registry")


CONTAINERS_CONF = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "containers.conf")


def podman(*args):
    env = dict(os.environ, CONTAINERS_CONF=os.environ.get("CONTAINERS_CONF", CONTAINERS_CONF))
    return subprocess.run(["podman"] + list(args), capture_output=True, text=True, env=env, check=False)


@pytest.fixture
def registry(tmp_path, monkeypatch):
    monkeypatch.setenv("CONTAINERS_CONF", os.environ.get("CONTAINERS_CONF", CONTAINERS_CONF))  # for the playbooks
    if podman("image", "exists", BASE).returncode != 0:
        pytest.fail("base image %s missing: run tests/images/build-base.sh" % BASE)
    with LocalRegistry(tmp_path / "registry") as reg:
        yield reg
    for ref in podman("images", "--filter", "label=owner=%s" % OWNER, "--format", "{{.ID}}").stdout.split():
        podman("rmi", "-f", ref)


@pytest.fixture
def build(registry, tmp_path, run_playbook):
    runfile = write_runfile(tmp_path, VERSION)
    work_dir = tmp_path / "work"     # the module's temporary build contexts; each run leaves it empty
    work_dir.mkdir()

    def run(check=False, **overrides):
        role_vars = dict(vgpu_manager_image_runfile=runfile, vgpu_manager_image_registry=registry.host,
                         vgpu_manager_image_path="accelops", vgpu_manager_image_os_tag="debian12",
                         vgpu_manager_image_base_image=BASE, vgpu_manager_image_packages=[],
                         vgpu_manager_image_pull="never", vgpu_manager_image_tls_verify=False,
                         vgpu_manager_image_registry_username=registry.username,
                         vgpu_manager_image_registry_password=registry.password,
                         vgpu_manager_image_labels={"owner": OWNER}, vgpu_manager_image_work_dir=str(work_dir))
        role_vars.update(overrides)
        return run_playbook([{"name": "image", "ansible.builtin.include_role": {
            "name": "accelops.vgpu.vgpu_manager_image"}}], check=check, extra_vars=role_vars)

    run.runfile, run.registry_host, run.work_dir = runfile, registry.host, str(work_dir)
    return run


def result_of(run):
    return run.task("accelops.vgpu.vgpu_manager_image : Build and push the vGPU manager image")


def cli_sha256_in(image):
    """sha256 of /usr/local/bin/accelops-vgpu in the image."""
    shown = podman("run", "--rm", "--pull=never", "--entrypoint", "sha256sum", "--label", "owner=" + OWNER, image,
                   "/usr/local/bin/accelops-vgpu")
    assert shown.returncode == 0, shown.stderr
    return shown.stdout.split()[0]


def test_build_push_then_no_change(build, registry):
    first = build()
    assert first.rc == 0, first
    result = result_of(first)
    tag = "%s-debian12" % VERSION
    assert result["changed"] and result["built"] and result["pushed"]
    assert result["image"] == "%s/%s:%s" % (registry.host, REPO, tag)
    assert registry.tags(REPO) == [tag]
    labels = json.loads(podman("image", "inspect", "--format", "{{json .Labels}}", result["image"]).stdout)
    assert labels["io.accelops.vgpu.input-hash"] == result["input_hash"] and labels["owner"] == OWNER
    # the runfile and the entrypoint are in the image, the entrypoint parses
    checked = podman("run", "--rm", "--pull=never", "--entrypoint", "bash", "--label", "owner=" + OWNER,
                     result["image"], "-c", "bash -n /usr/local/bin/vgpu-manager-entrypoint && "
                     "sh $RUNFILE --version && echo $DRIVER_VERSION")
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.split()[-1] == VERSION and "version %s" % VERSION in checked.stdout
    assert registry.password not in first.stdout + first.stderr
    # no path given: the module built the node CLI from the collection, the bytes vgpu_profile ships to nodes,
    # and left no file of it behind (only the private build context ever held it)
    shipped = cli_zipapp.shipped()
    assert cli_sha256_in(result["image"]) == result["node_cli_sha256"] == hashlib.sha256(shipped).hexdigest()
    assert os.listdir(build.work_dir) == []

    image_id = podman("image", "inspect", "--format", "{{.Id}}", result["image"]).stdout
    again = build()
    assert again.rc == 0 and not result_of(again)["changed"] and result_of(again)["actions"] == []
    assert podman("image", "inspect", "--format", "{{.Id}}", result["image"]).stdout == image_id

    # a changed input (the retry count is in the entrypoint's environment) rebuilds; check mode first
    checked_run = build(check=True, vgpu_manager_image_sriov_retries=9)
    assert result_of(checked_run)["changed"] and result_of(checked_run)["actions"] == ["build", "push"]
    assert podman("image", "inspect", "--format", "{{.Id}}", result["image"]).stdout == image_id
    changed = build(vgpu_manager_image_sriov_retries=9)
    assert result_of(changed)["built"] and result_of(changed)["pushed"]
    assert podman("image", "inspect", "--format", "{{.Id}}", result["image"]).stdout != image_id


def test_a_given_node_cli_goes_in_as_it_is(build, tmp_path):
    cli = tmp_path / "accelops-vgpu-custom"
    cli.write_bytes(b"#!/bin/sh\n# a node CLI built elsewhere\nexit 0\n")
    run = build(vgpu_manager_image_push=False, vgpu_manager_image_os_tag="givencli",
                vgpu_manager_image_node_cli=str(cli))
    assert run.rc == 0, run
    result = result_of(run)
    assert cli_sha256_in(result["image"]) == result["node_cli_sha256"] == hashlib.sha256(cli.read_bytes()).hexdigest()
    assert os.listdir(build.work_dir) == []


def test_a_missing_node_cli_is_one_line_naming_it_and_nothing_is_built(build, tmp_path):
    missing = str(tmp_path / "nowhere" / "accelops-vgpu.pyz")
    run = build(vgpu_manager_image_node_cli=missing, vgpu_manager_image_labels={"owner": OWNER, "case": "nocli"})
    result = result_of(run)
    assert run.rc != 0 and result.get("failed")
    assert result["msg"] == ("image %s/accelops/vgpu-manager: node CLI %s: no such file (leave node_cli out: the "
                             "module builds it)" % (build.registry_host, missing))
    assert podman("images", "--filter", "label=case=nocli", "--format", "{{.ID}}").stdout.strip() == ""
    assert os.listdir(build.work_dir) == []


@pytest.mark.parametrize("target", ["docker.io/acme", "quay.io/acme", "nvcr.io/acme", "acme-without-host"])
def test_public_registry_is_refused_before_building(build, target):
    host, _sep, path = target.partition("/")
    run = build(vgpu_manager_image_registry=host, vgpu_manager_image_path=path,
                vgpu_manager_image_labels={"owner": OWNER, "case": "public"})
    result = result_of(run)
    assert run.rc != 0 and result.get("failed") and "public registry" in result["msg"]
    assert podman("images", "--filter", "label=case=public", "--format", "{{.ID}}").stdout.strip() == ""


def test_wrong_password_fails_before_building(build):
    run = build(vgpu_manager_image_registry_password="wrong", vgpu_manager_image_labels={"owner": OWNER,
                                                                                         "case": "badpw"})
    result = result_of(run)
    assert run.rc != 0 and "HTTP 401" in result["msg"] and "wrong" not in result["msg"]
    assert podman("images", "--filter", "label=case=badpw", "--format", "{{.ID}}").stdout.strip() == ""


def test_wrong_runfile_name_fails_in_the_first_task(build, tmp_path):
    bad = write_runfile(tmp_path, VERSION, name="NVIDIA-Linux-x86_64-%s-grid.run" % VERSION)
    run = build(vgpu_manager_image_runfile=bad)
    assert run.rc != 0
    assert run.task("accelops.vgpu.vgpu_manager_image : Check the runfile name "
                    "(NVIDIA-Linux-<arch>-<version>-vgpu-kvm[-aie].run)").get("failed")


FAKE_SRIOV_MANAGE = """#!/bin/sh
# Like the real one on a bad day: the first `-e ALL` exits 0 without enabling anything.
echo "sriov-manage $*" >> "$FAKE_NODE/calls.log"
pf=$SYSFS_ROOT/bus/pci/devices/0000:41:00.0
case "$1" in
  -e) [ "$(grep -c '^sriov-manage -e' "$FAKE_NODE/calls.log")" -ge 2 ] && cat "$pf/sriov_totalvfs" > "$pf/sriov_numvfs" ;;
  -d) echo 0 > "$pf/sriov_numvfs" ;;
esac
exit 0
"""
PF = "0000:41:00.0"
PASSED = "0000:42:00.0"     # a GPU passed through whole (vfio-pci): the image never touches it (issue 32 item 1)
OLD = "550.90.07"           # a driver version loaded before this image's (issue 32 item 5)
# what vgpu_profiles installs: every config of the fleet in one file, the node's choice beside it
LAYOUTS = {"version": "v1", "vgpu-configs": {
    "l40s-24q": [{"devices": "all", "vgpu-devices": {"L40S-24Q": 2}}],
    "l40s-48q": [{"devices": "all", "vgpu-devices": {"L40S-48Q": 1}}]}}
TYPE_24Q = 1155   # fake_node.L40S_TYPES


def wait_for(predicate, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.5)
    return False


@pytest.fixture
def manager(build, tmp_path):
    """The image the role builds by default (with the node CLI the module builds from the collection: no
    checkout, no tools/) and a node for it: FakeNode's sysfs (an L40S, 4 VFs not yet enabled), /dev and /proc
    plus the fake tools, all mounted at /fake; the layout directory at /etc/accelops-vgpu. `start()` runs (or
    restarts) the container until "ready", `stop()` sends SIGTERM."""
    run = build(vgpu_manager_image_push=False, vgpu_manager_image_os_tag="entrypoint")
    assert run.rc == 0, run
    image = result_of(run)["image"]
    fake = tmp_path / "fake"
    node = FakeNode(fake)
    node.pf(PF, total=4)
    node.set_numvfs(PF, 4)
    (node.dir(PF) / "sriov_numvfs").write_text("0\n")   # VFs enabled by sriov-manage (the fake) at start
    node.pf(PASSED, total=4, driver="vfio-pci")
    make_fake_node(fake, "/fake/sys")
    (fake / "bin/sriov-manage").write_text(FAKE_SRIOV_MANAGE)
    (fake / "bin/sriov-manage").chmod(0o755)
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "layout.json").write_text(json.dumps(LAYOUTS))
    (etc / "selected").write_text("l40s-24q\n")
    name = "accelops-tests-entrypoint-%d" % os.getpid()

    class Manager:
        sim, dir = node, fake

        def start(self, ready=True):
            if podman("container", "exists", name).returncode == 0:
                started = podman("start", name)
            else:
                started = podman("run", "-d", "--name", name, "--label", "owner=" + OWNER, "--pull=never",
                                 "-v", "%s:/fake" % fake, "-v", "%s:/etc/accelops-vgpu:ro" % etc,
                                 "-e", "FAKE_NODE=/fake", "-e", "GPUSIM_ROOT=/fake/sys", "-e", "SYSFS_ROOT=/fake/sys",
                                 "-e", "DEV_ROOT=/fake/dev", "-e", "PROC_ROOT=/fake/proc",
                                 "-e", "SRIOV_MANAGE=/fake/bin/sriov-manage", "-e", "SRIOV_RETRY_DELAY=0",
                                 "-e", "INSTALL_KERNEL_HEADERS=false", "-e", "DAEMON_STORE=/fake/daemons",
                                 "-e", "WAIT_INTERVAL=1", "-e", "LOCK_TIMEOUT=5",
                                 "-e", "PATH=/fake/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                                 image)
            assert started.returncode == 0, started.stderr
            if not ready:
                return
            runs = self.log().count("vgpu-manager: ready")
            assert wait_for(lambda: self.log().count("vgpu-manager: ready") > runs or self.exited()), self.log()
            assert not self.exited(), self.log()

        def stop(self):
            stopped = podman("stop", "-t", "20", name)
            assert stopped.returncode == 0, stopped.stderr
            assert podman("inspect", "--format", "{{.State.ExitCode}}", name).stdout.strip() == "0", self.log()

        def exited(self):
            return podman("inspect", "--format", "{{.State.Running}}", name).stdout.strip() != "true"

        def log(self):
            return podman("logs", name).stderr

        def calls(self):
            return [" ".join(call) for call in read_calls(fake)]

        def clear_calls(self):
            (fake / "calls.log").write_text("")

        def numvfs(self):
            return int((node.dir(PF) / "sriov_numvfs").read_text())

        def types(self):
            return [int((node.dir(vf) / "nvidia/current_vgpu_type").read_text()) for vf in vf_addresses()]

        def hold(self, vf):
            """A VM (QEMU) in the node's process table with the VF's VFIO group open, as the container sees it."""
            group = node.group_of(vf)
            (fake / "dev/vfio" / group).write_text("")
            return hold(fake, "/fake/dev/vfio/" + group)

    def vf_addresses():
        return ["0000:41:00.%d" % function for function in range(4, 8)]

    yield Manager()
    podman("rm", "-f", "-t", "0", name)


def test_entrypoint_installs_enables_vfs_applies_the_selected_config_and_stops_cleanly(manager):
    manager.start()
    assert (manager.dir / "sys/module/nvidia/version").read_text().strip() == VERSION
    assert manager.numvfs() == 4
    # the real CLI applied the node's config from the multi-config layout
    assert manager.types() == [TYPE_24Q, TYPE_24Q, 0, 0]
    assert "re-applying the vGPU layout from /etc/accelops-vgpu/layout.json (config l40s-24q)" in manager.log()
    manager.stop()
    install = "runfile %s --ui=none --no-questions --silent --no-systemd --skip-module-load" % VERSION
    # per PF bound to nvidia, never ALL: the GPU passed through is left alone (issue 32 item 1)
    assert manager.calls() == [install, "modprobe nvidia", "modprobe nvidia_vgpu_vfio", "nvidia-vgpud",
                               "nvidia-vgpu-mgr", "sriov-manage -e " + PF, "sriov-manage -e " + PF, "nvidia-vgpud",
                               "sriov-manage -d " + PF, "modprobe -r nvidia_vgpu_vfio", "modprobe -r nvidia"]
    assert "leaving %s alone: bound to vfio-pci, not nvidia (passed through)" % PASSED in manager.log()
    assert "nothing uses the vGPU stack: VFs disabled; unloading the driver" in manager.log()
    assert manager.numvfs() == 0 and not (manager.dir / "sys/module/nvidia").exists()
    assert os.readlink(str(manager.sim.dir(PASSED) / "driver")).endswith("/vfio-pci")
    # this driver's daemons are kept for a later image of another version (issue 32 item 5)
    assert (manager.dir / "daemons" / VERSION / "nvidia-vgpu-mgr").exists()


def test_a_held_vf_survives_the_pod_stop_and_the_restart_keeps_the_driver(manager):
    manager.start()
    pid = manager.hold("0000:41:00.4")
    manager.clear_calls()
    manager.stop()
    log = manager.log()
    assert "in use: 0000:41:00.4 held by pid %d" % pid in log
    assert "VMs use the vGPU stack (above): stopping only the daemons; the VFs and the nvidia modules stay" in log
    assert manager.calls() == []   # no sriov-manage -d, no modprobe -r
    assert manager.numvfs() == 4 and manager.types()[0] == TYPE_24Q
    assert (manager.dir / "sys/module/nvidia/version").read_text().strip() == VERSION

    manager.start()              # the restart keeps the loaded driver the VM uses: no unload, no reinstall
    assert "driver %s is loaded and in use: keeping it (no reinstall)" % VERSION in manager.log()
    assert [c for c in manager.calls() if c.startswith(("runfile", "modprobe", "sriov-manage"))] == []
    assert manager.numvfs() == 4 and manager.types()[0] == TYPE_24Q

    os.unlink(manager.dir / "proc" / str(pid) / "fd" / "3")   # the VM is gone
    manager.stop()
    assert manager.calls()[-3:] == ["sriov-manage -d " + PF, "modprobe -r nvidia_vgpu_vfio", "modprobe -r nvidia"]
    assert manager.numvfs() == 0


def test_a_new_driver_version_runs_the_loaded_drivers_daemons_while_vms_use_it(manager):
    """Issue 32 item 5: a pod of another driver version never leaves running VMs without nvidia-vgpu-mgr: it runs
    the loaded driver's daemons (kept by that version's pod in DAEMON_STORE) until the VMs stop, then replaces
    the driver."""
    manager.start()
    pid = manager.hold("0000:41:00.4")
    manager.stop()                                   # VMs run: only the daemons stop
    (manager.dir / "sys/module/nvidia/version").write_text(OLD + "\n")    # an older driver is the loaded one
    old = manager.dir / "daemons" / OLD
    old.mkdir(parents=True)
    for tool in ("nvidia-vgpud", "nvidia-vgpu-mgr"):
        (old / tool).write_text('#!/bin/sh\necho "%s %s $*" >> "$FAKE_NODE/calls.log"\n%s' % (
            OLD, tool, "exec sleep 1000000\n" if tool == "nvidia-vgpu-mgr" else ""))
        (old / tool).chmod(0o755)
    manager.clear_calls()
    manager.start(ready=False)
    assert wait_for(lambda: "%s nvidia-vgpu-mgr" % OLD in manager.calls()), manager.log()
    assert "running driver %s's daemons from /fake/daemons/%s while VMs use it" % (OLD, OLD) in manager.log()
    assert not [c for c in manager.calls() if c.startswith(("runfile", "modprobe", "sriov-manage"))]
    assert not manager.exited()
    os.unlink(manager.dir / "proc" / str(pid) / "fd" / "3")   # the VM is gone: now the driver is replaced
    runs = manager.log().count("vgpu-manager: ready")
    assert wait_for(lambda: manager.log().count("vgpu-manager: ready") > runs or manager.exited()), manager.log()
    calls = manager.calls()
    assert calls[:3] == ["%s nvidia-vgpud" % OLD, "%s nvidia-vgpu-mgr" % OLD, "modprobe -r nvidia_vgpu_vfio"]
    assert "runfile %s --ui=none --no-questions --silent --no-systemd --skip-module-load" % VERSION in calls
    assert (manager.dir / "sys/module/nvidia/version").read_text().strip() == VERSION
