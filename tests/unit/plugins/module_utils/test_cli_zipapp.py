"""The node CLI zipapp: one layout for the controller's build (tools/build-node-cli.py) and the
modules' builds (from the sources Python loaded or Ansible shipped), reproducible bytes; each module's
payload carries the sources of the flavour it builds and no more."""

import importlib.machinery
import io
import os
import subprocess
import sys
import types
import zipfile
import zipimport

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils import cli_zipapp

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), *[".."] * 4))
SOURCE = os.path.join(REPO, "plugins", "module_utils")


READ, EXISTS = cli_zipapp.from_directory(SOURCE)
AGENT_SIDE = ("agent.", "kubelet.")


def test_the_closure_follows_every_import_form_and_only_the_cli_needs():
    names = cli_zipapp.closure(READ, EXISTS, agent=True)
    assert "node_cli" in names and "node.hw.sysfs" in names   # `from ...node.hw.sysfs import Sysfs`
    assert "agent.agent" in names and "agent.settings" in names  # `from ...agent import ...settings as s`
    assert "errors" in names                                  # `from ...module_utils.errors import ...`
    assert not [n for n in names if n.startswith(("cluster.", "image."))]   # controller side stays out
    assert "cli_zipapp" not in names and "node.module_glue" not in names
    # the agent's device plugin, imported only when DEVICE_PLUGIN is on, and the generated gRPC modules it needs
    assert {"kubelet.vgpu_device_plugin", "kubelet.transport", "kubelet.api.deviceplugin_v1beta1_pb2_grpc"} <= set(names)


def test_the_node_cli_is_the_node_engine_alone():
    node = cli_zipapp.closure(READ, EXISTS)
    assert "node_cli" in node and "node.engine.vgpu_apply" in node and "node.boot.boot_retry" in node
    assert [n for n in node if n.startswith(AGENT_SIDE)] == []
    assert set(node) < set(cli_zipapp.closure(READ, EXISTS, agent=True))


def test_the_node_clis_agent_says_in_one_line_where_the_agent_runs(tmp_path):
    pyz = tmp_path / "node.pyz"
    pyz.write_bytes(cli_zipapp.build(READ, EXISTS))
    run = subprocess.run([sys.executable, str(pyz), "agent", "--node-name", "gpu-a"], capture_output=True, text=True,
                         check=False)
    assert (run.returncode, run.stdout) == (2, "")
    assert run.stderr == ("accelops-vgpu agent: this node CLI has no node agent: the agent runs from its image "
                          "(accelops.vgpu.agent_image; the vgpu_node_agent role deploys it)\n")
    helped = subprocess.run([sys.executable, str(pyz), "--help"], capture_output=True, text=True, check=False)
    assert helped.returncode == 0 and "{apply,assert,export,idle,agent}" in helped.stdout


def test_the_cli_and_its_apply_path_never_import_grpc(tmp_path):
    pyz = tmp_path / "cli.pyz"
    pyz.write_bytes(cli_zipapp.build(READ, EXISTS, agent=True))
    code = ("import sys, runpy; sys.argv = ['accelops-vgpu', 'agent', '--help']; sys.path.insert(0, %r)\n"
            "try:\n    runpy.run_path(%r, run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "assert 'grpc' not in sys.modules and 'google.protobuf' not in sys.modules, 'grpc imported'\n"
            % (str(pyz), str(pyz)))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert "--kubelet-dir" in result.stdout and "KUBELET_DIR" in result.stdout


@pytest.mark.parametrize("agent", [False, True])
def test_loaded_sources_give_the_same_bytes_as_the_checkout_and_runs_are_reproducible(agent):
    from_checkout = cli_zipapp.build(READ, EXISTS, agent)
    assert cli_zipapp.shipped(agent) == from_checkout == cli_zipapp.build(READ, EXISTS, agent)


def test_the_archive_is_a_stored_zipapp_with_package_inits(tmp_path):
    data = cli_zipapp.shipped(agent=True)
    assert data.startswith(b"#!/usr/bin/env python3\n")
    archive = zipfile.ZipFile(io.BytesIO(data))
    infos = archive.infolist()
    assert {i.compress_type for i in infos} == {zipfile.ZIP_STORED}
    assert {i.date_time for i in infos} == {(1980, 1, 1, 0, 0, 0)}
    names = archive.namelist()
    assert names == sorted(names) and "__main__.py" in names
    assert "ansible_collections/accelops/vgpu/plugins/module_utils/agent/__init__.py" in names
    target = tmp_path / "accelops-vgpu"
    target.write_bytes(data)
    os.chmod(target, 0o755)
    run = subprocess.run([sys.executable, str(target), "--help"], capture_output=True, text=True, check=False)
    assert run.returncode == 0 and "apply" in run.stdout


def test_the_tool_writes_the_same_bytes_and_their_checksum(tmp_path):
    for flags, agent in (([], True), (["--without-agent"], False)):
        out = tmp_path / ("cli-%s.pyz" % agent)
        subprocess.run([sys.executable, os.path.join(REPO, "tools", "build-node-cli.py")] + flags + [str(out)],
                       check=True, stdout=subprocess.DEVNULL)
        assert out.read_bytes() == cli_zipapp.shipped(agent)
        assert (tmp_path / (out.name + ".sha1")).read_text() == cli_zipapp.sha1(out.read_bytes()) + "\n"


def test_sources_read_from_a_zip_like_ansiballz_give_the_same_bytes(tmp_path, monkeypatch):
    """The module's path: module_utils imported from a zip (zipimport) is read as members of that zip."""
    archive = tmp_path / "payload.zip"
    prefix = cli_zipapp.PACKAGE.replace(".", "/") + "/"
    with zipfile.ZipFile(archive, "w") as payload:
        for name, text in cli_zipapp.archive_files(READ, EXISTS).items():
            if name.startswith(prefix):
                payload.writestr(name, text)
    assert cli_zipapp.build(*cli_zipapp.from_zip(str(archive), prefix)) == cli_zipapp.build(READ, EXISTS)
    # shipped() finds that zip from the imported package (its zipimport loader and __path__)
    package = types.ModuleType(cli_zipapp.PACKAGE)
    loader = zipimport.zipimporter(str(archive) + "/" + prefix.rsplit("/", 2)[0])
    package.__spec__ = importlib.machinery.ModuleSpec(cli_zipapp.PACKAGE, loader, is_package=True)
    package.__path__ = [str(archive) + "/" + prefix.rstrip("/")]
    monkeypatch.setitem(sys.modules, cli_zipapp.PACKAGE, package)
    monkeypatch.setattr(cli_zipapp, "loaded_source", None)   # the import system is not asked
    assert cli_zipapp.shipped() == cli_zipapp.build(READ, EXISTS)


# Packs modules as ansible-core does (executor/module_common.py recursive_finder: every import statement it can see,
# also under TYPE_CHECKING), in a process of its own: the packer needs Ansible's collection loader installed.
PACK = """
import datetime, os, sys, zipfile
from ansible.utils.collection_loader._collection_finder import _AnsibleCollectionFinder
_AnsibleCollectionFinder(paths=[sys.argv[1]])._install()
from ansible.executor import module_common
from ansible._internal._ansiballz import _builder
for name in sys.argv[4:]:
    path = os.path.join(sys.argv[2], name + '.py')
    with open(path, 'rb') as handle, zipfile.ZipFile(os.path.join(sys.argv[3], name + '.zip'), 'w') as payload:
        module_common.recursive_finder(name, 'ansible_collections.accelops.vgpu.plugins.modules.' + name,
                                       module_common.Origin(path=path).tag(handle.read()), payload,
                                       datetime.datetime.now(datetime.timezone.utc),
                                       _builder.ExtensionManager.create(task_vars={}))
"""


def test_each_modules_payload_carries_the_cli_it_builds_and_no_more(tmp_path):
    """vgpu_profile (the boot unit's CLI) and vgpu_manager_image ship the node engine, not the agent and the
    kubelet plugins (Ansible parses every shipped file on every run); agent_image ships the agent CLI's
    sources. Each builds, from its payload, the same bytes as the checkout."""
    modules = {"vgpu_profile": False, "vgpu_manager_image": False, "agent_image": True}
    subprocess.run([sys.executable, "-c", PACK, os.path.join(REPO, ".build", "collections"),
                    os.path.join(REPO, "plugins", "modules"), str(tmp_path)] + list(modules), check=True)
    prefix = cli_zipapp.PACKAGE.replace(".", "/") + "/"
    for name, agent in modules.items():
        payload = str(tmp_path / (name + ".zip"))
        shipped = [n[len(prefix):-3].replace("/", ".") for n in zipfile.ZipFile(payload).namelist()
                   if n.startswith(prefix) and not n.endswith("__init__.py")]
        assert bool([n for n in shipped if n.startswith(AGENT_SIDE)]) == agent, name
        assert cli_zipapp.build(*cli_zipapp.from_zip(payload, prefix), agent) == cli_zipapp.build(READ, EXISTS, agent)
