"""The layers stay visible in the tree: a module imports only from its own layer and those below it.

    node engine (node/, and the shared modules at the top of module_utils/)
      <- kubelet plugins (kubelet/)  <- agent (agent/)  <- the node CLI (node_cli.py)
    cluster/ and image/ are controller-side; the node side never imports them.
"""

import os
import re

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils import errors

MODULE_UTILS = os.path.dirname(errors.__file__)
IMPORT = re.compile(r"^\s*(?:from|import) ansible_collections\.accelops\.vgpu\.plugins\.module_utils\.(\w+)", re.M)
ABOVE = {
    "node": {"kubelet", "agent", "cluster", "image", "node_cli"},
    "kubelet": {"agent", "cluster", "image", "node_cli"},
    "agent": {"cluster", "image", "node_cli"},
}
# the zipapp builder packs the node CLI and names every module the agent may load: a packager, not engine code
PACKAGER = os.path.join("node", "cli_zipapp.py")


def _modules(layer):
    root = os.path.join(MODULE_UTILS, layer)
    for directory, dummy, files in os.walk(root):
        for name in files:
            relative = os.path.relpath(os.path.join(directory, name), MODULE_UTILS)
            if name.endswith(".py") and not name.endswith(("_pb2.py", "_pb2_grpc.py")) and relative != PACKAGER:
                yield relative


@pytest.mark.parametrize("layer,path", [(layer, path) for layer in sorted(ABOVE) for path in sorted(_modules(layer))])
def test_no_module_imports_a_layer_above_its_own(layer, path):
    with open(os.path.join(MODULE_UTILS, path)) as handle:
        assert sorted(set(IMPORT.findall(handle.read())) & ABOVE[layer]) == []
