"""The layers stay visible in the tree: a module imports only from its own layer and those below it.

    node engine (node/, and the shared modules at the top of module_utils/)
      <- kubelet plugins (kubelet/)  <- agent (agent/)  <- the node CLI (node_cli.py and its zipapp
      packager cli_zipapp.py, beside it at the top)
    cluster/ and image/ are controller-side; the node side never imports them.
Inside the node engine, its rooms (docs/design.md "Node engine map"), each importing only from itself and the rooms
below it:
    node/module_glue.py (the modules' Ansible glue) -> boot/ -> engine/ -> layout/ -> holders/ -> hw/
No exemption: every file of a layer is checked, also imports inside functions or `if TYPE_CHECKING:`
blocks (Ansible's module packer follows those too).
"""

import os
import re

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils import errors

MODULE_UTILS = os.path.dirname(errors.__file__)
IMPORT = re.compile(r"^\s*(?:from|import) ansible_collections\.accelops\.vgpu\.plugins\.module_utils"
                    r"(?:\.(\w+)| import (\([^)]*\)|[\w, ]+))", re.M)
TOP = {"node_cli", "cli_zipapp"}    # the node CLI's layer: the top-level modules above the agent
ABOVE = {
    "node": {"kubelet", "agent", "cluster", "image"} | TOP,
    "kubelet": {"agent", "cluster", "image"} | TOP,
    "agent": {"cluster", "image"} | TOP,
}
SHARED = "."    # the shared top-level modules (errors, runner, ...): the node engine's layer
ABOVE[SHARED] = ABOVE["node"]


ROOMS = ("hw", "holders", "layout", "engine", "boot")    # bottom to top
NODE_TOP = {"__init__.py", "module_glue.py"}    # node/'s own files, above every room; the rest lives in a room
NODE_IMPORT = re.compile(r"^\s*(?:from|import) ansible_collections\.accelops\.vgpu\.plugins\.module_utils\.node"
                         r"(?:\.(\w+)| import (\([^)]*\)|[\w, ]+))", re.M)


def _modules(layer):
    if layer == SHARED:
        for name in os.listdir(MODULE_UTILS):
            if name.endswith(".py") and name[:-3] not in TOP:
                yield name
        return
    root = os.path.join(MODULE_UTILS, layer)
    for directory, dummy, files in os.walk(root):
        for name in files:
            if name.endswith(".py") and not name.endswith(("_pb2.py", "_pb2_grpc.py")):
                yield os.path.relpath(os.path.join(directory, name), MODULE_UTILS)


@pytest.mark.parametrize("layer,path", [(layer, path) for layer in sorted(ABOVE) for path in sorted(_modules(layer))])
def test_no_module_imports_a_layer_above_its_own(layer, path):
    with open(os.path.join(MODULE_UTILS, path)) as handle:
        assert sorted(_imported(handle.read()) & ABOVE[layer]) == []


def _imported(text):
    """Top names below module_utils a source imports: `module_utils.agent.x` -> agent, also the
    `from ...module_utils import node_cli, errors` form."""
    names = set()
    for package, members in IMPORT.findall(text):
        names.update([package] if package else [n.split()[0] for n in members.strip("()").split(",") if n.strip()])
    return names


def test_every_import_form_is_seen():
    text = ("from ansible_collections.accelops.vgpu.plugins.module_utils.agent import agent\n"
            "    from ansible_collections.accelops.vgpu.plugins.module_utils import node_cli  # noqa\n"
            "from ansible_collections.accelops.vgpu.plugins.module_utils import (errors,\n    cli_zipapp)\n")
    assert _imported(text) == {"agent", "node_cli", "errors", "cli_zipapp"}


def test_the_node_cli_layer_is_at_the_top_of_module_utils():
    """The zipapp packager names node_cli, kubelet/ and agent/ modules: it lives beside node_cli.py, not in node/."""
    assert sorted(name + ".py" for name in TOP if os.path.isfile(os.path.join(MODULE_UTILS, name + ".py"))) == \
        ["cli_zipapp.py", "node_cli.py"]
    assert not os.path.exists(os.path.join(MODULE_UTILS, "node", "cli_zipapp.py"))


def _rooms_imported(text):
    """Rooms (or node/ top-level modules) a source imports: `module_utils.node.hw.pci` -> hw, also `from
    ...module_utils.node import module_glue` -> module_glue."""
    names = set()
    for room, members in NODE_IMPORT.findall(text):
        names.update([room] if room else [n.split()[0] for n in members.strip("()").split(",") if n.strip()])
    return names


def up_arrows(room, text):
    """The imports of a file of node/`room`/ that point above its room: a higher room or node/'s top level."""
    below = set(ROOMS[:ROOMS.index(room) + 1])
    return sorted(_rooms_imported(text) - below)


def _room_files():
    for room in ROOMS:
        for directory, dummy, files in os.walk(os.path.join(MODULE_UTILS, "node", room)):
            for name in files:
                if name.endswith(".py"):
                    yield room, os.path.relpath(os.path.join(directory, name), MODULE_UTILS)


@pytest.mark.parametrize("room,path", sorted(_room_files()))
def test_no_node_file_imports_a_room_above_its_own(room, path):
    with open(os.path.join(MODULE_UTILS, path)) as handle:
        assert up_arrows(room, handle.read()) == []


def test_every_node_file_lives_in_a_room():
    node = os.path.join(MODULE_UTILS, "node")
    flat = sorted(n for n in os.listdir(node) if n.endswith(".py") and n not in NODE_TOP)
    rooms = sorted(n for n in os.listdir(node) if os.path.isdir(os.path.join(node, n)) and n != "__pycache__")
    assert flat == [] and rooms == sorted(ROOMS)
    assert all(os.path.isfile(os.path.join(node, room, "__init__.py")) for room in ROOMS)   # Ansible's packer


@pytest.mark.parametrize("room,text,expected", [
    ("hw", "from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import inuse\n", ["holders"]),
    ("holders", "    from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine.vgpu_apply import X\n",
     ["engine"]),
    ("layout", "from ansible_collections.accelops.vgpu.plugins.module_utils.node import (module_glue,\n    boot)\n",
     ["boot", "module_glue"]),
    ("engine", "import ansible_collections.accelops.vgpu.plugins.module_utils.node.boot.handover\n", ["boot"]),
    ("boot", "from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw import pci\n"
             "from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import mig\n", []),
    ("holders", "from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders.inuse import describe\n", []),
])
def test_an_arrow_pointing_up_is_seen(room, text, expected):
    assert up_arrows(room, text) == expected
