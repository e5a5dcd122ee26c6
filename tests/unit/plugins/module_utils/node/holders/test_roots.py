"""Node roots: a missing or unusable sysfs_root, dev_root or proc_root is one line naming it."""

import pytest

from fake_node import FakeNode

from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders.roots import RootError, check_roots


@pytest.fixture
def fake(tmp_path):
    return FakeNode(tmp_path / "node")


def test_a_usable_node_passes(fake):
    check_roots(str(fake.sys), str(fake.dev), str(fake.proc))


def test_a_sysfs_without_gpus_is_still_usable(tmp_path):
    (tmp_path / "sys/bus/pci/devices").mkdir(parents=True)
    check_roots(str(tmp_path / "sys"))


@pytest.mark.parametrize("broken,message", [
    ("sysfs_root", "sysfs_root {path}: no such directory"),
    ("dev_root", "dev_root {path}: no such directory"),
    ("proc_root", "proc_root {path}: no such directory"),
    ("sysfs-without-pci", "sysfs_root {path}: no bus/pci/devices below it"),
    ("sysfs-is-a-file", "sysfs_root {path}: not a directory"),
])
def test_an_unusable_root_is_one_line_naming_it(fake, tmp_path, broken, message):
    roots = {"sysfs_root": str(fake.sys), "dev_root": str(fake.dev), "proc_root": str(fake.proc)}
    if broken in roots:
        roots[broken] = str(tmp_path / "typo")
        path = roots[broken]
    elif broken == "sysfs-without-pci":
        path = roots["sysfs_root"] = str(tmp_path / "empty")
        (tmp_path / "empty").mkdir()
    else:
        path = roots["sysfs_root"] = str(tmp_path / "file")
        (tmp_path / "file").write_text("")
    with pytest.raises(RootError) as err:
        check_roots(**roots)
    assert str(err.value).startswith(message.format(path=path)) and "\n" not in str(err.value)


def test_roots_not_given_are_not_checked(fake, tmp_path):
    check_roots(str(fake.sys), dev_root=None, proc_root=None)
