# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    # Options of every image module (image/image_build.py IMAGE_OPTIONS): labels, pull, push, registry.
    DOCUMENTATION = r"""
options:
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
  work_dir:
    description:
      - Directory for the temporary build context. Default C($TMPDIR).
    type: path
  executable:
    description:
      - The podman executable.
    type: str
    default: podman
attributes:
  check_mode:
    support: full
    description: Reads the registry and the local image only; reports the same RV(ignore:changed) and RV(actions) as a real run.
  diff_mode:
    support: full
    description: Shows the image reference and the local and registry input hashes before and after, plus the planned actions.
"""
