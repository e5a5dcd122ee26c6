"""The DRA engine tests build nodes with the engine tests' FakeNode (tests/unit/.../node/fake_node.py)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "node"))
