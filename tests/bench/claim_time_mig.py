"""MIG-backed vGPUs placed at claim time (issue 42.2): NodePrepareResources creating a GPU instance and typing a VF.

    python -m tests.bench.claim_time_mig [--gpus 8] [--runs 1] [--out bench-results]

An 8-GPU simulated node (gpusim, H100 PCIe, VFs enabled by the engine's apply, MIG mode set beforehand as an operator
does), every GPU declared claim-time with the seven MIG-backed H100 types; the reconcile's result becomes the published
slices (kubelet/dra/claim_time_mig.py) and is checked against the API's limits (tests/bench/claim_time.limits). Then
per GPU three claims that fill it (H100-3-40C at 0, H100-2-20C at 4, H100-1-10C at 6) are prepared one per call
through the DRA driver as the agent wires it: each records its steps durably, creates its GI at the placement
(`nvidia-smi mig -cgi <ID>:<start> -C`), types a free VF (read back), checks `gpu_instance_id`, writes CDI and
KEP-5304 metadata; then each is unprepared (type cleared, compute instance and GI destroyed). Every run is checked
against the simulated node (the GIs at their placements while prepared, none after). Measured: p50/p99 of prepare
and unprepare in ms; the nvidia-smi calls and ms of the first reconcile and of the next one of the unchanged node
(a new engine, as the agent builds one per reconcile, sharing mig.FixedAnswers). Targets (issue 42): prepare p99
<= 1 s, unprepare <= 2 s on gpusim (each nvidia-smi call is a Python process reading the simulator's state: an upper
bound). Writes <out>/claim_time_mig.json and prints it.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time

from gpusim.testing import GpuSimNode

from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import agent_plugin, claim_time, claim_time_mig
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import slices
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.claims import ClaimRef
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.devices import NodeView
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.driver import DraDriver
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import claim_holders
from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout import vgpu_layout
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import facts, mig, vgpu_apply
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine.claim_time_layout import declaration
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import Sysfs
from ansible_collections.accelops.vgpu.tests.bench.claim_time import claim, cli, limits, rounds
from ansible_collections.accelops.vgpu.tests.bench.dra import latency
from ansible_collections.accelops.vgpu.tests.integration.dra.dra_helpers import NODE, NodeRunner

PROFILES = ["H100-1-10C", "H100-1-10CME", "H100-1-20C", "H100-2-20C", "H100-3-40C", "H100-4-40C", "H100-7-80C"]
FILL = [("H100-3-40C", 0, 9), ("H100-2-20C", 4, 14), ("H100-1-10C", 6, 19)]    # (type, start, GI profile)
TARGET_PREPARE_P99_MS, TARGET_UNPREPARE_P99_MS = 1000.0, 2000.0


def _gis(smi, gpus):
    return {(gpu, gi.profile_id, gi.start) for gpu in gpus for gi in smi.instances(gpu)}


def _reconcile(node_engine, doc):
    """(apply result, {ms, nvidia_smi_calls}) of one claim-time reconcile (under the node lock, as the agent's)."""
    node_engine.runner.calls[:] = []
    began = time.monotonic()
    applied = vgpu_apply.apply(node_engine, vgpu_layout.from_document(doc), lock_timeout=60)
    took = round((time.monotonic() - began) * 1000.0, 1)
    calls = sum(1 for argv in node_engine.runner.calls if os.path.basename(argv[0]) == "nvidia-smi")
    return applied, {"nvidia_smi_calls": calls, "ms": took}


def run(args):
    work = tempfile.mkdtemp(prefix="p11-", dir="/tmp")
    result = {"gpus": args.gpus, "profiles": PROFILES}
    try:
        with GpuSimNode("h100-pcie:%d" % args.gpus) as gpu_node:
            answers = mig.FixedAnswers()      # kept across engines, as the agent keeps them across reconciles

            def engine():
                return vgpu_apply.NodeEngine(Sysfs(gpu_node.root), NodeRunner(gpu_node), gpu_node.dev_root, "/proc",
                                             cache_dir=work, kubelet_dir=work, smi_answers=answers)
            node_engine = engine()
            vgpu_apply.apply(node_engine, vgpu_layout.from_layout([{"profiles": {}}]), enable_vfs=True, lock_timeout=60)
            gpus = gpu_node.pfs()
            for gpu in gpus:
                gpu_node.ctl("mig", gpu, "1")
            doc = {"layout": [{"device_filter": "0x1234ABCD", "profiles": {}}],
                   "claim_time": [{"devices": "all", "profiles": PROFILES}]}
            node_engine.claim_time_declaration = declaration(doc)
            applied, result["reconcile_first"] = _reconcile(node_engine, doc)
            again = engine()                  # the agent's next reconcile of the unchanged node: a new engine
            again.claim_time_declaration = node_engine.claim_time_declaration
            result["reconcile_unchanged"] = _reconcile(again, doc)[1]
            items = claim_time.offers(node_engine.sysfs, applied["claim_time"])
            bodies = slices.desired_slices(NODE, items, 1)
            limits(bodies)
            result["published"] = {
                "slices": len(bodies), "counter_sets": sum(isinstance(i, claim_time_mig.MigCounterSet) for i in items),
                "devices": sum(isinstance(i, claim_time_mig.PlacementDevice) for i in items)}
            objects, expected = {}, set()
            for gpu in gpus:
                for profile, start, gi_profile in FILL:
                    body = claim(len(objects), claim_time_mig.device_name(profile, gpu, start))
                    objects[("vms", body["metadata"]["name"])] = body
                    expected.add((gpu, gi_profile, start))
            driver = DraDriver(NODE, lambda ns, name: json.loads(json.dumps(objects[ns, name])),
                               NodeView(node_engine.sysfs, lambda: facts.gather(node_engine.sysfs, {})),
                               claim_holders.plugin_dir(work), os.path.join(work, "cdi"), boot_id="bench",
                               typer=agent_plugin.claim_time_preparer(   # as the agent wires it
                                   node_engine.sysfs, node_engine.begin(), work, node_engine.runner))
            driver.typer.update(items)
            smi = mig.Smi(NodeRunner(gpu_node))
            refs = [ClaimRef("vms", body["metadata"]["name"], body["metadata"]["uid"]) for body in objects.values()]

            def placed():
                if _gis(smi, gpus) != expected:
                    raise RuntimeError("GIs after prepare: %s, expected %s" % (sorted(_gis(smi, gpus)), sorted(expected)))

            def gone():
                if _gis(smi, gpus):
                    raise RuntimeError("GIs left after unprepare: %s" % sorted(_gis(smi, gpus)))
            prepare, unprepare = rounds(driver, refs, args.runs, placed, gone)
            result["prepare_gi_created_vf_typed"] = latency(prepare)
            result["unprepare_gi_destroyed"] = latency(unprepare)
            result["targets"] = {"prepare_p99_ms": TARGET_PREPARE_P99_MS, "unprepare_p99_ms": TARGET_UNPREPARE_P99_MS}
            result["met"] = (result["prepare_gi_created_vf_typed"]["p99_ms"] <= TARGET_PREPARE_P99_MS
                             and result["unprepare_gi_destroyed"]["p99_ms"] <= TARGET_UNPREPARE_P99_MS)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return result


def main(argv=None):
    return cli(argv, sys.modules[__name__], run, "claim_time_mig")


if __name__ == "__main__":
    sys.exit(main())
