"""pytest plugin: the `gpusim_node` fixture, a factory of mounted simulated nodes.

    def test_enable(gpusim_node):
        node = gpusim_node("l40s:2", latency_ms=0)

Mounting costs a server start (~0.5 s), so nodes are pooled per session by (spec, latency, driver
version): at the end of each test a pooled node is reset to its freshly started state (holders
killed, log, injected failures, VFs, types, mdevs, driver all back) and handed to the next test
asking for the same spec. `fresh=True` or an explicit `root=` gives a private node that is
unmounted at teardown. All nodes are unmounted when the session ends.
"""

from __future__ import annotations

import pytest

from gpusim.testing import GpuSimNode


@pytest.fixture(scope="session")
def gpusim_pool():
    pool = {}
    yield pool
    for node in pool.values():
        node.stop()


@pytest.fixture
def gpusim_node(gpusim_pool):
    private = []
    borrowed = []

    def make(spec, root=None, latency_ms=0, fresh=False, **kwargs):
        key = (spec, latency_ms, tuple(sorted(kwargs.items())))
        if root is not None or fresh or key in [k for k, dummy in borrowed]:
            node = GpuSimNode(spec, root=root, latency_ms=latency_ms, **kwargs).start()
            private.append(node)
            return node
        node = gpusim_pool.get(key)
        if node is None or not node.healthy():
            if node is not None:
                node.stop()
            node = gpusim_pool[key] = GpuSimNode(spec, latency_ms=latency_ms, **kwargs).start()
        borrowed.append((key, node))
        return node

    yield make
    errors = []
    for node in reversed(private):
        try:
            node.stop()
        except Exception as exc:  # keep tearing down the others
            errors.append(exc)
    for key, node in borrowed:
        try:
            if node.healthy():
                node.reset()
                continue
        except Exception as exc:
            errors.append(exc)
        gpusim_pool.pop(key, None)      # the test broke it (or reset failed): the next test gets a new one
        try:
            node.stop()
        except Exception as exc:
            errors.append(exc)
    if errors:
        raise errors[0]
