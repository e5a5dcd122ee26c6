"""The node CLI zipapp: one layout for the controller's build (tools/build-node-cli.py) and the
module's build on the node (from the sources Python loaded), reproducible bytes."""

import importlib.machinery
import io
import os
import subprocess
import sys
import types
import zipfile
import zipimport

from ansible_collections.accelops.vgpu.plugins.module_utils import cli_zipapp

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), *[".."] * 4))
SOURCE = os.path.join(REPO, "plugins", "module_utils")


READ, EXISTS = cli_zipapp.from_directory(SOURCE)


def test_the_closure_follows_every_import_form_and_only_the_cli_needs():
    names = cli_zipapp.closure(READ, EXISTS)
    assert "node_cli" in names and "node.sysfs" in names      # `from ...node.sysfs import Sysfs`
    assert "agent.agent" in names and "agent.settings" in names  # `from ...agent import agent, settings as s`
    assert "errors" in names                                  # `from ...module_utils.errors import ...`
    assert not [n for n in names if n.startswith(("cluster.", "image."))]   # controller side stays out
    assert "cli_zipapp" not in names and "node.module_glue" not in names
    # the agent's device plugin, imported only when DEVICE_PLUGIN is on, and the generated gRPC modules it needs
    assert {"kubelet.vgpu_device_plugin", "kubelet.transport", "kubelet.api.deviceplugin_v1beta1_pb2_grpc"} <= set(names)


def test_the_cli_and_its_apply_path_never_import_grpc(tmp_path):
    pyz = tmp_path / "cli.pyz"
    pyz.write_bytes(cli_zipapp.build(READ, EXISTS))
    code = ("import sys, runpy; sys.argv = ['accelops-vgpu', 'agent', '--help']; sys.path.insert(0, %r)\n"
            "try:\n    runpy.run_path(%r, run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "assert 'grpc' not in sys.modules and 'google.protobuf' not in sys.modules, 'grpc imported'\n"
            % (str(pyz), str(pyz)))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert "--kubelet-dir" in result.stdout and "KUBELET_DIR" in result.stdout


def test_loaded_sources_give_the_same_bytes_as_the_checkout_and_runs_are_reproducible():
    from_checkout = cli_zipapp.build(READ, EXISTS)
    assert cli_zipapp.shipped() == from_checkout == cli_zipapp.build(READ, EXISTS)


def test_the_archive_is_a_stored_zipapp_with_package_inits(tmp_path):
    data = cli_zipapp.shipped()
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
    out = tmp_path / "cli.pyz"
    subprocess.run([sys.executable, os.path.join(REPO, "tools", "build-node-cli.py"), str(out)], check=True,
                   stdout=subprocess.DEVNULL)
    assert out.read_bytes() == cli_zipapp.shipped()
    assert (tmp_path / "cli.pyz.sha1").read_text() == cli_zipapp.sha1(out.read_bytes()) + "\n"


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
