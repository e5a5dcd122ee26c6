"""The read-only boot-file check the apply module answers in the same round trip."""

import hashlib
import os
import stat

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.node.boot import boot_files

CONTENT = b"[Unit]\nDescription=accelops-vgpu\n"


def entry(path, content=CONTENT, mode="0644"):
    return {"path": str(path), "checksum": hashlib.sha1(content).hexdigest(), "mode": mode}


@pytest.fixture
def installed(tmp_path):
    path = tmp_path / "etc/accelops-vgpu.service"
    path.parent.mkdir()
    path.write_bytes(CONTENT)
    os.chmod(path, 0o644)
    if os.geteuid() != 0:
        pytest.skip("files must be owned by root:root, which only root can create")
    return path


def test_an_installed_file_is_current(installed):
    assert boot_files.outdated([entry(installed)]) == []


@pytest.mark.parametrize("change", ["content", "mode", "missing", "directory", "symlink"])
def test_anything_else_is_outdated(installed, tmp_path, change):
    if change == "content":
        installed.write_bytes(CONTENT + b"# edited\n")
    elif change == "mode":
        os.chmod(installed, 0o755)
    elif change == "missing":
        installed.unlink()
    elif change == "directory":
        installed.unlink()
        installed.mkdir()
    else:
        target = tmp_path / "elsewhere"
        target.write_bytes(CONTENT)
        os.chmod(target, 0o644)
        installed.unlink()
        installed.symlink_to(target)
    assert boot_files.outdated([entry(installed), entry(tmp_path / "etc")]) == [str(installed), str(tmp_path / "etc")]


def test_the_order_of_the_entries_is_kept(installed, tmp_path):
    other = tmp_path / "missing.json"
    assert boot_files.outdated([entry(other), entry(installed), entry(installed, b"x")]) == [str(other), str(installed)]


@pytest.mark.parametrize("bad,message", [
    ({"path": "etc/x", "checksum": "ab", "mode": "0644"}, "is not an absolute path"),
    ({"path": "/etc/x", "checksum": "", "mode": "0644"}, "/etc/x has neither content nor a checksum"),
    ({"path": "/etc/x", "checksum": "ab", "mode": "rw-r--r--"}, "/etc/x: mode 'rw-r--r--' is not an octal mode"),
])
def test_an_entry_that_cannot_be_checked_is_an_error_naming_it(bad, message):
    with pytest.raises(boot_files.BootFileError) as err:
        boot_files.outdated([bad])
    assert message in str(err.value)


@pytest.fixture
def as_root():
    if os.geteuid() != 0:
        pytest.skip("installing files owned by root:root needs root")


def content_entry(path, content=CONTENT, mode="0644"):
    return {"path": str(path), "content": content, "mode": mode}


def test_install_writes_missing_and_different_files_and_creates_their_directories(as_root, tmp_path):
    layout, unit = tmp_path / "etc/accelops-vgpu/layout.json", tmp_path / "etc/systemd/accelops-vgpu.service"
    unit.parent.mkdir(parents=True)
    unit.write_bytes(b"old\n")
    os.chmod(unit, 0o644)
    result = boot_files.install([content_entry(layout, "{}\n"), content_entry(unit)])
    assert result["outdated"] == result["installed"] == [str(layout), str(unit)]
    assert result["diff"] == {"before": {str(layout): None, str(unit): hashlib.sha1(b"old\n").hexdigest()},
                              "after": {str(layout): hashlib.sha1(b"{}\n").hexdigest(),
                                        str(unit): hashlib.sha1(CONTENT).hexdigest()}}
    assert layout.read_text() == "{}\n" and unit.read_bytes() == CONTENT
    for path, mode in ((layout, 0o644), (layout.parent, 0o755), (unit, 0o644)):
        info = os.stat(path)
        assert (stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid) == (mode, 0, 0), path
    assert sorted(os.listdir(unit.parent)) == ["accelops-vgpu.service"]   # no temporary file left
    again = boot_files.install([content_entry(layout, "{}\n"), content_entry(unit)])
    assert again == {"outdated": [], "installed": [], "diff": {"before": {}, "after": {}}}


def test_a_wrong_mode_alone_is_rewritten(as_root, tmp_path):
    cli = tmp_path / "accelops-vgpu"
    boot_files.install([content_entry(cli, b"#!zip", "0755")])
    os.chmod(cli, 0o644)
    assert boot_files.install([content_entry(cli, b"#!zip", "0755")])["installed"] == [str(cli)]
    assert stat.S_IMODE(os.stat(cli).st_mode) == 0o755


def test_check_mode_reports_and_writes_nothing(tmp_path):
    layout = tmp_path / "etc/layout.json"
    result = boot_files.install([content_entry(layout, "{}\n")], check_mode=True)
    assert result["installed"] == [str(layout)]
    assert not (tmp_path / "etc").exists()


def test_a_checksum_only_entry_is_looked_at_and_never_written(tmp_path):
    other = tmp_path / "other"
    result = boot_files.install([entry(other)])
    assert result["outdated"] == [str(other)] and result["installed"] == []
    assert result["diff"]["after"][str(other)] is None
    assert not other.exists()


def test_a_bad_entry_anywhere_stops_before_the_first_write(tmp_path):
    good = tmp_path / "layout.json"
    with pytest.raises(boot_files.BootFileError) as err:
        boot_files.install([content_entry(good), {"path": str(tmp_path / "x"), "content": "", "mode": "644x"}])
    assert "mode '644x' is not an octal mode" in str(err.value)
    assert not good.exists()


def test_a_failed_write_names_the_file(as_root, tmp_path):
    blocker = tmp_path / "etc"
    blocker.write_text("a file where a directory should be")
    with pytest.raises(boot_files.BootFileError) as err:
        boot_files.install([content_entry(blocker / "layout.json")])
    assert str(err.value).startswith("boot_files: cannot install %s: " % (blocker / "layout.json"))


def test_remove_takes_the_files_and_an_owned_directory_once_empty(tmp_path):
    layout, cli = tmp_path / "etc/accelops-vgpu/layout.json", tmp_path / "bin/accelops-vgpu"
    for path in (layout, cli):
        path.parent.mkdir(parents=True)
        path.write_bytes(CONTENT)
    (tmp_path / "bin/other-tool").write_text("not ours")
    entries = [dict(content_entry(layout), own_directory=True), dict(content_entry(cli), own_directory=True),
               content_entry(tmp_path / "etc/missing")]
    check = boot_files.remove(entries, check_mode=True)
    assert check["removed"] == [str(layout), str(cli)] and layout.exists() and cli.exists()
    result = boot_files.remove(entries)
    assert result["removed"] == [str(layout), str(cli)]
    assert result["diff"]["before"][str(layout)] == hashlib.sha1(CONTENT).hexdigest()
    assert not layout.parent.exists()                   # ours and empty
    assert not cli.exists() and (tmp_path / "bin/other-tool").exists()   # not empty: kept
    assert boot_files.remove(entries)["removed"] == []


def test_remove_refuses_a_directory_before_removing_anything(tmp_path):
    unit = tmp_path / "accelops-vgpu.service"
    unit.write_bytes(CONTENT)
    (tmp_path / "layout.json").mkdir()
    with pytest.raises(boot_files.BootFileError, match="layout.json is a directory, not a file to remove"):
        boot_files.remove([content_entry(unit), content_entry(tmp_path / "layout.json")])
    assert unit.exists()


def test_an_entry_to_remove_goes_with_state_present_after_the_files_are_installed(tmp_path):
    """The node agent's handover file when a play takes the node back (vgpu_profiles_reclaim_from_agent):
    removed in the same module run as the install, reported with the removals, in check mode only reported."""
    from ansible_collections.accelops.vgpu.plugins.module_utils.node.boot import boot_unit
    handover, layout = tmp_path / "etc/agent-applied.json", tmp_path / "etc/layout.json"
    handover.parent.mkdir()
    handover.write_text("{}\n")
    files = [{"path": str(handover), "mode": "0644", "remove": True}, content_entry(layout, "{}\n")]
    assert boot_files.validate(files) == [hashlib.sha1(b"{}\n").hexdigest()]
    check = boot_unit.converge(None, None, files, present=True, check_mode=True)
    assert (check["removed"], check["installed"], check["changed"]) == ([str(handover)], [str(layout)], True)
    assert handover.exists() and not layout.exists()
    if os.geteuid() != 0:
        return          # installing needs root (root:root files); the removal was checked above
    done = boot_unit.converge(None, None, files, present=True)
    assert done["removed"] == [str(handover)] and done["diff"]["after"][str(handover)] is None
    assert not handover.exists() and layout.exists()
    again = boot_unit.converge(None, None, files, present=True)
    assert (again["removed"], again["installed"], again["changed"]) == ([], [], False)


@pytest.mark.parametrize("bad, message", [
    ({"path": "etc/agent-applied.json", "remove": True}, "'etc/agent-applied.json' is not an absolute path"),
    ({"path": "DIR", "remove": True}, "is a directory, not a file to remove"),
])
def test_a_bad_entry_to_remove_is_refused_by_validate(tmp_path, bad, message):
    bad = dict(bad, path=str(tmp_path) if bad["path"] == "DIR" else bad["path"])
    with pytest.raises(boot_files.BootFileError, match=message):
        boot_files.validate([content_entry(tmp_path / "layout.json"), bad])


def test_a_path_named_twice_is_refused(tmp_path):
    layout = tmp_path / "etc/layout.json"
    for second in ({"path": str(layout), "mode": "0644", "remove": True}, content_entry(tmp_path / "etc/../etc/layout.json")):
        with pytest.raises(boot_files.BootFileError, match="layout.json is named twice"):
            boot_files.validate([content_entry(layout, "{}\n"), second])
    with pytest.raises(boot_files.BootFileError, match="named twice"):
        boot_files.validate_removal([content_entry(layout), content_entry(layout)])


def test_a_removal_that_fails_comes_before_any_install(tmp_path, monkeypatch):
    """The unit file would otherwise be written in a run that then fails: the next run finds it current and
    reloads nothing. Removing first, the failed run writes nothing and the next one installs and reloads."""
    from ansible_collections.accelops.vgpu.plugins.module_utils.node.boot import boot_unit
    import errno
    handover, layout = tmp_path / "etc/agent-applied.json", tmp_path / "etc/layout.json"
    handover.parent.mkdir()
    handover.write_text("{}\n")
    real_unlink = os.unlink

    def refused(path, *args, **kwargs):
        if str(path) == str(handover):
            raise PermissionError(errno.EPERM, "Operation not permitted")
        return real_unlink(path, *args, **kwargs)
    monkeypatch.setattr(os, "unlink", refused)
    files = [{"path": str(handover), "mode": "0644", "remove": True}, content_entry(layout, "{}\n")]
    with pytest.raises(boot_files.BootFileError, match="cannot remove %s" % handover):
        boot_unit.converge(None, None, files, present=True)
    assert handover.exists() and not layout.exists()
