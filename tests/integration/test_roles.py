# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node roles (vgpu_profiles, and sriov first with vgpu_nodes_manage_sriov) as nodes.yml runs
them, on a simulated node.

Check mode predicts the real run without a single write, a second run changes nothing, bad input
stops before any write, and the boot files land below the install root with the node CLI able to
assert the layout.
"""

import os
import subprocess
import sys

import pytest
from gpusim.models import MODELS

from ansible_collections.accelops.vgpu.tests.integration.dra_claims import prepare_claim

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# nodes.yml's default path: the layout role alone enables the VFs it needs (vgpu_profiles_enable_vfs).
ROLE_TASKS = [
    {"name": "vgpu_profiles", "ansible.builtin.include_role": {"name": "accelops.vgpu.vgpu_profiles"}},
]
# nodes.yml with vgpu_nodes_manage_sriov: true (playbooks/tasks/explicit_sriov.yml, then the layout role).
SRIOV_FIRST = [
    {"name": "validate", "ansible.builtin.include_role": {"name": "accelops.vgpu.vgpu_profiles",
                                                          "tasks_from": "validate"}},
    {"name": "sriov", "ansible.builtin.include_role": {"name": "accelops.vgpu.sriov"}},
] + ROLE_TASKS
LAYOUTS = {
    "fleet": [{"device_filter": "0x26B910DE", "profiles": {"L40S-24Q": 2}},
              {"device_filter": "0x1EB810DE", "profiles": {"T4-8Q": 2}}],
    "large": [{"device_filter": "0x26B910DE", "profiles": {"L40S-48Q": 1}},
              {"device_filter": "0x1EB810DE", "profiles": {"T4-16Q": 1}}],
}
TYPE_IDS = {vgpu_type.short_name: vgpu_type.type_id for vgpu_type in MODELS["l40s"].types}


@pytest.fixture(scope="module")
def node_cli(tmp_path_factory):
    """The node CLI as tools/build-node-cli.py builds it, to compare with the one the module installs (the
    node engine alone: the agent runs from its image)."""
    path = tmp_path_factory.mktemp("cli") / "accelops-vgpu"
    subprocess.run([sys.executable, os.path.join(REPO, "tools", "build-node-cli.py"), "--without-agent", str(path)],
                   check=True, stdout=subprocess.DEVNULL)
    return str(path)


def role_vars(node, install_root, **overrides):
    variables = {
        "sriov_sysfs_root": node.root, "sriov_dev_root": node.dev_root,
        "vgpu_profiles_sysfs_root": node.root, "vgpu_profiles_dev_root": node.dev_root,
        "vgpu_profiles_configs": LAYOUTS, "vgpu_profiles_selected": "fleet",
        "vgpu_profiles_install_root": str(install_root), "vgpu_profiles_manage_service": False,
    }
    variables.update(overrides)
    return variables


def boot_command(root, verb="apply"):
    """The ExecStart of the installed unit, pointed at the files below the install root."""
    unit = (root / "etc/systemd/system/accelops-vgpu.service").read_text()
    argv = [line.split("=", 1)[1].split() for line in unit.splitlines() if line.startswith("ExecStart=")][0]
    assert argv[:4] == ["/usr/local/bin/accelops-vgpu", "apply", "--config", "/etc/accelops-vgpu/layout.json"]
    rest = [str(root / arg[1:]) if arg.startswith("/etc/accelops-vgpu/") else arg for arg in argv[4:]]
    return [str(root / "usr/local/bin/accelops-vgpu"), verb, "--config", str(root / "etc/accelops-vgpu/layout.json")] \
        + rest


def run_cli(argv, node):
    return subprocess.run(argv, env=node.env, stdout=subprocess.DEVNULL, check=False).returncode


def changed_tasks(run):
    return sorted(result["task"] for result in run.results if result.get("changed"))


def test_check_mode_predicts_a_layout_change_and_writes_nothing(gpusim_node, run_playbook, tmp_path):
    node = gpusim_node("l40s:1,t4:1")
    first = run_playbook(ROLE_TASKS, node, extra_vars=role_vars(node, tmp_path / "root"))
    assert first.rc == 0, first
    vf = node.vfs(node.pfs("l40s")[0])[0]
    assert int(node.read("bus/pci/devices/%s/nvidia/current_vgpu_type" % vf)) == TYPE_IDS["L40S-24Q"]
    writes = len(node.writes())

    variables = role_vars(node, tmp_path / "root", vgpu_profiles_selected="large")
    check = run_playbook(ROLE_TASKS, node, check=True, extra_vars=variables)
    assert check.rc == 0, check
    assert len(node.writes()) == writes
    real = run_playbook(ROLE_TASKS, node, extra_vars=variables)
    assert real.rc == 0, real
    assert changed_tasks(real) == changed_tasks(check)
    applied = next(r for r in real.results if "resources" in r)
    # the layout file holds every label: only the selection (for the manager image) and the unit (--selected) change
    assert applied["changed"] and applied["boot_files_installed"] == [
        str(tmp_path / "root/etc/accelops-vgpu/selected"), str(tmp_path / "root/etc/systemd/system/accelops-vgpu.service")]
    assert (tmp_path / "root/etc/accelops-vgpu/selected").read_text() == "large\n"

    writes = len(node.writes())
    again = run_playbook(ROLE_TASKS, node, extra_vars=variables)
    assert again.rc == 0, again
    assert changed_tasks(again) == []
    assert len(node.writes()) == writes


def test_check_mode_on_a_fresh_node(gpusim_node, run_playbook, tmp_path):
    """The layout role enables the VFs itself: check mode predicts the VFs, every vGPU and the boot
    files, and writes nothing; the real run reports the same changes."""
    node = gpusim_node("l40s:1,t4:1")
    variables = role_vars(node, tmp_path / "root")
    check = run_playbook(ROLE_TASKS, node, check=True, diff=True, extra_vars=variables)
    assert node.writes() == []
    assert check.rc == 0, check
    assert not (tmp_path / "root").exists()
    layout = next(result for result in check.results if "resources" in result)
    assert layout["changed"] is True
    l40s = node.pfs("l40s")[0]
    assert layout["diff"]["after"][l40s] == {"vfs": "enabled", "profiles": {"L40S-24Q": 2}}
    assert sorted(layout["diff"]["after"]["boot_files"]) == sorted(
        str(tmp_path / "root" / path) for path in ("etc/accelops-vgpu/layout.json", "etc/accelops-vgpu/selected",
                                                   "usr/local/bin/accelops-vgpu",
                                                   "etc/systemd/system/accelops-vgpu.service"))

    real = run_playbook(ROLE_TASKS, node, extra_vars=variables)
    assert real.rc == 0, real
    assert changed_tasks(real) == changed_tasks(check)
    assert next(r for r in real.results if "resources" in r)["vfs_enabled"] == [l40s]   # the T4 has no SR-IOV
    assert int(node.read("bus/pci/devices/%s/sriov_numvfs" % l40s)) == len(node.vfs(l40s)) > 0


def test_check_mode_on_a_fresh_node_with_the_sriov_role(gpusim_node, run_playbook, tmp_path):
    """VFs are only planned by sriov_vfs in check mode: vgpu_profile predicts every vGPU, writes nothing."""
    node = gpusim_node("l40s:1,t4:1")
    variables = role_vars(node, tmp_path / "root")
    check = run_playbook(SRIOV_FIRST, node, check=True, diff=True, extra_vars=variables)
    assert node.writes() == []
    assert check.rc == 0, check
    assert not (tmp_path / "root").exists()
    validate, layout = [result for result in check.results if "resources" in result]
    assert validate["changed"] is False and layout["changed"] is True
    l40s = node.pfs("l40s")[0]
    assert layout["diff"]["after"][l40s] == {"vfs": "enabled", "profiles": {"L40S-24Q": 2}}
    assert any(l40s in warning and "validated against the driver (nvidia-smi vgpu -s)" in warning
               for warning in validate["warnings"])

    real = run_playbook(SRIOV_FIRST, node, extra_vars=variables)
    assert real.rc == 0, real
    assert changed_tasks(real) == changed_tasks(check)


def test_resources_are_published_for_the_cluster_role(gpusim_node, run_playbook, tmp_path):
    node = gpusim_node("l40s:1,t4:1")
    tasks = ROLE_TASKS + [{"name": "resources", "ansible.builtin.debug": {"var": "vgpu_profiles_resources"}}]
    run = run_playbook(tasks, node, extra_vars=role_vars(node, tmp_path / "root"))
    assert run.rc == 0, run
    resources = {item["resource_name"]: item for item in run.task("resources")["vgpu_profiles_resources"]}
    assert resources["nvidia.com/NVIDIA_L40S-24Q"]["count"] == 2
    assert resources["nvidia.com/NVIDIA_L40S-24Q"]["pci_vendor_selector"] == "10DE:26B9"
    assert resources["nvidia.com/GRID_T4-8Q"]["framework"] == "mdev"


@pytest.mark.parametrize("overrides, message", [
    ({"vgpu_profiles_selected": "missing"}, "selected 'missing'"),
    ({"vgpu_profiles_vdm_config": {"version": "v1", "vgpu-configs": {"fleet": []}}}, "set exactly one of"),
    ({"vgpu_profiles_configs": {"fleet": [{"profiles": {"L40S-7Q": 2}}]}}, "L40S-7Q"),
])
def test_bad_layout_stops_before_any_write(gpusim_node, run_playbook, tmp_path, overrides, message):
    node = gpusim_node("l40s:1,t4:1")
    variables = role_vars(node, tmp_path / "root", **overrides)
    assert run_playbook(SRIOV_FIRST[1:2], node, extra_vars=variables).rc == 0      # VFs enabled
    writes = len(node.writes())
    run = run_playbook(ROLE_TASKS, node, extra_vars=variables)
    assert run.rc != 0
    failures = [result["msg"] for result in run.results if result.get("failed")]
    assert len(failures) == 1 and message in failures[0], failures
    assert len(failures[0].splitlines()) == 1
    assert len(node.writes()) == writes
    assert not (tmp_path / "root").exists()


def test_cli_built_on_the_node_asserts_the_layout(gpusim_node, run_playbook, tmp_path, node_cli):
    node = gpusim_node("l40s:1,t4:1")
    root = tmp_path / "root"
    variables = role_vars(node, root)
    first = run_playbook(ROLE_TASKS, node, extra_vars=variables)
    assert first.rc == 0, first
    again = run_playbook(ROLE_TASKS, node, extra_vars=variables)
    assert changed_tasks(again) == []
    with open(node_cli, "rb") as built:      # the same bytes tools/build-node-cli.py makes
        assert (root / "usr/local/bin/accelops-vgpu").read_bytes() == built.read()

    argv = boot_command(root, "assert")
    assert run_cli(argv, node) == 0
    argv[argv.index("--selected") + 1] = "large"
    assert run_cli(argv, node) == 1


def test_no_manager_or_before_unit_gives_the_unit_the_template_wrote(gpusim_node, run_playbook, tmp_path):
    """vgpu_profiles_manager_units: [] and vgpu_profiles_before_units: '' (what `-e name=` gives): the lines the
    role's Jinja template wrote (no PartOf=, no Before=, "WantedBy=multi-user.target " with its space), so a node
    it converged keeps its unit file (no rewrite and daemon-reload when the collection is upgraded)."""
    node = gpusim_node("l40s:1")
    root = tmp_path / "root"
    variables = role_vars(node, root, vgpu_profiles_manager_units=[], vgpu_profiles_before_units="")
    run = run_playbook(ROLE_TASKS, node, extra_vars=variables)
    assert run.rc == 0, run
    unit = (root / "etc/systemd/system/accelops-vgpu.service").read_text().splitlines()
    assert [line for line in unit if line.startswith(("After=", "Before=", "PartOf=", "WantedBy="))] == [
        "After=", "WantedBy=multi-user.target "]


def test_mixed_sizes_come_back_after_a_reboot(gpusim_node, run_playbook, tmp_path):
    node = gpusim_node("l40s:1")
    root = tmp_path / "root"
    mixed = {"mixed": [{"device_filter": "0x26B910DE", "profiles": {"L40S-24Q": 1, "L40S-12Q": 2}}]}
    variables = role_vars(node, root, vgpu_profiles_configs=mixed,
                          vgpu_profiles_selected="mixed", vgpu_profiles_mixed_size=True)
    run = run_playbook(ROLE_TASKS, node, extra_vars=variables)
    assert run.rc == 0, run
    assert "--mixed-size" in boot_command(root)

    node.ctl("reboot")
    assert run_cli([arg for arg in boot_command(root, "assert") if arg != "--mixed-size"], node) == 1
    assert run_cli(boot_command(root), node) == 0
    pf = node.pfs("l40s")[0]
    types = sorted(int(node.read("bus/pci/devices/%s/nvidia/current_vgpu_type" % vf)) for vf in node.vfs(pf))
    assert [type_id for type_id in types if type_id] == sorted([TYPE_IDS["L40S-12Q"]] * 2 + [TYPE_IDS["L40S-24Q"]])


def test_a_dra_claim_under_the_roles_kubelet_dir_holds_its_vgpu_and_the_boot_unit_reads_it_too(
        gpusim_node, run_playbook, tmp_path):
    node = gpusim_node("l40s:1")
    root, kubelet_dir = tmp_path / "root", tmp_path / "var/lib/k0s/kubelet"
    kubelet_dir.mkdir(parents=True)
    assert run_playbook(ROLE_TASKS, node, extra_vars=role_vars(node, root, vgpu_profiles_kubelet_dir=str(
        kubelet_dir))).rc == 0
    command = boot_command(root)
    assert command[command.index("--kubelet-dir") + 1] == str(kubelet_dir)
    vf = node.vfs(node.pfs("l40s")[0])[0]
    claim = prepare_claim(kubelet_dir, vf, TYPE_IDS["L40S-24Q"])
    node.clear_log()
    run = run_playbook(ROLE_TASKS, node, extra_vars=role_vars(
        node, root, vgpu_profiles_selected="large", vgpu_profiles_kubelet_dir=str(kubelet_dir)))
    failed = [result for result in run.results if result.get("failed")]
    assert run.rc != 0 and len(failed) == 1 and vf in failed[0]["msg"] and claim in failed[0]["msg"], run
    assert node.log() == []
    # the boot unit's apply, asked for "large", refuses too: it reads the claims under the same kubelet dir
    command = boot_command(root)
    command[command.index("--selected") + 1] = "large"
    assert run_cli(command, node) == 2
    assert node.log() == []
    assert node.read("bus/pci/devices/%s/nvidia/current_vgpu_type" % vf) == str(TYPE_IDS["L40S-24Q"])


def test_absent_removes_the_vgpus_and_the_boot_files(gpusim_node, run_playbook, tmp_path):
    node = gpusim_node("l40s:1,t4:1")
    root = tmp_path / "root"
    present = run_playbook(ROLE_TASKS, node, extra_vars=role_vars(node, root))
    assert present.rc == 0, present
    assert (root / "etc/systemd/system/accelops-vgpu.service").exists()

    absent = role_vars(node, root, vgpu_profiles_state="absent")
    run = run_playbook(ROLE_TASKS, node, extra_vars=absent)
    assert run.rc == 0, run
    pf = node.pfs("l40s")[0]
    assert [int(node.read("bus/pci/devices/%s/nvidia/current_vgpu_type" % vf)) for vf in node.vfs(pf)] \
        == [0] * len(node.vfs(pf))
    assert not os.listdir(node.path("bus/mdev/devices"))
    for path in ("etc/systemd/system/accelops-vgpu.service", "etc/accelops-vgpu", "usr/local/bin/accelops-vgpu"):
        assert not (root / path).exists(), path
    assert changed_tasks(run_playbook(ROLE_TASKS, node, extra_vars=absent)) == []


def test_boot_files_changed_on_the_node_are_put_back(gpusim_node, run_playbook, tmp_path):
    """The apply module looks at the boot files in the same run: a file edited, removed or re-moded on
    the node is rewritten by it."""
    node = gpusim_node("l40s:1")
    root = tmp_path / "root"
    variables = role_vars(node, root)
    assert run_playbook(ROLE_TASKS, node, extra_vars=variables).rc == 0
    layout, cli, unit = (root / "etc/accelops-vgpu/layout.json", root / "usr/local/bin/accelops-vgpu",
                         root / "etc/systemd/system/accelops-vgpu.service")
    installed = dict((path, path.read_bytes()) for path in (layout, cli, unit))
    layout.write_text("{}\n")
    os.chmod(cli, 0o644)
    unit.unlink()
    again = run_playbook(ROLE_TASKS, node, extra_vars=variables)
    assert again.rc == 0, again
    assert changed_tasks(again) == ["accelops.vgpu.vgpu_profiles : Apply vGPU layout 'fleet'"]
    assert next(r for r in again.results if "resources" in r)["boot_files_installed"] == [
        str(layout), str(cli), str(unit)]
    assert dict((path, path.read_bytes()) for path in (layout, cli, unit)) == installed
    assert os.stat(cli).st_mode & 0o777 == 0o755
    assert changed_tasks(run_playbook(ROLE_TASKS, node, extra_vars=variables)) == []


@pytest.mark.parametrize("tasks", [ROLE_TASKS, SRIOV_FIRST], ids=["default", "sriov-role"])
def test_a_layout_that_cannot_fit_stops_nodes_yml_before_the_vfs(gpusim_node, run_playbook, tmp_path, tasks):
    """Three 24 GB vGPUs on a 48 GB L40S are refused before any VF is enabled: by the apply module
    itself, or by the check before the sriov role."""
    node = gpusim_node("l40s:1", fresh=True)
    too_big = {"fleet": [{"device_filter": "0x26B910DE", "profiles": {"L40S-24Q": 3}}]}
    variables = role_vars(node, tmp_path / "root", vgpu_profiles_configs=too_big)
    run = run_playbook(tasks, node, extra_vars=variables)
    failed = [r for r in run.results if r.get("failed")]
    assert run.rc == 2 and len(failed) == 1, run
    assert "L40S-24Q need 72 GB of framebuffer, the GPU has 48 GB" in failed[0]["msg"]
    assert node.writes() == [] and not (tmp_path / "root").exists()
    fits = run_playbook(tasks, node, extra_vars=role_vars(node, tmp_path / "root"))
    assert fits.rc == 0, fits
    assert not [task for task in changed_tasks(fits) if task.startswith("Check that the vGPU layout fits")]


FAKE_SYSTEMCTL = """#!/bin/sh
# systemctl for one unit: state in $STATE/{enabled,active}, every call appended to $STATE/calls
echo "$*" >> "$STATE/calls"
case "$1" in
  is-enabled) cat "$STATE/enabled" 2>/dev/null || echo disabled; grep -qx enabled "$STATE/enabled" 2>/dev/null ;;
  is-active) cat "$STATE/active" 2>/dev/null || echo inactive; grep -qx active "$STATE/active" 2>/dev/null ;;
  enable) echo enabled > "$STATE/enabled" ;;
  disable) echo disabled > "$STATE/enabled" ;;
  start) echo active > "$STATE/active" ;;
  stop) echo inactive > "$STATE/active" ;;
  daemon-reload) ;;
  *) exit 1 ;;
esac
"""


def test_the_module_keeps_the_boot_unit_enabled_and_started(gpusim_node, run_playbook, tmp_path):
    """vgpu_profiles_manage_service: systemctl only where something is missing; absent stops, disables,
    removes the files and reloads."""
    node = gpusim_node("l40s:1")
    tools, state, root = tmp_path / "bin", tmp_path / "systemd", tmp_path / "root"
    tools.mkdir()
    state.mkdir()
    (tools / "systemctl").write_text(FAKE_SYSTEMCTL)
    os.chmod(tools / "systemctl", 0o755)
    environment = {"PATH": "%s:%s" % (tools, node.env["PATH"]), "STATE": str(state)}
    tasks = [{"name": "with systemctl", "block": ROLE_TASKS, "environment": environment}]

    def actions(run):
        calls = (state / "calls").read_text().splitlines() if (state / "calls").exists() else []
        (state / "calls").write_text("")
        assert run.rc == 0, run
        return [call for call in calls if not call.startswith("is-")]

    variables = role_vars(node, root, vgpu_profiles_manage_service=True)
    check = run_playbook(tasks, node, check=True, extra_vars=variables)
    assert actions(check) == []
    assert next(r for r in check.results if "resources" in r)["boot_unit_actions"] == [
        "systemctl daemon-reload", "systemctl enable accelops-vgpu.service", "systemctl start accelops-vgpu.service"]
    assert actions(run_playbook(tasks, node, extra_vars=variables)) == [
        "daemon-reload", "enable accelops-vgpu.service", "start accelops-vgpu.service"]
    again = run_playbook(tasks, node, extra_vars=variables)
    assert actions(again) == [] and changed_tasks(again) == []

    (state / "active").write_text("failed\n")        # the unit failed at some point: started again
    assert actions(run_playbook(tasks, node, extra_vars=variables)) == ["start accelops-vgpu.service"]

    absent = run_playbook(tasks, node, extra_vars=dict(variables, vgpu_profiles_state="absent"))
    assert actions(absent) == ["stop accelops-vgpu.service", "disable accelops-vgpu.service", "daemon-reload"]
    assert not (root / "etc/systemd/system/accelops-vgpu.service").exists()
    assert not (root / "etc/accelops-vgpu").exists() and not (root / "usr/local/bin/accelops-vgpu").exists()


def test_the_agents_layout_survives_a_reboot_until_the_role_reclaims_the_node(gpusim_node, run_playbook, tmp_path):
    """Both paths installed: the agent applied `large` (its file next to the layout); the unit's command
    re-applies that after a reboot, not the inventory's `fleet`. vgpu_profiles_reclaim_from_agent hands
    the node back: the file goes and the unit applies `fleet` again."""
    node = gpusim_node("l40s:1")
    root = tmp_path / "root"
    assert run_playbook(ROLE_TASKS, node, extra_vars=role_vars(node, root)).rc == 0
    unit = (root / "etc/systemd/system/accelops-vgpu.service").read_text().splitlines()
    assert "Environment=ACCELOPS_VGPU_RETRY_FOR=300 ACCELOPS_VGPU_STATE_FILE=/run/accelops-vgpu/boot-state.json" \
        in unit and "TimeoutStartSec=600" in unit and "--agent-applied" in boot_command(root)
    agent_file = root / "etc/accelops-vgpu/agent-applied.json"
    agent_file.write_text('{"version": "v1", "vgpu-configs": {"large": [{"devices": "all", '
                          '"device-filter": "0x26B910DE", "vgpu-devices": {"L40S-48Q": 1}}]}}\n')
    node.ctl("reboot")
    assert run_cli(boot_command(root) + ["--state-file", str(root / "run/accelops-vgpu/boot-state.json")], node) == 0
    vfs = node.vfs(node.pfs("l40s")[0])
    assert int(node.read("bus/pci/devices/%s/nvidia/current_vgpu_type" % vfs[0])) == TYPE_IDS["L40S-48Q"]
    state = (root / "run/accelops-vgpu/boot-state.json").read_text()
    assert '"state": "applied"' in state and "agent-applied.json" in state

    run = run_playbook(ROLE_TASKS, node, extra_vars=role_vars(node, root, vgpu_profiles_reclaim_from_agent=True))
    assert run.rc == 0, run
    assert not agent_file.exists()
    # removed by the layout's one module run, no task of its own
    assert [r["boot_files_removed"] for r in run.results if "boot_files_removed" in r] == [[str(agent_file)]]
    assert changed_tasks(run) == ["accelops.vgpu.vgpu_profiles : Apply vGPU layout 'fleet'"]
    node.ctl("reboot")
    assert run_cli(boot_command(root), node) == 0
    assert int(node.read("bus/pci/devices/%s/nvidia/current_vgpu_type" % vfs[0])) == TYPE_IDS["L40S-24Q"]
