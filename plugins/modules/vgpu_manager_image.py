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
    context files, runfile and node CLI checksums, build args, labels, tag). The image in the registry is checked first (registry
    HTTP API), then the local one; equal hashes mean no build and no push. A changed input rebuilds and pushes.
  - The runfile is licensed. A public registry (Docker Hub, also a name without a registry host, nvcr.io, quay.io,
    ghcr.io, gcr.io, registry.k8s.io, public.ecr.aws, mcr.microsoft.com, ...) fails before anything is built
    unless O(allow_public_registry=true).
  - The build context is a private temporary directory (removed afterwards); the runfile is hard-linked into it when
    possible. The Containerfile gets the build args C(DRIVER_VERSION), C(DRIVER_ARCH) and C(RUNFILE) (the runfile's
    file name in the context) on top of O(build_args).
  - With O(include_node_cli) the build context also holds the node CLI zipapp as C(accelops-vgpu.pyz) (the
    Containerfile COPYs it; the role's entrypoint re-applies the node's vGPU layout with it after each start).
    The module builds it from the collection sources Ansible shipped it with, the same bytes
    M(accelops.vgpu.vgpu_profile) installs on the nodes, so an installed collection needs no checkout; only the
    private build context ever holds it. A new collection version with a changed node engine changes the input
    hash, so the image is rebuilt.
author:
  - accelops.vgpu contributors (@accelops)
extends_documentation_fragment:
  - accelops.vgpu.image_build
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
      - Further build context files as C(file name -> path on the build host). With O(include_node_cli),
        C(accelops-vgpu.pyz) is the module's own and not allowed here.
    type: dict
    default: {}
  include_node_cli:
    description:
      - Put the node CLI zipapp into the build context as C(accelops-vgpu.pyz) - O(node_cli), or else the one the
        module builds from the collection's own sources.
      - Default - V(true) when O(node_cli) is given, else V(false). V(false) with O(node_cli) is an error.
    type: bool
  node_cli:
    description:
      - Path of a node CLI zipapp on the build host to include as it is (for example one
        C(tools/build-node-cli.py) made from a checkout), instead of the one the module builds. A missing file fails
        before anything is built or read from the registry.
    type: path
  build_args:
    description:
      - Extra build args (C(--build-arg)), for example C(BASE_IMAGE).
    type: dict
    default: {}
  allow_public_registry:
    description:
      - Allow pushing to a public registry. Only for registries you know to be private despite their host name.
    type: bool
    default: false
notes:
  - Check mode reads the registry and the local image only.
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
    include_node_cli: true
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
node_cli_sha256:
  description: sha256 of the node CLI zipapp in the image.
  returned: when the image includes the node CLI
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

from ansible_collections.accelops.vgpu.plugins.module_utils.image.image_build import (
    ImageBuild, image_argspec, run_image_module)


def main():
    module = AnsibleModule(
        argument_spec=image_argspec(
            os_tag=dict(type="str", required=True),
            runfile=dict(type="path", required=True),
            driver_version=dict(type="str"),
            containerfile=dict(type="str", required=True),
            context_files=dict(type="dict", default={}),
            context_paths=dict(type="dict", default={}),
            include_node_cli=dict(type="bool"),
            node_cli=dict(type="path"),
            build_args=dict(type="dict", default={}),
            allow_public_registry=dict(type="bool", default=False),
        ),
        required_together=[("registry_username", "registry_password")],
        supports_check_mode=True,
    )
    run_image_module(module, ImageBuild)


if __name__ == "__main__":
    main()
