"""Kubelet-side tests: a short temporary kubelet directory (unix socket paths are at most 107 bytes)."""

from __future__ import annotations

import shutil
import tempfile

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.paths import KubeletPaths
from ansible_collections.accelops.vgpu.tests.fakes.kubelet_double import TestKubelet


@pytest.fixture
def kubelet_dir():
    path = tempfile.mkdtemp(prefix="kl", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def paths(kubelet_dir):
    return KubeletPaths(kubelet_dir)


@pytest.fixture
def kubelet(kubelet_dir):
    """The test kubelet serving kubelet.sock in `kubelet_dir` (stopped plugins' devices go after 0.5 s)."""
    double = TestKubelet(kubelet_dir, grace=0.5).start()
    yield double
    double.stop()
