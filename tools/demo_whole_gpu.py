# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""make demo, the whole-GPU scene (issue 42 item 1): one GPU given whole to one VM, then as vGPUs to two others once
it is deleted, on one counter.

    tools/demo_whole_gpu.py --api URL --kubeconfig FILE --sys ROOT --work DIR [--node NAME]

Run by tools/demo.py like the claim-time scene (tools/demo_claim_time.py, whose reads it reuses), on a simulated node
of one L40S declared claim-time with `whole-gpu: true`:
1. the engine applies the config and the agent's SlicePublisher publishes the GPU's counter set, its profile devices
   and its whole device (drawing every counter of the set);
2. a VMI whose claim asks for the whole GPU runs; NodePrepareResources disables the GPU's VFs and moves it to vfio-pci
   (read back here from the simulated sysfs), the KEP-5304 metadata names the GPU's pciBusID;
3. two VMIs asking for L40S-24Q stay Pending: the whole claim holds the GPU's counter;
4. the first VMI is deleted: NodeUnprepareResources moves the GPU back to nvidia and enables its VFs; the scheduler
   then gives the two VMIs 24Q vGPUs of the same GPU, and Prepare types two of its VFs; the VMIs go, the types too.
Exit status 0 when every step showed what it should.
"""

from __future__ import annotations

import argparse
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, ".build", "collections"))

# pylint: disable=wrong-import-position
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import (  # noqa: E402
    checkpoint, claim_time, metadata, whole_gpu)
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.claim_time_prepare import (  # noqa: E402
    ClaimTimePreparer)
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.claims import ClaimRef  # noqa: E402
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.devices import NodeView  # noqa: E402
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.driver import DraDriver  # noqa: E402
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.publisher import SlicePublisher  # noqa: E402
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import facts, vgpu_apply  # noqa: E402
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine.claim_time_layout import declaration  # noqa: E402
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import pod_allocations  # noqa: E402
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders.kubelet_holders import node_holders  # noqa: E402
from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout import vgpu_layout  # noqa: E402
from ansible_collections.accelops.vgpu.plugins.module_utils.runner import CommandRunner  # noqa: E402
from ansible_collections.accelops.vgpu.tests.fakes.vmi_controller import VmiController  # noqa: E402
from demo import wait_for  # noqa: E402  (tools/demo.py, this script's directory)
from demo_claim_time import DRA, Scene  # noqa: E402

NAMESPACE = "vms-whole"     # apart from the claim-time scene's `vms` (test_demo.py counts its claims there)
VMIS = "/apis/kubevirt.io/v1/namespaces/%s/virtualmachineinstances" % NAMESPACE

CONFIG = {"version": "v1", "vgpu-configs": {"default": [{"devices": "all", "vgpu-devices": {}}]},
          "claim-time": [{"devices": "all", "profiles": ["L40S-24Q", "L40S-12Q"], "whole-gpu": True}]}
CEL = 'device.attributes["vgpu.accelops.io"].%s'


def template(name, expression):
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "vgpu.accelops.io", "selectors": [{"cel": {"expression": expression}}]}}]}}}}


def vmi(name, template_name, node):
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": node},
                     "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template_name}],
                     "domain": {"devices": {"gpus": [{"name": "gpu1", "claimName": "gpu", "requestName": "gpu"}]},
                                "resources": {"requests": {"memory": "8Gi"}}}}}


class WholeScene(Scene):
    namespace, vmis = NAMESPACE, VMIS

    def __init__(self, args):
        super().__init__(args)
        self.engine = vgpu_apply.NodeEngine(self.sysfs, CommandRunner(), os.path.join(args.sys, ".gpusim", "dev"),
                                            "/proc", cache_dir=args.work, kubelet_dir=self.engine.kubelet_dir)
        self.gpu = None

    def state(self):
        base = os.path.join(self.args.sys, "bus", "pci", "devices", self.gpu)
        with open(os.path.join(base, "sriov_numvfs"), encoding="utf-8") as handle:
            return os.path.basename(os.readlink(os.path.join(base, "driver"))), int(handle.read())

    def publish_whole(self):
        body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": self.node, "labels": {
            "kubernetes.io/hostname": self.node}}}
        uid = self.api.call("POST", "/api/v1/nodes", body)["metadata"]["uid"]
        print("Node %s: one L40S, claim-time with whole-gpu:" % self.node)
        print("  claim-time: [{devices: all, profiles: [L40S-24Q, L40S-12Q], whole-gpu: true}]")
        vgpu_apply.apply(self.engine, vgpu_layout.from_layout([{"profiles": {}}]), enable_vfs=True)
        self.engine.claim_time_declaration = declaration(CONFIG)
        result = vgpu_apply.apply(self.engine, vgpu_layout.from_document(CONFIG, "default"))
        self.offers = claim_time.offers(self.sysfs, result["claim_time"])
        self.gpu = result["claim_time"][0]["address"]
        SlicePublisher(self.client, self.node, uid).publish(self.offers)
        self.driver = self.driver_for()
        for item in self.offers:
            if isinstance(item, claim_time.CounterSet):
                print("  counter set %-22s %s" % (item.name, item.to_api()["counters"]))
            else:
                drawn = ", ".join("%s=%s" % (k, v["value"]) for c in item.to_api()["consumesCounters"]
                                  for k, v in c["counters"].items())
                whole = isinstance(item, whole_gpu.WholeGpuDevice)
                print("  device %-28s profile %-8s draws %s%s" % (
                    item.name, item.to_api()["attributes"]["profile"]["string"], drawn,
                    " (the whole GPU, pciBusID %s)" % item.gpu if whole else ""))
        print("GPU %s: driver %s, %d VFs" % ((self.gpu,) + self.state()))
        return any(isinstance(i, whole_gpu.WholeGpuDevice) for i in self.offers) and self.state()[0] == "nvidia"

    def driver_for(self):
        """The DRA driver as the agent wires it: profile devices and whole GPUs."""
        holders = node_holders(self.sysfs, self.engine.dev_root, self.engine.proc_root, self.engine.kubelet_dir)
        driver = DraDriver(self.node, lambda ns, name: self.client.get_resource_claim(ns, name, timeout=10),
                           NodeView(self.sysfs, lambda: facts.gather(self.sysfs, {})), self.plugin_dir, self.cdi_dir,
                           boot_id="demo", typer=ClaimTimePreparer(self.sysfs, holders),
                           whole=whole_gpu.WholeGpuPreparer(self.sysfs, holders, CommandRunner(),
                                                            pod_allocations.record_path(self.engine.kubelet_dir)))
        for preparer in (driver.typer, driver.whole):
            preparer.update(self.offers)
        return driver

    def start(self, names, template_name):
        for name in names:
            self.api.call("POST", VMIS, vmi(name, template_name, self.node))

    def running(self, names, timeout=20):
        controller = VmiController(self.args.api, interval=0.05)
        controller.start()
        try:
            return wait_for(lambda: all(self.phase(n) == "Running" for n in names), timeout)
        finally:
            controller.stop()

    def prepared(self, names):
        claims = [self.claim_of({"metadata": {"name": n}}) for n in names]
        refs = [ClaimRef(c["metadata"]["namespace"], c["metadata"]["name"], c["metadata"]["uid"]) for c in claims]
        answers = self.driver.prepare(refs)
        for ref in refs:
            if answers[ref.uid].error:
                print("  claim %s: %s" % (ref.name, answers[ref.uid].error))
                return None
            [entry] = checkpoint.Checkpoint(self.plugin_dir).get(ref.uid)["devices"]
            with open(metadata.file_path(self.plugin_dir, ref.namespace, ref.name, "gpu"), encoding="utf-8") as handle:
                [device] = metadata.read_stream(handle.read())[0]["requests"][0]["devices"]
            print("  claim %-28s device %-28s -> %s; metadata pciBusID %s" % (
                ref.name, entry["device"], entry["key"],
                device["attributes"]["resource.kubernetes.io/pciBusID"]["string"]))
        return refs

    def delete(self, names, refs):
        controller = VmiController(self.args.api, interval=0.05)
        controller.start()
        try:
            for name in names:
                self.api.call("DELETE", "%s/%s" % (VMIS, name))
            gone = wait_for(lambda: not [c for c in self.api.items(DRA + "namespaces/%s/resourceclaims" % NAMESPACE)
                                         if c["metadata"]["uid"] in {r.uid for r in refs}], 20)
        finally:
            controller.stop()
        answers = self.driver.unprepare(refs)
        print("$ kubectl delete vmi -n %s %s -> claims released %s; NodeUnprepareResources: %s" % (
            NAMESPACE, " ".join(names), "yes" if gone else "NO",
            ", ".join("%s %s" % (r.name, answers[r.uid] or "ok") for r in refs)))
        return gone and not any(answers.values())


def scene(args):
    """The whole scene; True when every step showed what it should."""
    s = WholeScene(args)
    if not s.publish_whole():
        return False
    for name, expression in (("whole-gpu", CEL % 'profile == "whole"'), ("l40s-24q", CEL % 'profile == "L40S-24Q"')):
        s.api.call("POST", DRA + "namespaces/%s/resourceclaimtemplates" % NAMESPACE, template(name, expression))
    print("$ kubectl create vmi vm-whole (claim: profile == \"whole\")")
    s.start(["vm-whole"], "whole-gpu")
    if not s.running(["vm-whole"]):
        status = (s.api.get("%s/vm-whole" % VMIS) or {}).get("status") or {}
        print("vm-whole did not run (phase %s: %s)" % (status.get("phase"), "; ".join(
            str(c.get("message")) for c in status.get("conditions") or ())))
        return False
    print("NodePrepareResources:")
    whole = s.prepared(["vm-whole"])
    print("GPU %s now: driver %s, %d VFs (passed through whole; KubeVirt attaches it by its pciBusID)"
          % ((s.gpu,) + s.state()))
    if whole is None or s.state() != ("vfio-pci", 0):
        return False
    print("$ kubectl create vmi vm-a vm-b (claims: L40S-24Q)")
    s.start(["vm-a", "vm-b"], "l40s-24q")
    pending = not s.running(["vm-a", "vm-b"], timeout=2)
    print("vm-a, vm-b while vm-whole runs: %s (the whole claim holds the GPU's counter)"
          % ("Pending" if pending else "RUNNING (wrong)"))
    if not pending or not s.delete(["vm-whole"], whole):
        return False
    print("GPU %s now: driver %s, %d VFs (back to vGPUs)" % ((s.gpu,) + s.state()))
    if s.state()[0] != "nvidia" or not s.running(["vm-a", "vm-b"]):
        print("vm-a, vm-b did not run once the GPU was back")
        return False
    print("vm-a, vm-b Running; NodePrepareResources:")
    vgpus = s.prepared(["vm-a", "vm-b"])
    typed = s.typed()
    print("Typed VFs of GPU %s: %s" % (s.gpu, ", ".join("%s=%d" % (vf, s.current(vf)) for vf in typed)))
    if vgpus is None or len(typed) != 2:
        return False
    return s.delete(["vm-a", "vm-b"], vgpus) and not s.typed()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--api", required=True)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--sys", required=True, help="the mounted gpusim root of the whole-GPU node")
    parser.add_argument("--work", required=True, help="a directory for the driver's kubelet and CDI files")
    parser.add_argument("--node", default="demo-whole-node")
    args = parser.parse_args(argv)
    ok = scene(args)
    print("One GPU, one counter: whole to one VM, then vGPUs to two others" if ok else "the whole-GPU scene FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
