#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: vgpu_manager_image
short_description: Build the private NVIDIA vGPU manager image with podman and push it
version_added: 0.1.0
description:
  - Builds C(<name>:<driver version>-<os_tag>) from a Containerfile, extra context files and an
    C(NVIDIA-Linux-<arch>-<version>-vgpu-kvm.run) (or C(-vgpu-kvm-aie.run)) runfile with the podman CLI, and pushes it.
    The GPU Operator appends the node's OS tag to its C(vgpuManager.version), hence the tag.
  - Idempotent through the image label C(io.accelops.vgpu.input-hash), a sha256 of every input (Containerfile,
    context files, runfile checksum, build args, labels, tag). The image in the registry is checked first (registry
    HTTP API), then the local one; equal hashes mean no build and no push. A changed input rebuilds and pushes.
  - The runfile is licensed. A public registry (Docker Hub, also a name without a registry host, nvcr.io, quay.io,
    ghcr.io, gcr.io, registry.k8s.io, public.ecr.aws, mcr.microsoft.com, ...) fails before anything is built
    unless O(allow_public_registry=true).
  - The build context is a private temporary directory (removed afterwards); the runfile is hard-linked into it when
    possible. The Containerfile gets the build args C(DRIVER_VERSION), C(DRIVER_ARCH) and C(RUNFILE) (the runfile's
    file name in the context) on top of O(build_args).
author:
  - accelops.vgpu contributors (@accelops)
options:
  name:
    description:
      - Image name without tag, with the registry host, for example C(registry.example.com:5000/nvidia/vgpu-manager).
    type: str
    required: true
  os_tag:
    description:
      - OS tag the GPU Operator appends for the nodes, for example C(ubuntu24.04) or C(debian12).
    type: str
    required: true
  runfile:
    description:
      - Path of the vGPU-KVM runfile on the build host. Its name must match the pattern above and it must start
        with a makeself header; the driver version comes from its name.
    type: path
    required: true
  driver_version:
    description:
      - Expected driver version; fails when the runfile is another version.
    type: str
  containerfile:
    description:
      - Content of the Containerfile.
    type: str
    required: true
  context_files:
    description:
      - Further build context files as C(file name -> content), for example the entrypoint script.
    type: dict
    default: {}
  context_paths:
    description:
      - Further build context files as C(file name -> path on the build host), for example the node CLI zipapp.
    type: dict
    default: {}
  build_args:
    description:
      - Extra build args (C(--build-arg)), for example C(BASE_IMAGE).
    type: dict
    default: {}
  labels:
    description:
      - Extra image labels.
    type: dict
    default: {}
  pull:
    description:
      - Base image pull policy of C(podman build --pull).
    type: str
    choices: [always, missing, never, newer]
    default: missing
  push:
    description:
      - Push the image. With V(false) only the local image is built (and compared).
    type: bool
    default: true
  force:
    description:
      - Build and push even when the input hash is unchanged.
    type: bool
    default: false
  registry_username:
    description:
      - User for the registry (push and the registry check). Without it podman's own credentials are used for
        the push and the registry is read anonymously.
    type: str
  registry_password:
    description:
      - Password or token for O(registry_username). It is written only to a 0600 auth file in a private temporary
        directory for C(podman push --authfile), never to a command line.
    type: str
  tls_verify:
    description:
      - Verify the registry's TLS certificate. V(false) also allows plain HTTP (as C(podman --tls-verify=false)).
    type: bool
    default: true
  allow_public_registry:
    description:
      - Allow pushing to a public registry. Only for registries you know to be private despite their host name.
    type: bool
    default: false
  work_dir:
    description:
      - Directory for the temporary build context (it holds a copy or hard link of the runfile). Default C($TMPDIR).
    type: path
  executable:
    description:
      - The podman executable.
    type: str
    default: podman
notes:
  - Check mode reads the registry and the local image only.
attributes:
  check_mode:
    support: full
    description: Reads the registry and the local image only; reports the same RV(ignore:changed) and RV(actions) as a real run.
  diff_mode:
    support: full
    description: Shows the image reference and the local and registry input hashes before and after, plus the planned actions.
"""

EXAMPLES = r"""
- name: Build and push the vGPU manager image
  accelops.vgpu.vgpu_manager_image:
    name: registry.example.com/nvidia/vgpu-manager
    os_tag: ubuntu24.04
    runfile: /srv/nvidia/NVIDIA-Linux-x86_64-570.124.03-vgpu-kvm.run
    containerfile: "{{ lookup('ansible.builtin.template', 'Containerfile.j2') }}"
    context_files:
      vgpu-manager-entrypoint.sh: "{{ lookup('ansible.builtin.template', 'vgpu-manager-entrypoint.sh.j2') }}"
    build_args:
      BASE_IMAGE: docker.io/library/ubuntu:24.04
    registry_username: builder
    registry_password: "{{ vault_registry_password }}"
"""

RETURN = r"""
image:
  description: Full image reference.
  returned: always
  type: str
  sample: registry.example.com/nvidia/vgpu-manager:570.124.03-ubuntu24.04
tag:
  description: Image tag, C(<driver version>-<os_tag>).
  returned: always
  type: str
  sample: 570.124.03-ubuntu24.04
driver_version:
  description: Driver version of the runfile.
  returned: always
  type: str
input_hash:
  description: sha256 of all inputs, stored as the image label C(io.accelops.vgpu.input-hash).
  returned: always
  type: str
built:
  description: Whether the image was (or in check mode would be) built.
  returned: always
  type: bool
pushed:
  description: Whether the image was (or in check mode would be) pushed.
  returned: always
  type: bool
actions:
  description: C(build) and/or C(push), in order.
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.accelops.vgpu.plugins.module_utils.image.image_build import ImageBuild
from ansible_collections.accelops.vgpu.plugins.module_utils.node.module_glue import engine_errors, exit_with_diff
from ansible_collections.accelops.vgpu.plugins.module_utils.runner import FunctionRunner


def main():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", required=True),
            os_tag=dict(type="str", required=True),
            runfile=dict(type="path", required=True),
            driver_version=dict(type="str"),
            containerfile=dict(type="str", required=True),
            context_files=dict(type="dict", default={}),
            context_paths=dict(type="dict", default={}),
            build_args=dict(type="dict", default={}),
            labels=dict(type="dict", default={}),
            pull=dict(type="str", choices=["always", "missing", "never", "newer"], default="missing"),
            push=dict(type="bool", default=True),
            force=dict(type="bool", default=False),
            registry_username=dict(type="str"),
            registry_password=dict(type="str", no_log=True),
            tls_verify=dict(type="bool", default=True),
            allow_public_registry=dict(type="bool", default=False),
            work_dir=dict(type="path"),
            executable=dict(type="str", default="podman"),
        ),
        required_together=[("registry_username", "registry_password")],
        supports_check_mode=True,
    )
    with engine_errors(module) as result:
        result.update(ImageBuild(FunctionRunner(module.run_command), module.params).apply(module.check_mode))
    before, after = result.pop("before"), result.pop("after")
    exit_with_diff(module, result.pop("changed"), {"before": before, "after": dict(after, actions=result["actions"])},
                   **result)


if __name__ == "__main__":
    main()
