import os
import stat

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils import atomic_file
from ansible_collections.accelops.vgpu.plugins.module_utils.atomic_file import DURABLE, FILE, RENAME, write_file


def _mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def synced(monkeypatch):
    """Which kind of object each fsync hit: 'file' or 'directory'."""
    calls = []
    real = os.fsync

    def fsync(fd):
        calls.append("directory" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        return real(fd)

    monkeypatch.setattr(atomic_file.os, "fsync", fsync)
    return calls


@pytest.mark.parametrize("sync,expected", [(RENAME, []), (FILE, ["file"]), (DURABLE, ["file", "directory"])])
def test_sync_levels_fsync_what_they_promise(tmp_path, synced, sync, expected):
    path = tmp_path / "state.json"
    write_file(str(path), "{}\n", sync=sync)
    assert path.read_text() == "{}\n"
    assert synced == expected


def test_replaces_with_exact_mode_despite_umask_and_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "sub" / "dir" / "file"
    old = os.umask(0o077)
    try:
        write_file(str(path), "one", mode=0o644)
        write_file(str(path), b"\x00two", mode=0o600)
    finally:
        os.umask(old)
    assert path.read_bytes() == b"\x00two"
    assert _mode(path) == 0o600
    assert sorted(os.listdir(path.parent)) == ["file"]


def test_a_failed_write_keeps_the_old_content_and_removes_the_temporary_file(tmp_path, monkeypatch):
    path = tmp_path / "file"
    path.write_text("old")

    def no_space(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic_file.os, "fsync", no_space)
    with pytest.raises(OSError):
        write_file(str(path), "new")
    assert path.read_text() == "old"
    assert os.listdir(tmp_path) == ["file"]


def test_owner_is_set_on_the_file(tmp_path):
    path = tmp_path / "owned"
    write_file(str(path), "x", owner=(os.getuid(), os.getgid()))
    assert (os.stat(path).st_uid, os.stat(path).st_gid) == (os.getuid(), os.getgid())


def test_an_unknown_sync_level_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(ValueError):
        write_file(str(tmp_path / "f"), "x", sync="fast")
    assert not os.listdir(tmp_path)
