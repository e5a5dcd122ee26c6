"""The node CLI's arguments, output and exit codes on a plain-file L40S tree (no writes needed)."""

import json

import pytest

from fake_node import FakeNode

from ansible_collections.accelops.vgpu.plugins.module_utils import node_cli as cli

PF = "0000:41:00.0"
CREATABLE = "ID    : vGPU Name\n1153  : NVIDIA L40S-12Q\n1155  : NVIDIA L40S-24Q\n1156  : NVIDIA L40S-48Q\n"


@pytest.fixture
def node(tmp_path):
    fake = FakeNode(tmp_path / "node")
    fake.pf(PF)
    for vf in fake.set_numvfs(PF, 4):
        (fake.dir(vf) / "nvidia/creatable_vgpu_types").write_text(CREATABLE)
    layout = tmp_path / "layout.json"
    layout.write_text(json.dumps({"layout": [{"device_filter": "0x26B910DE", "profiles": {"L40S-24Q": 2}}]}))
    return fake, str(layout)


def run(capsys, fake, *argv):
    roots = ["--sysfs-root", str(fake.sys), "--dev-root", str(fake.dev), "--proc-root", str(fake.proc)]
    code = cli.main(list(argv) + roots)
    out, err = capsys.readouterr()
    return code, out, err


def test_assert_exits_1_and_says_what_differs(node, capsys):
    fake, layout = node
    code, out, dummy = run(capsys, fake, "assert", "--config", layout)
    assert code == 1 and out == "GPU %s: has no vGPUs, layout wants 2 x L40S-24Q\n" % PF


def test_apply_check_json_plans_without_writing(node, capsys):
    fake, layout = node
    code, out, dummy = run(capsys, fake, "apply", "--check", "--json", "--config", layout)
    result = json.loads(out)
    assert code == 0 and result["changed"] and result["vfs_enabled"] == []
    assert [v["after"] for v in result["gpus"][0]["vgpus"]] == ["L40S-24Q", "L40S-24Q", None, None]
    assert (fake.dir("0000:41:00.4") / "nvidia/current_vgpu_type").read_text() == "0\n"


def test_apply_text_output_lists_each_slot(node, capsys):
    fake, layout = node
    code, out, dummy = run(capsys, fake, "apply", "--check", "--config", layout)
    assert code == 0
    assert out.splitlines() == ["%s (L40S, vendor-vfio): would change 2 vGPU slot(s)" % PF,
                                "  0000:41:00.4: - -> L40S-24Q", "  0000:41:00.5: - -> L40S-24Q"]


def test_config_comes_from_the_environment(node, capsys, monkeypatch):
    fake, layout = node
    monkeypatch.setenv("ACCELOPS_VGPU_CONFIG", layout)
    code, out, dummy = run(capsys, fake, "assert")
    assert code == 1 and "layout wants 2 x L40S-24Q" in out


@pytest.mark.parametrize("fmt,expected", [
    ("layout", {"layout": [{"devices": [PF], "profiles": {}}]}),
    ("vdm", {"version": "v1", "vgpu-configs": {"exported": [{"devices": [0], "vgpu-devices": {}}]}}),
])
def test_export_formats(node, capsys, fmt, expected):
    fake, dummy = node
    code, out, dummy2 = run(capsys, fake, "export", "--format", fmt)
    assert code == 0 and json.loads(out) == expected


def test_errors_are_one_line_on_stderr_with_exit_2(node, capsys, tmp_path):
    fake, dummy = node
    code, out, err = run(capsys, fake, "assert")
    assert code == 2 and out == "" and err == "accelops-vgpu assert: --config FILE is required (or ACCELOPS_VGPU_CONFIG)\n"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"version": "v1", "vgpu-configs": {"a": [{"devices": "all", "vgpu-devices": {},
                                                                        "mig-devices": {}}]}}))
    code, out, err = run(capsys, fake, "apply", "--config", str(bad))
    assert code == 2 and err.count("\n") == 1 and "vgpu-configs.a[0]: unknown field(s) 'mig-devices'" in err


def test_wait_timeout_is_separate_from_the_lock_timeout(node, capsys, monkeypatch):
    fake, layout = node
    seen = []
    monkeypatch.setattr(cli.vgpu_apply, "apply", lambda *a, **kwargs: seen.append(kwargs) or {
        "vfs_enabled": [], "gpus": [], "warnings": []})
    assert run(capsys, fake, "apply", "--config", layout)[0] == 0
    assert run(capsys, fake, "apply", "--config", layout, "--wait-timeout", "7.5", "--lock-timeout", "3")[0] == 0
    assert [(k["wait_timeout"], k["lock_timeout"]) for k in seen] == [(120.0, 120.0), (7.5, 3.0)]
    for bad in ("0", "-1", "soon", "nan"):
        with pytest.raises(SystemExit) as exited:
            run(capsys, fake, "apply", "--config", layout, "--wait-timeout", bad)
        assert exited.value.code == 2 and "is not a positive number of seconds" in capsys.readouterr()[1]


def test_sriov_manage_option_reaches_the_vf_enabling(node, capsys, monkeypatch):
    fake, layout = node
    nodes = []
    monkeypatch.setattr(cli.vgpu_apply, "apply", lambda engine, *a, **k: nodes.append(engine) or {
        "vfs_enabled": [], "gpus": [], "warnings": []})
    tool = "/run/nvidia/driver/usr/lib/nvidia/sriov-manage"
    assert run(capsys, fake, "apply", "--config", layout, "--sriov-manage", tool)[0] == 0
    assert run(capsys, fake, "apply", "--config", layout)[0] == 0
    assert [n.sriov_manage_path for n in nodes] == [tool, None]


def test_a_multi_line_engine_error_is_still_printed_as_one_line(node, capsys, monkeypatch):
    def from_file(path, selected=None):
        raise cli.vgpu_layout.LayoutError("%s: first\nsecond" % path)

    monkeypatch.setattr(cli.vgpu_layout, "from_file", from_file)
    code, out, err = run(capsys, node[0], "apply", "--config", "c.json")
    assert code == 2 and err == "accelops-vgpu apply: c.json: first\\nsecond\n"


def test_a_layout_that_selects_no_gpu_warns(node, capsys, tmp_path):
    fake, dummy = node
    other = tmp_path / "t4.json"
    other.write_text(json.dumps([{"device_filter": "0x1EB810DE", "profiles": {"T4-1Q": 16}}]))
    code, out, err = run(capsys, fake, "apply", "--check", "--config", str(other))
    assert code == 0 and out == "" and err == "warning: the layout selects no NVIDIA GPU on this node; nothing to do\n"


@pytest.mark.parametrize("verb", ["apply", "assert", "export"])
@pytest.mark.parametrize("root", ["--sysfs-root", "--dev-root", "--proc-root"])
def test_a_missing_root_is_an_error_not_an_empty_node(node, capsys, tmp_path, verb, root):
    fake, layout = node
    roots = {"--sysfs-root": str(fake.sys), "--dev-root": str(fake.dev), "--proc-root": str(fake.proc)}
    roots[root] = str(tmp_path / "typo")
    argv = [verb] + (["--config", layout] if verb != "export" else [])
    code = cli.main(argv + [item for pair in roots.items() for item in pair])
    out, err = capsys.readouterr()
    option = root[2:].replace("-", "_")
    assert code == 2 and out == ""
    assert err == "accelops-vgpu %s: %s %s: no such directory\n" % (verb, option, tmp_path / "typo")


def test_a_sysfs_root_without_pci_devices_is_an_error(node, capsys, tmp_path):
    fake, layout = node
    (tmp_path / "not-sys").mkdir()
    code = cli.main(["apply", "--config", layout, "--sysfs-root", str(tmp_path / "not-sys"),
                     "--dev-root", str(fake.dev), "--proc-root", str(fake.proc)])
    assert code == 2 and "sysfs_root %s: no bus/pci/devices below it" % (tmp_path / "not-sys") in capsys.readouterr()[1]


@pytest.mark.parametrize("devices,message", [
    (["0000:41:00.4"], "layout[0]: devices: 0000:41:00.4 is a VF of %s; select its physical function" % PF),
    (["0000:99:00.0"], "layout[0]: devices: no PCI device 0000:99:00.0 on this node"),
    (["41:00.0", PF], "layout[0]: devices: '41:00.0' and '%s' select the same devices" % PF),
    ([0, PF], "layout[0]: devices: %s is selected twice (by 0 and '%s')" % (PF, PF)),
])
def test_layout_devices_follow_the_sriov_vfs_rules(node, capsys, tmp_path, devices, message):
    fake, dummy = node
    layout = tmp_path / "devices.json"
    layout.write_text(json.dumps([{"devices": devices, "profiles": {"L40S-24Q": 1}}]))
    code, out, err = run(capsys, fake, "apply", "--config", str(layout))
    assert code == 2 and err.startswith("accelops-vgpu apply: ") and err.endswith(": %s\n" % message)
    assert err.count("\n") == 1
    assert (fake.dir("0000:41:00.4") / "nvidia/current_vgpu_type").read_text() == "0\n"


def test_the_agent_refuses_to_start_on_a_missing_root(node, capsys, tmp_path, monkeypatch):
    fake, dummy = node
    for name, value in (("NODE_NAME", "gpu-a"), ("CONFIG_FILE", str(tmp_path / "c.yaml")),
                        ("DEFAULT_VGPU_CONFIG", "default"), ("KUBECONFIG", str(tmp_path / "kubeconfig"))):
        monkeypatch.setenv(name, value)
    code = cli.main(["agent", "--sysfs-root", str(fake.sys), "--dev-root", str(tmp_path / "typo"),
                     "--proc-root", str(fake.proc)])
    out, err = capsys.readouterr()
    assert code == 2 and err == "accelops-vgpu agent: dev_root %s: no such directory\n" % (tmp_path / "typo")


def test_idle_exits_0_then_1_naming_the_holder_then_2_when_it_cannot_tell(node, capsys, tmp_path):
    fake, dummy = node
    code, out, dummy_err = run(capsys, fake, "idle")
    assert code == 0 and out == "nothing uses the vGPU stack\n"
    pid = fake.hold(fake.group_of("0000:41:00.5"))
    code, out, dummy_err = run(capsys, fake, "idle")
    assert code == 1 and out == "in use: 0000:41:00.5 held by pid %d\n" % pid
    code, out, dummy_err = run(capsys, fake, "idle", "--json")
    assert code == 1 and json.loads(out) == {"idle": False, "in_use": ["0000:41:00.5 held by pid %d" % pid]}
    code = cli.main(["idle", "--sysfs-root", str(fake.sys), "--dev-root", str(fake.dev),
                     "--proc-root", str(tmp_path / "no-proc")])
    assert code == 2 and "accelops-vgpu idle: proc_root" in capsys.readouterr()[1]


def test_idle_counts_a_prepared_dra_claim_under_the_kubelet_dir(node, capsys, tmp_path):
    """The manager image asks `idle` before it stops: a claim prepared for a VF means its VM may start any moment."""
    from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.checkpoint import COMPLETED, Checkpoint
    from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders.claim_holders import plugin_dir

    fake, dummy = node
    kubelet_dir = tmp_path / "k0s-kubelet"
    claim = Checkpoint(plugin_dir(str(kubelet_dir)))
    claim.set("uid-1", "vms", "vm-a-gpu", COMPLETED, [{"key": "0000:41:00.4", "typeID": 1155}])
    claim.save()
    code, out, dummy_err = run(capsys, fake, "idle")                      # the default kubelet dir knows no claim
    assert code == 0
    code, out, dummy_err = run(capsys, fake, "idle", "--kubelet-dir", str(kubelet_dir))
    assert code == 1 and out == "in use: 0000:41:00.4 held by DRA claim vms/vm-a-gpu\n"


def test_idle_exits_2_naming_a_checkpoint_whose_device_has_no_key(node, capsys, tmp_path):
    """A checksum-valid checkpoint another version wrote without `key`: one line, exit 2 (cannot tell = held)."""
    from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.checkpoint import COMPLETED, Checkpoint
    from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import claim_holders

    fake, dummy = node
    kubelet_dir = tmp_path / "kubelet"
    claim = Checkpoint(claim_holders.plugin_dir(str(kubelet_dir)))
    claim.set("uid-1", "vms", "vm-a-gpu", COMPLETED, [{"address": "0000:41:00.4", "typeID": 1155}])
    claim.save()
    code, out, err = run(capsys, fake, "idle", "--kubelet-dir", str(kubelet_dir))
    assert (code, out) == (2, "")
    assert len(err.splitlines()) == 1 and "device 0 has no key" in err and "Traceback" not in err


def test_the_agents_last_applied_config_wins_over_the_pinned_selection(node, capsys, tmp_path):
    fake, dummy = node
    both = tmp_path / "layout-all.json"   # what vgpu_profiles installs: every config, the unit pins one
    both.write_text(json.dumps({"version": "v1", "vgpu-configs": {
        "l40s-24q": [{"devices": "all", "vgpu-devices": {"L40S-24Q": 2}}],
        "l40s-12q": [{"devices": "all", "vgpu-devices": {"L40S-12Q": 4}}]}}))
    agent_file = tmp_path / "agent-applied.json"
    argv = ["apply", "--config", str(both), "--selected", "l40s-24q", "--agent-applied", str(agent_file), "--json"]
    code, out, err = run(capsys, fake, *argv)       # no agent file: the pinned selection
    assert code == 0 and err == ""
    assert [v["after"] for v in json.loads(out)["gpus"][0]["vgpus"]][:2] == ["L40S-24Q"] * 2
    agent_file.write_text(json.dumps({"version": "v1", "vgpu-configs": {
        "l40s-12q": [{"devices": "all", "vgpu-devices": {"L40S-12Q": 4}}]}}))
    code, out, err = run(capsys, fake, *argv)
    assert code == 0 and "the agent owns this node" in err
    assert [v["after"] for v in json.loads(out)["gpus"][0]["vgpus"]] == ["L40S-12Q"] * 4
    code, out, dummy_err = run(capsys, fake, "assert", "--config", str(both), "--selected", "l40s-24q",
                               "--agent-applied", str(agent_file))
    assert code == 0, out


def test_retry_for_and_state_file_record_the_boot_outcome(node, capsys, tmp_path, monkeypatch):
    fake, layout = node
    state = tmp_path / "run" / "boot.json"
    slept = []
    monkeypatch.setattr(cli.boot_retry.time, "sleep", slept.append)
    code, dummy, err = run(capsys, fake, "apply", "--config", str(tmp_path / "gone.json"), "--retry-for", "30",
                           "--state-file", str(state))
    assert code == 2 and slept == [] and json.loads(state.read_text())["state"] == "failed"
    code = cli.main(["apply", "--config", layout, "--retry-for", "0.5", "--state-file", str(state),
                     "--sysfs-root", str(fake.sys), "--dev-root", str(fake.dev), "--proc-root", str(tmp_path / "no")])
    err = capsys.readouterr()[1]
    assert code == 2 and "accelops-vgpu apply: attempt 1 failed (proc_root" in err
    assert "accelops-vgpu apply: giving up after" in err and slept
    assert json.loads(state.read_text())["state"] == "failed"
    code, dummy, err = run(capsys, fake, "apply", "--config", layout, "--retry-for", "30", "--state-file", str(state))
    assert code == 0 and json.loads(state.read_text())["state"] == "applied"


def test_idle_then_runs_the_command_under_the_node_lock_only_when_idle(node, capsys, tmp_path, monkeypatch):
    """Issue 32 item 4: the manager image's stop asks and disables VFs under one node lock hold (the lock the
    modules, the boot unit and the agent take), so no apply or claim prepare slips in between."""
    import os
    import sys

    from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders.node_lock import lock_dir, lock_name

    fake, dummy = node
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    lock = os.path.join(lock_dir(), lock_name(str(fake.sys)))
    marker = tmp_path / "ran"
    probe = ("import fcntl, sys\nf = open(%r, 'a')\ntry:\n    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
             "except BlockingIOError:\n    open(%r, 'w').write('locked')\n    sys.exit(0)\nsys.exit(3)\n"
             % (lock, str(marker)))
    roots = ["--sysfs-root", str(fake.sys), "--dev-root", str(fake.dev), "--proc-root", str(fake.proc)]
    assert cli.main(["idle"] + roots + ["--then", sys.executable, "-c", probe]) == 0
    assert marker.read_text() == "locked"        # the command ran while this process held the node lock
    marker.unlink()
    pid = fake.hold(fake.group_of("0000:41:00.5"))
    assert cli.main(["idle"] + roots + ["--then", sys.executable, "-c", probe]) == 1
    assert not marker.exists() and "in use: 0000:41:00.5 held by pid %d" % pid in capsys.readouterr()[0]
    os.unlink(str(fake.proc / str(pid) / "fd" / os.listdir(str(fake.proc / str(pid) / "fd"))[0]))
    assert cli.main(["idle"] + roots + ["--then", sys.executable, "-c", "import sys; sys.exit(5)"]) == 2
    assert "--then %s -c import sys; sys.exit(5) exited 5" % sys.executable in capsys.readouterr()[1]
