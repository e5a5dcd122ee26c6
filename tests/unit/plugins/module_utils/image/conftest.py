"""Fixtures of the image engine's tests: `params`, the vgpu_manager_image module's options (test_agent_image.py
has its own for the agent image)."""

import pytest

from ansible_collections.accelops.vgpu.tests.fakes.runfile import write_runfile

VERSION = "570.124.03"


@pytest.fixture
def params(tmp_path):
    return dict(name="registry.example.com:5000/nvidia/vgpu-manager", os_tag="ubuntu24.04",
                runfile=write_runfile(tmp_path, VERSION), driver_version=None, containerfile="FROM scratch\n",
                context_files={"entrypoint.sh": "#!/bin/sh\n"}, context_paths={}, build_args={"BASE_IMAGE": "b"},
                labels={"owner": "tests"}, pull="never", push=True, force=False, registry_username="builder",
                registry_password="s3cret", tls_verify=True, allow_public_registry=False,
                work_dir=str(tmp_path), executable="podman")
