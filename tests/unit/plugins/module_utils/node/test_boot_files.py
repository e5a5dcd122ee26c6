"""The read-only boot-file check the apply module answers in the same round trip."""

import hashlib
import os

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.node import boot_files

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
    ({"path": "/etc/x", "checksum": "", "mode": "0644"}, "/etc/x has no checksum"),
    ({"path": "/etc/x", "checksum": "ab", "mode": "rw-r--r--"}, "/etc/x: mode 'rw-r--r--' is not an octal mode"),
])
def test_an_entry_that_cannot_be_checked_is_an_error_naming_it(bad, message):
    with pytest.raises(boot_files.BootFileError) as err:
        boot_files.outdated([bad])
    assert message in str(err.value)
