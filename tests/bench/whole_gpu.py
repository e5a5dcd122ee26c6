"""Whole GPU or vGPUs (issue 42 item 1): NodePrepareResources of a whole-GPU claim and its unprepare, on gpusim.

    python -m tests.bench.whole_gpu [--gpus 2] [--runs 3] [--out bench-results]

A simulated node of L40S (gpusim, VFs enabled by the engine's apply), every GPU declared claim-time with
`whole-gpu: true`; the published pool is checked against the API's limits. Then, per run and GPU, one claim of the
GPU's whole device is prepared through the DRA driver as the agent wires it (DraDriver + WholeGpuPreparer with the
agent's engine factory: the VFs checked free, every step recorded durably, the VFs disabled by sriov-manage and
verified, the PF moved nvidia -> vfio-pci and verified, CDI spec with its VFIO group and KEP-5304 metadata) and
unprepared (back to nvidia, VFs enabled by sriov-manage and verified ready). Each result is checked in the
simulated tree. Targets (issue 42): prepare p99 <= 1 s, unprepare p99 <= 2 s on gpusim (the fake sriov-manage is a
Python process per call; every sysfs access a round trip to the simulator). Writes <out>/whole_gpu.json.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time

from gpusim.testing import GpuSimNode

from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import claim_time, slices, whole_gpu
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.claims import ClaimRef
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.devices import NodeView
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.driver import DraDriver
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import facts, vgpu_apply
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine.claim_time_layout import declaration
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import claim_holders, pod_allocations
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders.kubelet_holders import node_holders
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import Sysfs
from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout import vgpu_layout
from ansible_collections.accelops.vgpu.tests.bench.claim_time import cli, limits
from ansible_collections.accelops.vgpu.tests.bench.dra import latency
from ansible_collections.accelops.vgpu.tests.integration.dra.dra_helpers import NODE, NodeRunner

DRIVER = claim_holders.DRIVER
TARGET_PREPARE_P99_MS, TARGET_UNPREPARE_P99_MS = 1000.0, 2000.0


def claim(index, device):
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "vm-%03d" % index, "namespace": "vms", "uid": "00000000-0000-4000-9000-%012d" % index},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}},
            "status": {"allocation": {"devices": {"results": [
                {"request": "gpu", "driver": DRIVER, "pool": slices.pool_name(NODE), "device": device}]}}}}


def _state(gpu_node, pf):
    link = os.path.join(gpu_node.root, "bus/pci/devices", pf, "driver")
    return (os.path.basename(os.readlink(link)) if os.path.islink(link) else None,
            int(gpu_node.read("bus/pci/devices/%s/sriov_numvfs" % pf)))


def run(args):
    work = tempfile.mkdtemp(prefix="p10-", dir="/tmp")
    result = {"gpus": args.gpus}
    try:
        with GpuSimNode("l40s:%d" % args.gpus) as gpu_node:
            engine = vgpu_apply.NodeEngine(Sysfs(gpu_node.root), NodeRunner(gpu_node), gpu_node.dev_root, "/proc",
                                           cache_dir=work, kubelet_dir=work)
            vgpu_apply.apply(engine, vgpu_layout.from_layout([{"profiles": {}}]), enable_vfs=True, lock_timeout=60)
            doc = {"layout": [{"device_filter": "0x1234ABCD", "profiles": {}}],
                   "claim_time": [{"devices": "all", "profiles": ["L40S-24Q", "L40S-12Q"], "whole_gpu": True}]}
            engine.claim_time_declaration = declaration(doc)
            applied = vgpu_apply.apply(engine, vgpu_layout.from_document(doc), lock_timeout=60)
            items = claim_time.offers(engine.sysfs, applied["claim_time"])
            bodies = slices.desired_slices(NODE, items, 1)
            limits(bodies)
            wholes = [i for i in items if isinstance(i, whole_gpu.WholeGpuDevice)]
            result["published"] = {"slices": len(bodies), "whole_devices": len(wholes),
                                   "devices": sum(not isinstance(i, claim_time.CounterSet) for i in items)}
            objects, refs = {}, []
            for index, device in enumerate(wholes):
                body = claim(index, device.name)
                objects[("vms", body["metadata"]["name"])] = body
                refs.append((device.gpu, ClaimRef("vms", body["metadata"]["name"], body["metadata"]["uid"])))
            driver = DraDriver(NODE, lambda ns, name: json.loads(json.dumps(objects[ns, name])),
                               NodeView(engine.sysfs, lambda: facts.gather(engine.sysfs, {})),
                               claim_holders.plugin_dir(work), os.path.join(work, "cdi"), boot_id="bench",
                               whole=whole_gpu.WholeGpuPreparer(   # as agent_plugin wires it
                                   engine.sysfs, node_holders(engine.sysfs, gpu_node.dev_root, "/proc", work),
                                   NodeRunner(gpu_node), pod_allocations.record_path(work)))
            driver.whole.update(items)
            prepare, unprepare = [], []
            for dummy in range(args.runs):
                for pf, ref in refs:
                    start = time.perf_counter()
                    answer = driver.prepare([ref])[ref.uid]
                    prepare.append(time.perf_counter() - start)
                    if answer.error or _state(gpu_node, pf) != ("vfio-pci", 0):
                        raise RuntimeError("%s: %s (%s)" % (pf, answer.error, _state(gpu_node, pf)))
                for pf, ref in refs:
                    start = time.perf_counter()
                    error = driver.unprepare([ref])[ref.uid]
                    unprepare.append(time.perf_counter() - start)
                    if error or _state(gpu_node, pf)[0] != "nvidia" or not _state(gpu_node, pf)[1]:
                        raise RuntimeError("%s: %s (%s)" % (pf, error, _state(gpu_node, pf)))
            result["prepare_whole"] = latency(prepare)
            result["unprepare_to_vgpus"] = latency(unprepare)
            result["target_prepare_p99_ms"] = TARGET_PREPARE_P99_MS
            result["target_unprepare_p99_ms"] = TARGET_UNPREPARE_P99_MS
            result["met"] = (result["prepare_whole"]["p99_ms"] <= TARGET_PREPARE_P99_MS
                             and result["unprepare_to_vgpus"]["p99_ms"] <= TARGET_UNPREPARE_P99_MS)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return result


def main(argv=None):
    return cli(argv, sys.modules[__name__], run, "whole_gpu", gpus=2, runs=3)


if __name__ == "__main__":
    sys.exit(main())
