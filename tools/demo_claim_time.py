# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""make demo, the claim-time scene (issue 33): two VMs with different vGPU profiles on one node's two claim-time
GPUs, without a relabel.

    tools/demo_claim_time.py --api URL --kubeconfig FILE --sys ROOT --work DIR [--node NAME]

Run by tools/demo.py with the simulated node's environment (GPUSIM_ROOT, PATH with its nvidia-smi/sriov-manage)
and the collection on PYTHONPATH. A second simulated node (gpusim, two L40S at ROOT) declares both GPUs claim-time
(the agent's config, `claim-time: [{devices: all, profiles: [...]}]`) and the collection's own code does what the
node agent does for it:
1. the engine applies the config (VFs enabled, no type written: claim-time GPUs are Prepare's), and the agent's
   SlicePublisher publishes the claim-time offers into the API emulator: a counter slice (one counter set per GPU)
   and a device slice (one multi-allocatable device per GPU and profile);
2. the examples' ResourceClaimTemplates and VMIs (docs/examples/claim-time/) are created; the fake KubeVirt
   controller (tests/fakes/vmi_controller.py: the resourceclaim controller and kube-scheduler's allocator) makes
   each VMI's claim from its template and allocates it: the 12Q claim takes one GPU, the 24Q-else-12Q claim finds
   that GPU serving 12Q only (its counter is taken) and gets a 24Q on the other;
3. the DRA driver's NodePrepareResources (driver.py with claim_time_prepare.py, what the kubelet calls) types a
   free VF of each allocated GPU, read back here from the simulated sysfs, and writes its address into the
   KEP-5304 metadata KubeVirt reads;
4. the VMIs are deleted: the claims are released and deleted with their pods, NodeUnprepareResources clears the
   types.
Exit status 0 when every step showed what it should.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import urllib.error
import urllib.request

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(REPO, "docs", "examples", "claim-time")
sys.path.insert(0, os.path.join(REPO, ".build", "collections"))

# pylint: disable=wrong-import-position
from ansible_collections.accelops.vgpu.plugins.module_utils.agent import kube  # noqa: E402
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import (  # noqa: E402
    checkpoint, claim_time, devices, metadata)
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.claim_time_prepare import (  # noqa: E402
    ClaimTimePreparer)
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.claims import ClaimRef  # noqa: E402
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.driver import DraDriver  # noqa: E402
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.publisher import SlicePublisher  # noqa: E402
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import claim_holders  # noqa: E402
from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout import vgpu_layout  # noqa: E402
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import facts, vgpu_apply  # noqa: E402
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine.claim_time_layout import declaration  # noqa: E402
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import Sysfs  # noqa: E402
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders.kubelet_holders import node_holders  # noqa: E402
from ansible_collections.accelops.vgpu.plugins.module_utils.runner import CommandRunner  # noqa: E402
from ansible_collections.accelops.vgpu.tests.fakes.vmi_controller import VmiController  # noqa: E402
from demo import rel, wait_for  # noqa: E402  (tools/demo.py, this script's directory)

NAMESPACE = "vms"
PROFILES = ["L40S-24Q", "L40S-12Q", "L40S-48Q"]
CONFIG = {"version": "v1", "vgpu-configs": {"default": [{"devices": "all", "vgpu-devices": {}}]},
          "claim-time": [{"devices": "all", "profiles": PROFILES}]}
DRA = "/apis/resource.k8s.io/v1/"
VMIS = "/apis/kubevirt.io/v1/namespaces/%s/virtualmachineinstances" % NAMESPACE


class Api:
    def __init__(self, url):
        self.url = url.rstrip("/")

    def call(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.load(response)

    def get(self, path):
        try:
            return self.call("GET", path)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    def items(self, path):
        return (self.get(path) or {}).get("items") or []


def examples():
    """[(template, vmi)] of the examples: the 12Q by CEL first, then the 24Q-else-12Q."""
    found = []
    for name in ("profile-by-cel", "profile-fallback"):
        pair = []
        for part in ("template.yaml", "vmi.yaml"):
            with open(os.path.join(EXAMPLES, name, part), encoding="utf-8") as handle:
                pair.append(yaml.safe_load(handle))
        found.append(tuple(pair))
    return found


class Scene:
    namespace, vmis = NAMESPACE, VMIS       # a subclass's scene runs in a namespace of its own

    def __init__(self, args):
        self.args, self.api, self.node = args, Api(args.api), args.node
        self.sysfs = Sysfs(args.sys)
        self.client = kube.KubeClient(kube.from_kubeconfig(args.kubeconfig))
        kubelet = os.path.join(args.work, "kubelet")
        self.plugin_dir, self.cdi_dir = claim_holders.plugin_dir(kubelet), os.path.join(args.work, "cdi")
        self.engine = vgpu_apply.NodeEngine(self.sysfs, CommandRunner(), os.path.join(args.sys, ".gpusim", "dev"), "/proc",
                                            cache_dir=args.work, kubelet_dir=kubelet)
        self.offers, self.driver = [], None

    # 1. the node publishes what it could create
    def publish(self):
        body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": self.node, "labels": {
            "kubernetes.io/hostname": self.node}}}
        uid = self.api.call("POST", "/api/v1/nodes", body)["metadata"]["uid"]
        print("Node %s: two L40S, the agent's config declares both claim-time (no nvidia.com/vgpu.config label, "
              "now or later):" % self.node)
        print("  claim-time: [{devices: all, profiles: [%s]}]" % ", ".join(PROFILES))
        vgpu_apply.apply(self.engine, vgpu_layout.from_layout([{"profiles": {}}]), enable_vfs=True)
        self.engine.claim_time_declaration = declaration(CONFIG)
        result = vgpu_apply.apply(self.engine, vgpu_layout.from_document(CONFIG, "default"))
        self.offers = claim_time.offers(self.sysfs, result["claim_time"])
        SlicePublisher(self.client, self.node, uid).publish(self.offers)
        self.driver = DraDriver(self.node, lambda ns, name: self.client.get_resource_claim(ns, name, timeout=10),
                                devices.NodeView(self.sysfs, lambda: facts.gather(self.sysfs, {})), self.plugin_dir,
                                self.cdi_dir, boot_id="demo",
                                typer=ClaimTimePreparer(self.sysfs, node_holders(
                                    self.sysfs, self.engine.dev_root, self.engine.proc_root, self.engine.kubelet_dir)))
        self.driver.typer.update(self.offers)
        typed = self.typed()
        print("After the apply: %d VFs enabled, %d typed (a claim-time GPU's VFs are typed by Prepare only)" % (
            len(self.vfs()), len(typed)))
        slices = [s for s in self.api.items(DRA + "resourceslices") if s["spec"].get("nodeName") == self.node]
        print("ResourceSlices of %s (pool %s, generation %s, %d slices):" % (
            self.node, slices[0]["spec"]["pool"]["name"] if slices else "-",
            slices[0]["spec"]["pool"]["generation"] if slices else "-", len(slices)))
        for item in sorted(slices, key=lambda s: s["metadata"]["name"]):
            spec = item["spec"]
            for counter_set in spec.get("sharedCounters") or ():
                print("  %s  counter set %-22s %s" % (item["metadata"]["name"], counter_set["name"], ", ".join(
                    "%s=%s" % (k, v["value"]) for k, v in sorted(counter_set["counters"].items()))))
            for device in spec.get("devices") or ():
                attrs = device["attributes"]
                print("  %s  device %-26s profile %-8s framebuffer %5s MiB  instances %s  consumes %s" % (
                    item["metadata"]["name"], device["name"], attrs["profile"]["string"],
                    attrs["framebuffer"]["int"], device["capacity"]["instances"]["value"],
                    ", ".join("%s/%s" % (c["counterSet"], ",".join(c["counters"])) for c in device["consumesCounters"])))
        return bool(slices) and not typed

    # 2. the scheduler picks
    def schedule(self):
        pairs = examples()
        print("$ kubectl create -f %s; kubectl create -f %s   (template and VMI each; the second after the first runs)" % (
            rel(os.path.join(EXAMPLES, "profile-by-cel")), rel(os.path.join(EXAMPLES, "profile-fallback"))))
        controller = VmiController(self.args.api, interval=0.05)
        controller.start()
        vmis = []
        try:
            for template, vmi in pairs:
                self.api.call("POST", DRA + "namespaces/%s/resourceclaimtemplates" % NAMESPACE, template)
                vmi = copy.deepcopy(vmi)
                vmi["spec"]["nodeSelector"] = {"kubernetes.io/hostname": self.node}
                self.api.call("POST", VMIS, vmi)
                vmis.append(vmi)
                name = vmi["metadata"]["name"]
                if not wait_for(lambda: self.phase(name) == "Running", 20):
                    status = (self.api.get("%s/%s" % (VMIS, name)) or {}).get("status") or {}
                    print("VMI %s did not reach Running (phase %s: %s)" % (name, status.get("phase"), "; ".join(
                        str(c.get("message")) for c in status.get("conditions") or ())))
                    return None
        finally:
            controller.stop()
        claims = []
        print("The claims the resourceclaim controller made from the templates, as the scheduler allocated them:")
        for (template, dummy), vmi in zip(pairs, vmis):
            claim = self.claim_of(vmi)
            [result] = claim["status"]["allocation"]["devices"]["results"]
            offer = self.offer(result["device"])
            print("  VMI %-16s claim %-34s template %-18s -> request %-11s device %s (GPU %s, shareID %s...)" % (
                vmi["metadata"]["name"], claim["metadata"]["name"], template["metadata"]["name"], result["request"],
                result["device"], offer.gpu, result["shareID"][:8]))
            claims.append(claim)
        gpus = [self.offer(c["status"]["allocation"]["devices"]["results"][0]["device"]).gpu for c in claims]
        print("Two profiles, %s: the first claim's device took its GPU's counter, so the fallback's 24Q went to "
              "the other GPU" % ("two GPUs" if len(set(gpus)) == 2 else "ONE GPU (wrong)"))
        return vmis, claims if len(set(gpus)) == 2 else None

    # 3. the kubelet prepares
    def prepare(self, claims):
        refs = [ClaimRef(c["metadata"]["namespace"], c["metadata"]["name"], c["metadata"]["uid"]) for c in claims]
        print("NodePrepareResources (the DRA driver's code, what the kubelet calls before the launcher pod starts):")
        answers = self.driver.prepare(refs)
        ok = True
        for claim, ref in zip(claims, refs):
            answer = answers[ref.uid]
            if answer.error:
                print("  claim %s: %s" % (ref.name, answer.error))
                ok = False
                continue
            [entry] = checkpoint.Checkpoint(self.plugin_dir).get(ref.uid)["devices"]
            vf = entry["key"]
            current = self.current(vf)
            with open(metadata.file_path(self.plugin_dir, ref.namespace, ref.name, "vgpu"), encoding="utf-8") as handle:
                [device] = metadata.read_stream(handle.read())[0]["requests"][0]["devices"]
            pci = device["attributes"]["resource.kubernetes.io/pciBusID"]["string"]
            offer = self.offer(claim["status"]["allocation"]["devices"]["results"][0]["device"])
            print("  claim %-34s VF %s of GPU %s: %s/nvidia/current_vgpu_type reads %d (%s); metadata pciBusID %s" % (
                ref.name, vf, self.parent(vf), rel(os.path.join(self.args.sys, "bus/pci/devices", vf)), current,
                offer.profile, pci))
            ok = ok and current == offer.type_id and pci == vf and self.parent(vf) == offer.gpu
        return refs if ok else None

    # 4. the VMs go
    def unprepare(self, vmis, refs):
        typed = self.typed()
        print("$ kubectl delete vmi -n %s %s" % (NAMESPACE, " ".join(v["metadata"]["name"] for v in vmis)))
        controller = VmiController(self.args.api, interval=0.05)
        controller.start()
        try:
            for vmi in vmis:
                self.api.call("DELETE", "%s/%s" % (VMIS, vmi["metadata"]["name"]))
            gone = wait_for(lambda: not self.api.items(DRA + "namespaces/%s/resourceclaims" % NAMESPACE), 20)
        finally:
            controller.stop()
        print("The claims were released and deleted with their pods: %s" % ("yes" if gone else "NO"))
        answers = self.driver.unprepare(refs)
        print("NodeUnprepareResources: %s" % ", ".join("%s %s" % (r.name, answers[r.uid] or "ok") for r in refs))
        print("current_vgpu_type now: %s" % ", ".join("%s=%d" % (vf, self.current(vf)) for vf in sorted(typed)))
        return gone and not self.typed() and all(not answers[r.uid] for r in refs)

    # reads
    def phase(self, name):
        return ((self.api.get("%s/%s" % (self.vmis, name)) or {}).get("status") or {}).get("phase")

    def claim_of(self, vmi):
        uid = self.api.get("%s/%s" % (self.vmis, vmi["metadata"]["name"]))["metadata"]["uid"]
        return next(c for c in self.api.items(DRA + "namespaces/%s/resourceclaims" % self.namespace)
                    if any(o.get("uid") == uid for o in c["metadata"].get("ownerReferences") or ()))

    def offer(self, name):
        return next(o for o in self.offers if o.name == name)

    def vfs(self):
        base = os.path.join(self.args.sys, "bus", "pci", "devices")
        return sorted(a for a in os.listdir(base) if os.path.islink(os.path.join(base, a, "physfn")))

    def parent(self, vf):
        return os.path.basename(os.readlink(os.path.join(self.args.sys, "bus", "pci", "devices", vf, "physfn")))

    def current(self, vf):
        with open(os.path.join(self.args.sys, "bus", "pci", "devices", vf, "nvidia", "current_vgpu_type"),
                  encoding="utf-8") as handle:
            return int(handle.read().strip() or 0)

    def typed(self):
        return [vf for vf in self.vfs() if self.current(vf)]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--api", required=True)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--sys", required=True, help="the mounted gpusim root of the claim-time node")
    parser.add_argument("--work", required=True, help="a directory for the driver's kubelet and CDI files")
    parser.add_argument("--node", default="demo-claim-node")
    args = parser.parse_args(argv)
    scene = Scene(args)
    if not scene.publish():
        print("the claim-time slices were not published, or a VF was typed before any claim")
        return 1
    scheduled = scene.schedule()
    if not scheduled or scheduled[1] is None:
        return 1
    vmis, claims = scheduled
    refs = scene.prepare(claims)
    if refs is None:
        return 1
    if not scene.unprepare(vmis, refs):
        print("the unprepare did not clear every type")
        return 1
    print("No relabel, no drain: the profiles were chosen by the claims, written at prepare, cleared at unprepare")
    return 0


if __name__ == "__main__":
    sys.exit(main())
