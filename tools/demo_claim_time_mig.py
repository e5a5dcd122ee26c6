# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""make demo, the MIG-backed claim-time scene (issue 42.2): vGPUs whose GPU instances are placed when claims are
prepared, on one H100 in MIG mode.

    tools/demo_claim_time_mig.py --sys ROOT --work DIR

Run by tools/demo.py with the simulated node's environment (GPUSIM_ROOT, PATH with its nvidia-smi) and the
collection on PYTHONPATH. The collection's own code does what the node agent and the kubelet do:
1. the operator sets MIG mode (`nvidia-smi -i <PF> -mig 1`, GPU idle); the engine applies a config declaring the GPU
   claim-time with MIG-backed types: VFs enabled, no type written, and the DRA offers computed: one counter set
   (memory slices, compute slices) and one device per type and placement;
2. the scheduler's allocator (tests/fakes/vmi_controller.py DraAllocator, which charges those counters) allocates
   three claims by CEL: a 3g, a 2g and a 1g: three placements that do not overlap; a second 3g finds no room;
3. NodePrepareResources (driver.py, what the kubelet calls) creates each claim's GPU instance at its placement,
   types a free VF and checks the vGPU landed there; `nvidia-smi mig -lgi` shows the instances;
4. NodeUnprepareResources clears the types and destroys the instances.
Exit status 0 when every step showed what it should.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, ".build", "collections"))

# pylint: disable=wrong-import-position
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import (  # noqa: E402
    checkpoint, claim_time, claim_time_mig, devices, slices)
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.claim_time_prepare import (  # noqa: E402
    ClaimTimePreparer)
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.claims import ClaimRef  # noqa: E402
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.driver import DraDriver  # noqa: E402
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import claim_holders  # noqa: E402
from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout import vgpu_layout  # noqa: E402
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import (  # noqa: E402
    claim_time_mig as node_mig, facts, mig, vgpu_apply)
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine.claim_time_layout import declaration  # noqa: E402
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import Sysfs  # noqa: E402
from ansible_collections.accelops.vgpu.plugins.module_utils.runner import CommandRunner  # noqa: E402
from ansible_collections.accelops.vgpu.tests.fakes.vmi_controller import DraAllocator, Unallocatable  # noqa: E402

NODE = "demo-mig-node"
PROFILES = ["H100-1-10C", "H100-2-20C", "H100-3-40C", "H100-7-80C"]
CONFIG = {"version": "v1", "vgpu-configs": {"default": [{"devices": "all", "vgpu-devices": {}}]},
          "claim-time": [{"devices": "all", "profiles": PROFILES}]}
CLASS = {"metadata": {"name": claim_holders.DRIVER},
         "spec": {"selectors": [{"cel": {"expression": 'device.driver == "%s"' % claim_holders.DRIVER}}]}}
WANTED = ["H100-3-40C", "H100-2-20C", "H100-1-10C", "H100-3-40C"]   # the last finds no room


def claim(index, profile):
    expression = 'device.attributes["%s"].profile == "%s"' % (claim_holders.DRIVER, profile)
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "vm-%d-%s" % (index, profile.lower()), "namespace": "vms",
                         "uid": "00000000-0000-4000-8000-%012d" % index},
            "spec": {"devices": {"requests": [{"name": "vgpu", "exactly": {
                "deviceClassName": claim_holders.DRIVER, "selectors": [{"cel": {"expression": expression}}]}}]}}}


def run(args):
    sysfs, runner = Sysfs(args.sys), CommandRunner()
    kubelet = os.path.join(args.work, "kubelet")
    plugin_dir = claim_holders.plugin_dir(kubelet)
    engine = vgpu_apply.NodeEngine(sysfs, runner, os.path.join(args.sys, ".gpusim", "dev"), "/proc",
                                   cache_dir=args.work, kubelet_dir=kubelet)
    vgpu_apply.apply(engine, vgpu_layout.from_layout([{"profiles": {}}]), enable_vfs=True)
    smi = mig.Smi(runner)
    pf = args.pf
    print("$ nvidia-smi -i %s -mig 1   (the operator, with the GPU idle: claim time never toggles MIG mode)" % pf)
    smi.run(pf, ["-i", pf, "-mig", "1"], "-mig 1")
    print("claim-time: [{devices: all, profiles: [%s]}]" % ", ".join(PROFILES))
    engine.claim_time_declaration = declaration(CONFIG)
    result = vgpu_apply.apply(engine, vgpu_layout.from_document(CONFIG, "default"))
    offers = claim_time.offers(sysfs, result["claim_time"])
    [counters] = [o for o in offers if isinstance(o, claim_time_mig.MigCounterSet)]
    placements = [o for o in offers if isinstance(o, claim_time_mig.PlacementDevice)]
    print("Published: counter set %s {%s}" % (counters.name, ", ".join(
        "%s=%d" % item for item in counters.counters().items())))
    for profile in PROFILES:
        starts = [p.start for p in placements if p.profile == profile]
        print("  %-11s %d devices at placements %s" % (profile, len(starts), starts))
    published = slices.desired_slices(NODE, offers, 1)
    driver = DraDriver(NODE, lambda ns, name: claims[(ns, name)], devices.NodeView(
        sysfs, lambda: facts.gather(sysfs, {})), plugin_dir, os.path.join(args.work, "cdi"), boot_id="demo",
        typer=ClaimTimePreparer(sysfs, engine.begin(), runner=runner))
    driver.typer.update(offers)
    claims, refs, ok = {}, [], True
    for index, profile in enumerate(WANTED):
        body = claim(index, profile)
        try:
            allocation = DraAllocator([CLASS], published, claims).allocate(body, NODE)
        except Unallocatable:
            print("claim %-18s -> not allocated: no placement of %s is free (the counters say so)" % (
                body["metadata"]["name"], profile))
            ok = ok and index == len(WANTED) - 1
            continue
        body["status"] = {"allocation": allocation}
        claims[("vms", body["metadata"]["name"])] = body
        ref = ClaimRef("vms", body["metadata"]["name"], body["metadata"]["uid"])
        answer = driver.prepare([ref])[ref.uid]
        device = allocation["devices"]["results"][0]["device"]
        if answer.error:
            print("claim %s: %s" % (ref.name, answer.error))
            return 1
        [record] = checkpoint.Checkpoint(plugin_dir).get(ref.uid)["devices"]
        landed = node_mig.landed_on(sysfs, record["key"])
        print("claim %-18s -> %-36s prepared: GPU instance %d at %d:%d, VF %s typed, gpu_instance_id %s" % (
            ref.name, device, record["mig"]["gi"], record["mig"]["start"], record["mig"]["size"], record["key"],
            landed))
        ok = ok and landed == record["mig"]["gi"]
        refs.append(ref)
    print("$ nvidia-smi mig -i %s -lgi" % pf)
    print(subprocess.run(["nvidia-smi", "mig", "-i", pf, "-lgi"], capture_output=True, text=True,
                         check=False).stdout.rstrip())
    answers = driver.unprepare(refs)
    left = smi.instances(pf)
    print("NodeUnprepareResources: %s; GPU instances left: %d" % (
        ", ".join("%s %s" % (r.name, answers[r.uid] or "ok") for r in refs), len(left)))
    return 0 if ok and len(refs) == 3 and not left and not any(answers.values()) else 1


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sys", required=True, help="the mounted gpusim root (one h100-pcie)")
    parser.add_argument("--work", required=True, help="a directory for the driver's kubelet and CDI files")
    parser.add_argument("--pf", default="0000:41:00.0")
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
