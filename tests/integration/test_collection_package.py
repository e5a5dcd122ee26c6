"""The collection builds into a tarball that installs with no network: its one dependency, kubernetes.core,
is the one the `ansible` package bundles."""
import json
import os
import subprocess
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = REPO / ".venv" / "bin"


def _galaxy(*args, env):
    return subprocess.run([str(BIN / "ansible-galaxy"), "collection", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, check=False)


def test_tarball_builds_and_installs_offline(tmp_path):
    env = dict(os.environ, ANSIBLE_HOME=str(tmp_path / "home"),
               # any attempt to reach a Galaxy server would fail fast on this address
               ANSIBLE_GALAXY_SERVER="http://127.0.0.1:9/", http_proxy="http://127.0.0.1:9",
               https_proxy="http://127.0.0.1:9")
    built = _galaxy("build", "--force", "--output-path", str(tmp_path / "dist"), ".", env=env)
    assert built.returncode == 0, built.stderr
    tarball = next((tmp_path / "dist").glob("accelops-vgpu-*.tar.gz"))
    with tarfile.open(tarball) as tar:
        names = set(tar.getnames())
        manifest = json.load(tar.extractfile("MANIFEST.json"))
    assert manifest["collection_info"]["dependencies"] == {"kubernetes.core": ">=5.2.0,<7.0.0"}
    assert "plugins/module_utils/node/hw/sysfs.py" in names
    assert not any(n.startswith((".venv", ".build", ".git/")) or "__pycache__" in n for n in names)

    # a clean Ansible that only knows the empty target path, as on a fresh bastion
    dest = tmp_path / "collections"
    env = {k: v for k, v in env.items() if k not in ("ANSIBLE_CONFIG", "ANSIBLE_COLLECTIONS_PATH")}
    env.update(ANSIBLE_CONFIG=str(tmp_path / "none.cfg"), ANSIBLE_COLLECTIONS_PATH=str(dest))
    installed = _galaxy("install", "--offline", "-p", str(dest), str(tarball), env=env)
    assert installed.returncode == 0, installed.stderr
    assert (dest / "ansible_collections/accelops/vgpu/MANIFEST.json").is_file()
    assert "kubernetes.core" in installed.stdout and "already installed" in installed.stdout
    listed = _galaxy("list", "accelops.vgpu", env=env)
    assert "accelops.vgpu" in listed.stdout
