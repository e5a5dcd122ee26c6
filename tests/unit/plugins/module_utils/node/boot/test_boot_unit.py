"""systemctl for the boot unit: read first, act only where something is missing, one line per refusal."""

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.node.boot import boot_unit
from ansible_collections.accelops.vgpu.plugins.module_utils.runner import FunctionRunner

UNIT = "accelops-vgpu.service"


class FakeSystemd:
    """`systemctl` as far as the boot unit needs it: is-enabled/is-active answers, actions recorded."""

    def __init__(self, enabled="disabled", active="inactive", refuse=None):
        self.enabled, self.active, self.refuse, self.actions = enabled, active, refuse, []

    def __call__(self, argv):
        assert argv[0] == "systemctl"
        verb = argv[1]
        if verb == "is-enabled":
            return (0 if self.enabled == "enabled" else 1), self.enabled + "\n", ""
        if verb == "is-active":
            return (0 if self.active == "active" else 3), self.active + "\n", ""
        self.actions.append(argv[1:])
        if verb == self.refuse:
            return 1, "", "Failed to %s unit: Unit %s not found.\n" % (verb, UNIT)
        self.enabled = {"enable": "enabled", "disable": "disabled"}.get(verb, self.enabled)
        self.active = {"start": "active", "stop": "inactive"}.get(verb, self.active)
        return 0, "", ""


def test_a_fresh_unit_is_reloaded_enabled_and_started_then_left_alone():
    systemd = FakeSystemd()
    runner = FunctionRunner(systemd)
    actions = boot_unit.plan(runner, UNIT, True, files_changed=True)
    assert actions == [["daemon-reload"], ["enable", UNIT], ["start", UNIT]]
    assert systemd.actions == []                      # planning only reads
    boot_unit.run(runner, UNIT, actions)
    assert systemd.actions == actions
    assert boot_unit.plan(runner, UNIT, True, files_changed=False) == []


def test_a_changed_unit_file_only_reloads_an_enabled_active_unit():
    runner = FunctionRunner(FakeSystemd("enabled", "active"))
    assert boot_unit.plan(runner, UNIT, True, files_changed=True) == [["daemon-reload"]]


@pytest.mark.parametrize("enabled, active, actions", [
    ("enabled", "active", [["stop", UNIT], ["disable", UNIT]]),
    ("enabled", "failed", [["disable", UNIT]]),
    ("not-found", "inactive", []),
])
def test_absent_stops_and_disables_what_is_there(enabled, active, actions):
    assert boot_unit.plan(FunctionRunner(FakeSystemd(enabled, active)), UNIT, False, False) == actions


def test_a_refused_action_is_one_line_naming_the_unit():
    runner = FunctionRunner(FakeSystemd(refuse="enable"))
    with pytest.raises(boot_unit.BootUnitError) as err:
        boot_unit.run(runner, UNIT, boot_unit.plan(runner, UNIT, True, True))
    assert str(err.value) == ("boot unit accelops-vgpu.service: systemctl enable accelops-vgpu.service failed: "
                              "Failed to enable unit: Unit accelops-vgpu.service not found.")


def test_no_systemctl_says_so():
    runner = FunctionRunner(lambda argv: (127, "", "[Errno 2] No such file or directory: 'systemctl'"))
    with pytest.raises(boot_unit.BootUnitError, match="systemctl cannot be run .*set manage_service false"):
        boot_unit.plan(runner, UNIT, True, False)
