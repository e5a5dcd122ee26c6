"""The boot files of one apply run, composed from vgpu_profile's options without Ansible (node/boot/boot_entries.py)."""

import json

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.node.boot import boot_entries, boot_files, boot_unit_file

UNIT = dict(manager_units=["nvidia-vgpu-mgr.service"], before_units=["kubelet.service"], retry_for=300,
            agent_applied="/run/accelops-vgpu/agent-applied.json", state_file=boot_unit_file.STATE_FILE)
CONFIG = {"version": "v1", "vgpu-configs": {"default": [{"devices": "all", "vgpu-devices": {"L40S-24Q": 2}}]}}


def item(path, **source):
    entry = dict(path=path, mode="0644", content=None, layout=False, node_cli=False, unit=None, checksum=None,
                 own_directory=False, remove=False)
    entry.update(source)
    return entry


def params(root, **overrides):
    values = dict(boot_files_root=str(root), config=CONFIG, selected="default", sysfs_root="/sys", dev_root="/dev",
                  proc_root="/proc", kubelet_dir=None, mixed_size=False)
    values.update(overrides)
    return values


ITEMS = [item("/etc/accelops-vgpu/layout.json", layout=True),
         item("/usr/local/bin/accelops-vgpu", mode="0755", node_cli=True),
         item("/etc/systemd/system/accelops-vgpu.service", unit=UNIT),
         item("/etc/accelops-vgpu/README", content="hello\n"),
         item("/etc/other", checksum="0" * 40),
         item("/run/accelops-vgpu/agent-applied.json", remove=True)]


def test_each_source_becomes_its_content_below_the_root_and_the_unit_names_node_paths(tmp_path):
    built = []
    found = boot_entries.entries(ITEMS, params(tmp_path), lambda: built.append(1) or b"PK cli")
    assert [e["path"] for e in found] == [str(tmp_path) + i["path"] for i in ITEMS]
    assert json.loads(found[0]["content"]) == CONFIG and found[1]["content"] == b"PK cli" and built == [1]
    command = boot_unit_file.exec_start("/usr/local/bin/accelops-vgpu", "/etc/accelops-vgpu/layout.json", "default",
                                        UNIT["agent_applied"], ("/sys", "/dev", "/proc", None), {})
    assert found[2]["content"] == boot_unit_file.text("default", "/etc/accelops-vgpu/layout.json", command,
                                                      UNIT["manager_units"], UNIT["before_units"], 300, UNIT["state_file"])
    assert found[3]["content"] == "hello\n" and found[4]["checksum"] == "0" * 40
    assert found[5]["remove"] and "content" not in found[5]
    boot_files.validate(found)   # what the module hands on: valid entries


def test_absent_keeps_the_paths_and_builds_nothing(tmp_path):
    def not_built():
        raise AssertionError("the node CLI was built for state=absent")
    found = boot_entries.entries(ITEMS, params(tmp_path), not_built, present=False)
    assert [sorted(e) for e in found] == [["mode", "own_directory", "path", "remove"]] * len(ITEMS)


@pytest.mark.parametrize("items,overrides,message", [
    ([item("/a", content="x", checksum="1" * 40)], {}, "boot_files: /a needs exactly one of content, layout, node_cli, "
                                                       "unit, checksum (has content, checksum)"),
    ([item("/a", remove=True, layout=True)], {}, "boot_files: /a is to be removed, it takes none of content, layout, "
                                                 "node_cli, unit, checksum (has layout)"),
    ([item("/a", layout=True)], {"config": None}, "boot_files: /a: layout needs the config option"),
    ([item("/u", unit=UNIT), item("/l", layout=True)], {"selected": None},
     "boot_files: /u: the unit needs one layout entry, one node_cli entry and the selected option (missing or more "
     "than one: node_cli, selected)"),
    ([item("/a", content="x")], {"boot_files_root": "relative"}, "boot_files_root: 'relative' is not an absolute path"),
])
def test_bad_entries_are_one_line_naming_the_file(tmp_path, items, overrides, message):
    with pytest.raises(boot_files.BootFileError) as raised:
        boot_entries.entries(items, params(tmp_path, **overrides), lambda: b"PK")
    assert str(raised.value) == message


def test_a_root_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(boot_files.BootFileError, match="boot_files_root: %s/file is not a directory" % tmp_path):
        boot_entries.entries([item("/a", content="x")], params(tmp_path / "file"), lambda: b"PK")
    assert boot_entries.entries([], params("relative"), lambda: b"PK") == []   # no items: the root is not asked
