"""The boot unit's text, built on the node (node/boot_unit_file.py): byte for byte what the role's
Jinja template wrote before (these two texts are that template's output, rendered by ansible-core)."""

from ansible_collections.accelops.vgpu.plugins.module_utils.node import boot_unit_file

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
    "Description=accelops vGPU layout (default)": "Description=accelops vGPU layout (my layout)",
    "After=nvidia-vgpud.service nvidia-vgpu-mgr.service": "After=nvidia-vgpu-mgr.service",
    "Before=kubelet.service": None,
    "PartOf=nvidia-vgpud.service": None,
    "Environment=ACCELOPS_VGPU_RETRY_FOR=300 ACCELOPS_VGPU_STATE_FILE=/run/accelops-vgpu/boot-state.json":
        "Environment=ACCELOPS_VGPU_RETRY_FOR=60 ACCELOPS_VGPU_STATE_FILE=/run/accelops-vgpu/boot-state.json",
    "TimeoutStartSec=600": "TimeoutStartSec=360",
    "ExecStart=/usr/local/bin/accelops-vgpu apply --config /etc/accelops-vgpu/layout.json --selected default "
    "--agent-applied /etc/accelops-vgpu/agent-applied.json --sysfs-root /sys --dev-root /dev --proc-root /proc":
        "ExecStart=/usr/local/bin/accelops-vgpu apply --config /etc/accelops-vgpu/layout.json --selected 'my layout' "
        "--agent-applied /etc/accelops-vgpu/agent-applied.json --sysfs-root /host/sys --dev-root /dev --proc-root /proc "
        "--kubelet-dir /var/lib/k --mixed-size --sriov-manage '/usr/lib/nvidia/sriov manage' --mig-mode-order before-vfs "
        "--no-mig-compute-instances --mig-gi-cleanup keep",
    "WantedBy=multi-user.target nvidia-vgpud.service nvidia-vgpu-mgr.service": "WantedBy=multi-user.target nvidia-vgpu-mgr.service",
}


def test_the_defaults_give_the_roles_unit_byte_for_byte():
    command = boot_unit_file.exec_start(CLI, LAYOUT, "default", HANDOVER, ("/sys", "/dev", "/proc", None), {})
    assert boot_unit_file.text("default", LAYOUT, command) == DEFAULTS


def test_every_option_is_on_the_command_line_quoted_and_the_units_follow_the_lists():
    options = dict(mixed_size=True, sriov_manage_path="/usr/lib/nvidia/sriov manage", mig_mode_order="before-vfs",
                   mig_compute_instances=False, mig_gi_cleanup="keep")
    command = boot_unit_file.exec_start(CLI, LAYOUT, "my layout", HANDOVER, ("/host/sys", "/dev", "/proc", "/var/lib/k"),
                                        options)
    lines = [EVERY_OPTION_LINES.get(line, line) for line in DEFAULTS.splitlines()]
    expected = "\n".join(line for line in lines if line is not None) + "\n"
    assert boot_unit_file.text("my layout", LAYOUT, command, ["nvidia-vgpu-mgr.service"], [], 60) == expected


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
