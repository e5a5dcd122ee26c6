"""P1: cold converge of a vGPU layout through the engine vs the floor, VFs already enabled.

Engine: `vgpu_apply.apply()` as the module and the node CLI call it (node lock, held-VF scan, plan,
validate, write, verify), with the fake nvidia-smi on PATH as on a real host. Floor: open, write,
close of `current_vgpu_type` per VF that needs a type, nothing else (IDs and paths prepared untimed).
Runs alternate engine / floor so both see the same machine noise; every run is checked by reading
every VF back; the gpusim write log gives the write counts (the floor's must be the minimum). The
engine's node cache persists across runs as it does on a node between applies (tmpfs /run): the
first run starts without it and reads every VF.
"""

from __future__ import annotations

import collections
import os
import tempfile
import time

from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout import vgpu_layout
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import vgpu_apply
from ansible_collections.accelops.vgpu.plugins.module_utils.runner import CommandRunner
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import Sysfs
from tests.bench import pidns, simnodes, stats, vf_enable

MODEL = "l40s"
# Sysfs primitives the engine reads through (read_optional/read_int/link_name go through these);
# each is one round trip to the FUSE server on gpusim, like a kernfs call on a real node.
READ_OPS = ("read", "readlink", "listdir", "isdir", "exists")
OPS_TARGET = 3.0  # sysfs operations per written VF on the uniform case (issue 15)
RATIO_TARGET = {"uniform": 2.5}  # engine / floor (issue 34); the mixed case has no target


def _counted(name):
    def operation(self, *args, **kwargs):
        self.ops[name] += 1
        return getattr(Sysfs, name)(self, *args, **kwargs)
    operation.__name__ = name
    return operation


class CountingSysfs(Sysfs):
    """The engine's Sysfs, counting its read operations in `ops` (writes: `writes`)."""

    def __init__(self, root):
        super().__init__(root)
        self.ops = collections.Counter()


for _op in READ_OPS:
    setattr(CountingSysfs, _op, _counted(_op))


def cases(gpus):
    """{case: [(GPU indices, {profile: count})]}: one profile everywhere, and two profile sizes."""
    everything = list(range(gpus))
    half = max(1, gpus // 2)
    mixed = [(everything[:half], {"L40S-24Q": 2})]
    if everything[half:]:
        mixed.append((everything[half:], {"L40S-4Q": 12}))
    return {"uniform": [(everything, {"L40S-1Q": 32})], "mixed": mixed}


def layout_entries(case):
    return vgpu_layout.from_layout([{"devices": list(indices), "profiles": dict(profiles)}
                                    for indices, profiles in case])


def expected_types(node, case):
    """{PF: {type ID: count}} the case asks for (PFs in GPU index order)."""
    pfs = node.pfs()
    expected = {}
    for indices, profiles in case:
        for index in indices:
            expected[pfs[index]] = dict((simnodes.type_id(MODEL, p), n) for p, n in profiles.items())
    return expected


def floor_writes(node, expected):
    """[(absolute path, bytes)]: the writes a minimal script does, VFs filled in order."""
    writes = []
    for pf, types in expected.items():
        free = iter(node.vfs(pf))
        for type_id, count in types.items():
            for dummy in range(count):
                writes.append((node.device_path(next(free), simnodes.TYPE_FILE), str(type_id).encode()))
    return writes


def run_floor(writes):
    start = time.perf_counter()
    for path, data in writes:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
    return time.perf_counter() - start


def run_engine(node, entries, cache_dir):
    """Seconds for one engine apply, the engine's own write count, its reads, the commands it ran."""
    engine_node = vgpu_apply.NodeEngine(CountingSysfs(node.root), CommandRunner(), node.dev_root, "/proc", cache_dir=cache_dir)
    with simnodes.node_environment(node):
        start = time.perf_counter()
        result = vgpu_apply.apply(engine_node, entries)
        elapsed = time.perf_counter() - start
    if not result["changed"]:
        raise simnodes.BenchError("P1: the engine reported no change on a node without vGPUs")
    return (elapsed, engine_node.sysfs.writes, dict(engine_node.sysfs.ops),
            [" ".join(argv[:3]) for argv in engine_node.runner.calls], dict(engine_node.holders.counts))


def enable_vfs(node):
    """Untimed setup: every GPU gets its VFs through the sriov engine (sriov-manage)."""
    with simnodes.node_environment(node):
        vf_enable.enable(Sysfs(node.root), "all")
    node.clear_log()


def checked_writes(node, expected, label, engine_writes=None, exactly=None):
    """Assert the layout (and the engine's count matching the gpusim log, or `exactly` writes);
    returns the number of writes gpusim logged."""
    simnodes.assert_layout(node, expected, label)
    counts = simnodes.write_counts(node)
    if exactly is not None and counts["by_name"] != {"current_vgpu_type": exactly}:
        raise simnodes.BenchError("%s: %s sysfs writes, expected %d current_vgpu_type writes"
                                  % (label, counts["by_name"], exactly))
    if engine_writes is not None and engine_writes != counts["total"]:
        raise simnodes.BenchError("%s: the engine counted %d writes, gpusim logged %d"
                                  % (label, engine_writes, counts["total"]))
    return counts["total"]


def measure_case(node, name, case, runs, cache_dir):
    entries = layout_entries(case)
    expected = expected_types(node, case)
    minimum = sum(sum(types.values()) for types in expected.values())
    writes = floor_writes(node, expected)
    engine_s, floor_s, engine_writes, commands, ops, holder_counts = [], [], [], [], [], []
    for dummy in range(runs):
        simnodes.clear_types(node)
        seconds, counted, reads, commands, counts = run_engine(node, entries, cache_dir)
        holder_counts.append(counts)
        engine_s.append(seconds)
        engine_writes.append(checked_writes(node, expected, "P1 %s engine" % name, engine_writes=counted))
        ops.append((sum(reads.values()) + counted) / float(counted))
        simnodes.clear_types(node)
        floor_s.append(run_floor(writes))
        checked_writes(node, expected, "P1 %s floor" % name, exactly=minimum)
    ratio = stats.ratio_summary(engine_s, floor_s)
    target = RATIO_TARGET.get(name)
    return {"layout": [{"gpus": list(indices), "profiles": profiles} for indices, profiles in case],
            "engine_s": stats.summary(engine_s), "floor_s": stats.summary(floor_s), "ratio": ratio,
            "writes": max(engine_writes), "writes_min": minimum, "engine_reads": reads,
            "engine_commands": commands, "target_ratio": target,
            # the in-use work of each apply (inuse.Holders.counts): walks of /proc, group probes, source reads
            "holder_counts": holder_counts,
            "met": (target is None or stats.within(ratio["median"], target)) and max(engine_writes) == minimum,
            # sysfs round trips (reads, links, writes) per written VF; the floor's is 1
            "ops_per_written_vf": stats.summary(ops), "target_ops_per_written_vf": OPS_TARGET,
            "met_ops": stats.within(stats.summary(ops)["median"], OPS_TARGET) and max(engine_writes) == minimum}


def run(settings):
    """P1 for every case on one node of `settings.gpus` L40S GPUs (32 VFs each)."""
    results = {"gpus": settings.gpus, "vfs_per_gpu": 32, "model": MODEL, "runs": settings.runs["p1"],
               "scan": pidns.scan_state()}
    with simnodes.mounted(["%s:%d" % (MODEL, settings.gpus)]) as nodes, \
            tempfile.TemporaryDirectory(prefix="bench-p1-") as cache_dir:
        node = nodes[0]
        enable_vfs(node)
        for name, case in cases(settings.gpus).items():
            results[name] = measure_case(node, name, case, settings.runs["p1"], cache_dir)
    return results
