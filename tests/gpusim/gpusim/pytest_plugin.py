"""pytest plugin: the `gpusim_node` fixture, a factory of mounted simulated nodes.

    def test_enable(gpusim_node):
        node = gpusim_node("l40s:2", latency_ms=0)

Every node made in a test is unmounted at teardown, whatever the test did.
"""

from __future__ import annotations

import pytest

from gpusim.testing import GpuSimNode


@pytest.fixture
def gpusim_node():
    nodes = []

    def make(spec, root=None, latency_ms=0, **kwargs):
        node = GpuSimNode(spec, root=root, latency_ms=latency_ms, **kwargs)
        node.start()
        nodes.append(node)
        return node

    yield make
    errors = []
    for node in reversed(nodes):
        try:
            node.stop()
        except Exception as exc:  # keep tearing down the others
            errors.append(exc)
    if errors:
        raise errors[0]
