"""The boot unit's text, built on the node (node/boot/boot_unit_file.py): byte for byte what the role's
Jinja template wrote before for ordinary values (these texts are that template's output, rendered by ansible-core),
escaped for systemd (not for a shell) where a value has characters systemd reads specially."""

import re
import shutil
import subprocess

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.errors import shown
from ansible_collections.accelops.vgpu.plugins.module_utils.node.boot import boot_unit_file

CLI, LAYOUT, HANDOVER = "/usr/local/bin/accelops-vgpu", "/etc/accelops-vgpu/layout.json", "/etc/accelops-vgpu/agent-applied.json"

DEFAULTS = """\
# Managed by Ansible (accelops.vgpu.vgpu_profiles): re-applies the vGPU layout, which does not
# survive a reboot or a restart of the vGPU manager.
[Unit]
Description=accelops vGPU layout (default)
Documentation=file:///etc/accelops-vgpu/layout.json
After=nvidia-vgpud.service nvidia-vgpu-mgr.service
Before=kubelet.service
PartOf=nvidia-vgpud.service
PartOf=nvidia-vgpu-mgr.service
ConditionPathExists=/etc/accelops-vgpu/layout.json

[Service]
Type=oneshot
RemainAfterExit=yes
# apply retries for vgpu_profiles_boot_retry_for s and records its outcome (environment: ExecStart stays
# the command `assert` can replace apply in); one more attempt may take its wait and lock timeouts
Environment=ACCELOPS_VGPU_RETRY_FOR=300 ACCELOPS_VGPU_STATE_FILE=/run/accelops-vgpu/boot-state.json
TimeoutStartSec=600
ExecStart=/usr/local/bin/accelops-vgpu apply --config /etc/accelops-vgpu/layout.json --selected default \
--agent-applied /etc/accelops-vgpu/agent-applied.json --sysfs-root /sys --dev-root /dev --proc-root /proc

[Install]
WantedBy=multi-user.target nvidia-vgpud.service nvidia-vgpu-mgr.service
"""

# the same template with every option set: only these lines differ ("Before=" gone, one manager unit)
EVERY_OPTION_LINES = {
    "Description=accelops vGPU layout (default)": "Description=accelops vGPU layout (my-layout.v2)",
    "After=nvidia-vgpud.service nvidia-vgpu-mgr.service": "After=nvidia-vgpu-mgr.service",
    "Before=kubelet.service": None,
    "PartOf=nvidia-vgpud.service": None,
    "Environment=ACCELOPS_VGPU_RETRY_FOR=300 ACCELOPS_VGPU_STATE_FILE=/run/accelops-vgpu/boot-state.json":
        "Environment=ACCELOPS_VGPU_RETRY_FOR=60 ACCELOPS_VGPU_STATE_FILE=/run/accelops-vgpu/boot-state.json",
    "TimeoutStartSec=600": "TimeoutStartSec=360",
    "ExecStart=/usr/local/bin/accelops-vgpu apply --config /etc/accelops-vgpu/layout.json --selected default "
    "--agent-applied /etc/accelops-vgpu/agent-applied.json --sysfs-root /sys --dev-root /dev --proc-root /proc":
        "ExecStart=/usr/local/bin/accelops-vgpu apply --config /etc/accelops-vgpu/layout.json --selected my-layout.v2 "
        "--agent-applied /etc/accelops-vgpu/agent-applied.json --sysfs-root /host/sys --dev-root /dev --proc-root /proc "
        "--kubelet-dir /var/lib/k --mixed-size --sriov-manage /usr/lib/nvidia/sriov-manage --mig-mode-order before-vfs "
        "--no-mig-compute-instances --mig-gi-cleanup keep",
    "WantedBy=multi-user.target nvidia-vgpud.service nvidia-vgpu-mgr.service": "WantedBy=multi-user.target nvidia-vgpu-mgr.service",
}


def test_the_defaults_give_the_roles_unit_byte_for_byte():
    command = boot_unit_file.exec_start(CLI, LAYOUT, "default", HANDOVER, ("/sys", "/dev", "/proc", None), {})
    assert boot_unit_file.text("default", LAYOUT, command) == DEFAULTS


def test_every_option_is_on_the_command_line_and_the_units_follow_the_lists():
    options = dict(mixed_size=True, sriov_manage_path="/usr/lib/nvidia/sriov-manage", mig_mode_order="before-vfs",
                   mig_compute_instances=False, mig_gi_cleanup="keep")
    command = boot_unit_file.exec_start(CLI, LAYOUT, "my-layout.v2", HANDOVER,
                                        ("/host/sys", "/dev", "/proc", "/var/lib/k"), options)
    lines = [EVERY_OPTION_LINES.get(line, line) for line in DEFAULTS.splitlines()]
    expected = "\n".join(line for line in lines if line is not None) + "\n"
    assert boot_unit_file.text("my-layout.v2", LAYOUT, command, ["nvidia-vgpu-mgr.service"], [], 60) == expected


def test_the_clis_defaults_are_not_spelled_out():
    options = dict(mixed_size=False, sriov_manage_path=None, mig_mode_order="after-vfs", mig_compute_instances=True,
                   mig_gi_cleanup="destroy")
    assert boot_unit_file.exec_start(CLI, LAYOUT, "a", HANDOVER, ("/sys", "/dev", "/proc", ""), options) == (
        CLI + " apply --config " + LAYOUT + " --selected a --agent-applied " + HANDOVER
        + " --sysfs-root /sys --dev-root /dev --proc-root /proc")


def test_no_manager_unit_gives_the_roles_unit_byte_for_byte():
    """vgpu_profiles_manager_units: [] (the manager in a pod, no systemd unit): the template wrote
    "WantedBy=multi-user.target " with its space; without it a converged node's unit is rewritten and
    reloaded on upgrade (text rendered by ansible-core from the template of cbcebcb^)."""
    command = boot_unit_file.exec_start(CLI, LAYOUT, "default", HANDOVER, ("/sys", "/dev", "/proc", None), {})
    expected = (DEFAULTS.replace("After=nvidia-vgpud.service nvidia-vgpu-mgr.service\n", "After=\n")
                .replace("PartOf=nvidia-vgpud.service\nPartOf=nvidia-vgpu-mgr.service\n", "")
                .replace("WantedBy=multi-user.target nvidia-vgpud.service nvidia-vgpu-mgr.service\n",
                         "WantedBy=multi-user.target \n"))
    assert boot_unit_file.text("default", LAYOUT, command, [], ["kubelet.service"]) == expected


# issue 40 item 7: values systemd reads specially ------------------------------------------------------------

ODD_LAYOUT = '/etc/accelops vgpu/50%/layout.json'
ODD_ROOTS = ("/host/sys%S", "/dev", "/proc", "/var/lib/$KUBELET")
ODD_OPTIONS = {"sriov_manage_path": '/opt/nv "x"\\sriov-manage;', "mig_gi_cleanup": "keep"}
ODD_STATE = "/run/accelops vgpu/state.json"


def odd_unit(cli=CLI):
    command = boot_unit_file.exec_start(cli, ODD_LAYOUT, "l40s-50x.v1", HANDOVER, ODD_ROOTS, ODD_OPTIONS)
    return boot_unit_file.text("l40s-50x.v1", ODD_LAYOUT, command, state_file=ODD_STATE)


def setting(text, name):
    [line] = [line for line in text.splitlines() if line.startswith(name + "=")]
    return line[len(name) + 1:]


def test_specifiers_variables_blanks_quotes_and_backslashes_are_escaped_for_systemd():
    unit = odd_unit()
    assert setting(unit, "ExecStart") == (
        CLI + ' apply --config "/etc/accelops vgpu/50%%/layout.json" --selected l40s-50x.v1 --agent-applied ' + HANDOVER
        + ' --sysfs-root /host/sys%%S --dev-root /dev --proc-root /proc --kubelet-dir /var/lib/$$KUBELET'
        + ' --sriov-manage "/opt/nv \\"x\\"\\\\sriov-manage;" --mig-gi-cleanup keep')
    assert setting(unit, "Documentation") == "file:///etc/accelops%%20vgpu/50%%25/layout.json"
    assert setting(unit, "ConditionPathExists") == "/etc/accelops vgpu/50%%/layout.json"
    assert setting(unit, "Environment") == 'ACCELOPS_VGPU_RETRY_FOR=300 "ACCELOPS_VGPU_STATE_FILE=/run/accelops vgpu/state.json"'


def systemd_words(line, variables=True):
    """A command line or Environment= list as systemd.service(5) "Command lines", systemd.exec(5) and systemd.unit(5)
    "Specifiers" say it is read: %% is %, words split on blanks, double quotes with C escapes, $$ is $."""
    words = []
    found = re.findall(r'"((?:[^"\\]|\\.)*)"(?=\s|$)|(\S+)', line.replace("%%", "\0"))
    for index, (quoted, plain) in enumerate(found):
        word = re.sub(r"\\(.)", r"\1", quoted) if quoted or not plain else plain
        variables_here = variables and index > 0      # not in the executable's path
        assert "%" not in word and (not variables_here or "$" not in word.replace("$$", "")), word
        words.append(word.replace("\0", "%").replace("$$", "$") if variables_here else word.replace("\0", "%"))
    return words


def test_the_units_text_reads_back_as_the_arguments_meant():
    unit = odd_unit("/opt/a $b/accelops-vgpu")
    argv = systemd_words(setting(unit, "ExecStart"))
    assert setting(unit, "ExecStart").startswith('"/opt/a $b/accelops-vgpu" apply ')   # the executable: no variables
    assert argv[0] == "/opt/a $b/accelops-vgpu"
    assert argv[argv.index("--config") + 1] == ODD_LAYOUT
    assert argv[argv.index("--sysfs-root") + 1] == "/host/sys%S"
    assert argv[argv.index("--kubelet-dir") + 1] == "/var/lib/$KUBELET"
    assert argv[argv.index("--sriov-manage") + 1] == ODD_OPTIONS["sriov_manage_path"]
    assert len(argv) == 20
    assert systemd_words(setting(unit, "Environment"), variables=False) == [
        "ACCELOPS_VGPU_RETRY_FOR=300", "ACCELOPS_VGPU_STATE_FILE=" + ODD_STATE]


SYSTEMD_ANALYZE = shutil.which("systemd-analyze")


@pytest.mark.skipif(not SYSTEMD_ANALYZE, reason="systemd-analyze (Debian: systemd) not installed")
def test_systemd_analyze_verify_accepts_the_unit_with_odd_values(tmp_path):
    """The issue's unit (selected 'l40s-50%x' unquoted for systemd) was fatal here: 'Failed to resolve unit specifiers'."""
    cli = tmp_path / "bin 5%$d" / "accelops-vgpu"     # verify wants an executable ExecStart: the path as meant
    cli.parent.mkdir()
    cli.write_text("#!/bin/sh\n")
    cli.chmod(0o755)
    unit = tmp_path / "accelops-vgpu.service"
    unit.write_text(odd_unit(str(cli)))
    done = subprocess.run([SYSTEMD_ANALYZE, "verify", "--man=no", str(unit)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0 and str(unit) not in done.stdout + done.stderr, done.stdout + done.stderr


@pytest.mark.parametrize("where", ["selected", "layout", "sysfs_root", "kubelet_dir", "sriov_manage_path",
                                   "state_file", "manager_units", "before_units"])
def test_a_control_character_is_one_line_naming_the_option(where):
    bad = "/x\nExecStartPre=/bin/rm"
    values = dict(selected="default", layout=LAYOUT, sysfs_root="/sys", kubelet_dir=None, sriov_manage_path=None,
                  state_file=boot_unit_file.STATE_FILE, manager_units=["nvidia-vgpu-mgr.service"],
                  before_units=["kubelet.service"])
    values[where] = [bad] if where.endswith("_units") else bad
    with pytest.raises(boot_unit_file.UnitValueError) as err:
        command = boot_unit_file.exec_start(CLI, values["layout"], values["selected"], HANDOVER,
                                            (values["sysfs_root"], "/dev", "/proc", values["kubelet_dir"]),
                                            {"sriov_manage_path": values["sriov_manage_path"]})
        boot_unit_file.text(values["selected"], values["layout"], command, values["manager_units"],
                            values["before_units"], state_file=values["state_file"])
    assert str(err.value).startswith("boot unit: %s" % where) and "'/x\\nExecStartPre=/bin/rm'" in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("selected", ["l40s-50%x", "my layout", "-lead", "a" * 64, "", "l40s/x"])
def test_selected_must_be_a_config_name(selected):
    with pytest.raises(boot_unit_file.UnitValueError) as err:
        boot_unit_file.exec_start(CLI, LAYOUT, selected, HANDOVER, ("/sys", "/dev", "/proc", None), {})
    assert str(err.value).startswith("boot unit: selected ") and "is not a vgpu-device-manager config name" in str(err.value)


@pytest.mark.parametrize("option, value, message", [
    ("manager_units", ["nvidia vgpu.service"], "boot unit: manager_units: nvidia vgpu.service is not a systemd unit name"),
    ("layout", "/etc/layout.json\\", "boot unit: layout '/etc/layout.json\\\\' ends with a blank or a backslash"),
])
def test_what_a_setting_cannot_carry_is_refused(option, value, message):
    args = {"manager_units": list(boot_unit_file.MANAGER_UNITS), "layout": LAYOUT}
    args[option] = value
    with pytest.raises(boot_unit_file.UnitValueError) as err:
        boot_unit_file.text("default", args["layout"], "x", args["manager_units"])
    assert str(err.value).startswith(message)


@pytest.mark.skipif(not SYSTEMD_ANALYZE, reason="systemd-analyze (Debian: systemd) not installed")
def test_a_layout_path_with_a_quote_gives_a_documentation_url_systemd_reads(tmp_path):
    """Documentation= is a list of words systemd unquotes: a ' left in the URL was 'Invalid syntax, ignoring'."""
    cli = tmp_path / "accelops-vgpu"
    cli.write_text("#!/bin/sh\n")
    cli.chmod(0o755)
    layout = "/etc/it's/läyout.json"
    command = boot_unit_file.exec_start(str(cli), layout, "default", HANDOVER, ("/sys", "/dev", "/proc", None), {})
    unit = tmp_path / "accelops-vgpu.service"
    unit.write_text(boot_unit_file.text("default", layout, command))
    assert setting(unit.read_text(), "Documentation") == "file:///etc/it%%27s/l%%C3%%A4yout.json"
    done = subprocess.run([SYSTEMD_ANALYZE, "verify", "--man=no", str(unit)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0 and str(unit) not in done.stdout + done.stderr, done.stdout + done.stderr


@pytest.mark.parametrize("char", ["\\", "'", '"'])
def test_a_node_cli_path_systemd_would_not_execute_is_refused_naming_it(char):
    """systemd refuses an executable path with a quote or a backslash, quoted or not (src/core/load-fragment.c
    config_parse_exec: string_is_safe; systemd-analyze verify: 'Executable name contains special characters', a
    fatal error): one line, before anything is written, instead of a unit that never starts."""
    cli = "/opt/it%ss/accelops-vgpu" % char
    with pytest.raises(boot_unit_file.UnitValueError) as err:
        boot_unit_file.exec_start(cli, LAYOUT, "default", HANDOVER, ("/sys", "/dev", "/proc", None), {})
    assert str(err.value) == ("boot unit: node_cli %s has a quote or a backslash, which systemd does not take in the "
                              "path of the command it runs" % shown(cli))
