"""execution-environment.yml with the real ansible-builder: `create` writes the build context (Containerfile and
_build/) from the collection tarball, requirements.txt, bindep.txt and helm. `build` needs the base image and
package registries, which the test machines cannot reach: not run here."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
BIN = REPO / ".venv" / "bin"


def test_ansible_builder_creates_the_build_context(tmp_path):
    galaxy = yaml.safe_load((REPO / "galaxy.yml").read_text())
    ee = yaml.safe_load((REPO / "execution-environment.yml").read_text())
    tarball_name = "accelops-vgpu-%s.tar.gz" % galaxy["version"]
    assert ee["additional_build_files"][0]["src"] == ".build/dist/" + tarball_name, "EE names another version"

    # a copy of what the definition refers to, so a parallel `make build` is never read half-written
    work = tmp_path / "ee"
    for name in ("execution-environment.yml", "requirements.txt", "bindep.txt"):
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, work / name)
    (work / ".venv" / "bin").mkdir(parents=True)
    shutil.copy(BIN / "helm", work / ".venv" / "bin" / "helm")
    env = dict(os.environ, ANSIBLE_HOME=str(tmp_path / "home"))
    built = subprocess.run([str(BIN / "ansible-galaxy"), "collection", "build", "--force", "--output-path",
                            str(work / ".build" / "dist"), str(REPO)], capture_output=True, text=True, env=env,
                           check=False)
    assert built.returncode == 0, built.stderr

    proc = subprocess.run([str(BIN / "ansible-builder"), "create", "-f", "execution-environment.yml", "-c",
                           str(tmp_path / "context"), "--output-filename", "Containerfile"], cwd=work,
                          capture_output=True, text=True, env=env, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    context = tmp_path / "context"
    containerfile = (context / "Containerfile").read_text()
    assert 'ARG EE_BASE_IMAGE="quay.io/centos/centos:stream9"' in containerfile
    assert 'ARG ANSIBLE_INSTALL_REFS="ansible-core==2.21.5 ansible-runner"' in containerfile
    assert "COPY _build/collections/ /build/collections/" in containerfile
    assert containerfile.index("COPY _build/collections/") < containerfile.index("ansible-galaxy collection install")
    assert "COPY _build/bin/helm /usr/local/bin/helm" in containerfile
    build = context / "_build"
    assert (build / "requirements.txt").read_text() == (REPO / "requirements.txt").read_text()
    assert (build / "bindep.txt").read_text() == (REPO / "bindep.txt").read_text()
    assert yaml.safe_load((build / "requirements.yml").read_text()) == {"collections": [
        {"name": "/build/collections/" + tarball_name, "type": "file"}]}
    with tarfile.open(build / "collections" / tarball_name) as tar:
        names = set(tar.getnames())
    assert {"roles/vgpu_node_agent/tasks/main.yml", "charts/accelops-vgpu-node-agent/Chart.yaml",
            "meta/execution-environment.yml"} <= names
    assert os.access(build / "bin" / "helm", os.X_OK)


def test_bindep_gives_an_ee_only_the_runtime_packages():
    """The test-only and image-build entries carry a profile, so an EE (no profile) gets python3 alone."""
    listed = subprocess.run([str(BIN / "bindep"), "-l", "newline", "-f", str(REPO / "bindep.txt")],
                            capture_output=True, text=True, check=False)
    assert listed.stdout.split() == ["python3"], listed.stdout + listed.stderr
    tests = subprocess.run([str(BIN / "bindep"), "-l", "newline", "-f", str(REPO / "bindep.txt"), "test"],
                           capture_output=True, text=True, check=False)
    assert {"prometheus", "unzip", "npm"} <= set(tests.stdout.split())
