# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node CLI zipapp an image carries as `accelops-vgpu.pyz` (build-host side, standard library).

Both image modules use it through image_build.ContainerImage: the node agent image always, the vGPU
manager image with `include_node_cli` (its entrypoint re-applies the node's layout with it). The zipapp
is a file the user gives (`node_cli`), or by default the one the module builds from the collection
sources Ansible shipped it with (cli_zipapp.py): the node CLI, the same bytes `vgpu_profile` installs on
the nodes, unless the image module passes another builder (the agent image: the agent CLI). Either way
the bytes are held in memory and written only into the private build context, which the engine removes
after the run: no other file to clean up, none left by a failed run.
So an installed collection (ansible-galaxy, AWX, an execution environment) needs no checkout and no
controller-side build step.
"""

from __future__ import annotations

import hashlib

from ansible_collections.accelops.vgpu.plugins.module_utils import cli_zipapp

CONTEXT_NAME = "accelops-vgpu.pyz"   # its file name in the build context (the Containerfiles COPY it)


class NodeCliFile:
    """The zipapp's bytes: those of `given` (a path on the build host, read once, so the hash is of what
    goes in), or without it what `build` makes (default: the shipped sources)."""

    context_name = CONTEXT_NAME

    def __init__(self, given=None, build=None):
        self.given = given or None
        if self.given:
            with open(self.given, "rb") as handle:
                self.data = handle.read()
        else:
            self.data = (build or cli_zipapp.shipped)()
        self.sha256 = hashlib.sha256(self.data).hexdigest()
