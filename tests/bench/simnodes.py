"""gpusim nodes for the benchmark: mounting many, running the engine against one, reading state back.

Everything the harness asserts is read straight from the simulated tree or its write log, never from
the engine's own report, so a benchmark that silently did nothing fails instead of printing numbers.
"""

from __future__ import annotations

import contextlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor

from gpusim.models import MODELS
from gpusim.testing import GpuSimNode

TYPE_FILE = "nvidia/current_vgpu_type"
START_WORKERS = 4   # mounting in parallel, but gently: each server start is a Python process


class BenchError(AssertionError):
    """A measurement that did not do what it claims (wrong layout, unexpected writes)."""


def type_id(model, profile):
    """The vGPU type ID of `profile` (short name, e.g. L40S-1Q) in gpusim's catalogue."""
    for vgpu_type in MODELS[model].types:
        if vgpu_type.short_name == profile:
            return vgpu_type.type_id
    raise BenchError("gpusim model %s has no vGPU type %s" % (model, profile))


@contextlib.contextmanager
def mounted(specs, latency_ms=0):
    """Mount one GpuSimNode per spec; yields the list. All are unmounted on exit, also on failure."""
    lock = threading.Lock()
    with contextlib.ExitStack() as stack:
        def start(spec):
            node = GpuSimNode(spec, latency_ms=latency_ms)
            node.start()
            with lock:
                stack.callback(node.stop)
            return node

        with ThreadPoolExecutor(max_workers=START_WORKERS) as pool:
            nodes = list(pool.map(start, specs))
        yield nodes


@contextlib.contextmanager
def node_environment(node):
    """os.environ of `node` (GPUSIM_ROOT, the fake sriov-manage / nvidia-smi first on PATH) for
    in-process engine runs: the engine's CommandRunner inherits the process environment."""
    saved = dict(os.environ)
    os.environ.update(node.env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def vfs_by_pf(node):
    return dict((pf, node.vfs(pf)) for pf in node.pfs())


def type_counts(node):
    """{PF: {type ID: count}} read back from every VF's current_vgpu_type."""
    counts = {}
    for pf, vfs in vfs_by_pf(node).items():
        per_pf = counts.setdefault(pf, {})
        for vf in vfs:
            value = int(node.read("bus/pci/devices/%s/%s" % (vf, TYPE_FILE)) or 0)
            if value:
                per_pf[value] = per_pf.get(value, 0) + 1
    return counts


def assert_layout(node, expected, label):
    """The node's vGPU types must be exactly `expected` ({PF: {type ID: count}})."""
    have = type_counts(node)
    want = dict((pf, dict(expected.get(pf, {}))) for pf in have)
    if have != want:
        raise BenchError("%s: %s has vGPU types %s, expected %s" % (label, node.root, have, want))


def clear_types(node):
    """Untimed reset between P1 runs: write 0 to every VF that has a type, then clear the log."""
    for vfs in vfs_by_pf(node).values():
        for vf in vfs:
            path = "bus/pci/devices/%s/%s" % (vf, TYPE_FILE)
            if int(node.read(path) or 0):
                node.write(path, "0")
    node.clear_log()


def write_counts(node):
    """{total, by attribute name} of the successful sysfs writes in the gpusim log; refused writes fail."""
    log = node.log()
    refused = [entry for entry in log if entry["result"] != "ok"]
    if refused:
        raise BenchError("%s: %d sysfs writes were refused, first %s" % (node.root, len(refused), refused[0]))
    by_name = {}
    for entry in log:
        name = entry["path"].rsplit("/", 1)[-1]
        by_name[name] = by_name.get(name, 0) + 1
    return {"total": len(log), "by_name": by_name}
