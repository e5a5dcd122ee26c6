"""The node CLI's tests (test_node_cli_entry.py, beside the module_utils/node_cli.py they test) build nodes
with the engine tests' FakeNode (node/fake_node.py)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "node"))
