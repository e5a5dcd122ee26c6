"""`make demo`, the README's first command, runs end to end and shows what it promises.

The demo is a user's first contact and touches every layer (gpusim, the playbooks, the API double, the
agent with its device plugin and DRA driver, the test kubelet, the conformance playbook, the GitOps relabel);
a stricter double or a changed seed breaks it without any other test noticing, so it runs here as
`tools/demo.sh --keep` (what `make demo` calls), its output is checked for the parts the README describes,
and what it left (the simulated node, the API double, the conformance report) is read before `--down`.
"""

import json
import os
import re
import subprocess
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEMO = os.path.join(REPO, ".build", "demo")
SYS = os.path.join(DEMO, "sys")
DRIVER = "vgpu.accelops.io"


def attribute(device, name):
    value = (device.get("attributes") or {}).get(name) or device["attributes"].get("%s/%s" % (DRIVER, name))
    return next(iter(value.values()))


def stored(path):
    """A GET on the API double the demo left running (--keep), outside the demo's own code."""
    with open(os.path.join(DEMO, "kubeconfig"), encoding="utf-8") as handle:
        server = json.load(handle)["clusters"][0]["cluster"]["server"]
    with urllib.request.urlopen(server + path, timeout=10) as response:
        return json.load(response)


def node_vgpus():
    """{(framework, device): (parent GPU, vGPU type ID or None)} read from the simulated sysfs: each typed
    vendor-VFIO VF (its current_vgpu_type) and each mdev (its parent function's PF)."""
    devices = os.path.join(SYS, "bus", "pci", "devices")

    def physfn(function):
        link = os.path.join(devices, function, "physfn")
        return os.path.basename(os.readlink(link)) if os.path.islink(link) else function
    found = {}
    for address in os.listdir(devices):
        try:
            with open(os.path.join(devices, address, "nvidia", "current_vgpu_type"), encoding="utf-8") as handle:
                type_id = int(handle.read().strip() or 0)
        except OSError:
            continue
        if type_id:
            found[("vendor-vfio", address)] = (physfn(address), type_id)
    mdevs = os.path.join(SYS, "bus", "mdev", "devices")
    for uuid in os.listdir(mdevs):
        parent = os.path.basename(os.path.dirname(os.path.realpath(os.path.join(mdevs, uuid))))
        found[("mdev", uuid)] = (physfn(parent), None)
    return found


def published_vgpus():
    """The same view from the ResourceSlices of demo-node the DRA driver published (newest pool generation)."""
    items = [i for i in stored("/apis/resource.k8s.io/v1/resourceslices")["items"]
             if i["spec"]["driver"] == DRIVER and i["spec"]["nodeName"] == "demo-node"]
    assert items, "no ResourceSlice of %s for demo-node" % DRIVER
    newest = max(int(i["spec"]["pool"]["generation"]) for i in items)
    published = {}
    for item in items:
        if int(item["spec"]["pool"]["generation"]) != newest:
            continue
        for device in item["spec"]["devices"]:
            framework = attribute(device, "framework")
            key = attribute(device, "mdevUUID") if framework == "mdev" else attribute(
                device, "resource.kubernetes.io/pciBusID")
            assert (framework, key) not in published, device
            published[(framework, key)] = (attribute(device, "parentGPU"),
                                           int(attribute(device, "typeID")) if framework == "vendor-vfio" else None)
    return published


def check_claim_time_scene(out):
    """Profiles chosen at claim time (issue 33): on the second simulated node (two claim-time L40S) two VMs got a
    12Q and a 24Q on its two GPUs from the same published offers, typed at prepare and cleared at unprepare, no
    relabel. Read from the scene's gpusim (its write log and sysfs) and the API double, not from the output."""
    assert "Profiles chosen at claim time" in out, out[-4000:]
    root = os.path.join(DEMO, "sys-claim-time")
    devices = os.path.join(root, "bus", "pci", "devices")
    with open(os.path.join(root, ".gpusim", "log"), encoding="utf-8") as handle:
        log = [json.loads(line) for line in handle if line.strip()]
    writes = [(e["path"].split("/")[3], int(e["value"])) for e in log if e["path"].endswith("/current_vgpu_type")]
    typed, cleared = writes[:2], writes[2:]
    assert sorted(t for _vf, t in typed) == [1153, 1155] and sorted(cleared) == sorted((vf, 0) for vf, _t in typed), writes
    parents = [os.path.basename(os.readlink(os.path.join(devices, vf, "physfn"))) for vf, _t in typed]
    assert sorted(parents) == ["0000:41:00.0", "0000:42:00.0"]     # one VM on each GPU
    for vf in os.listdir(devices):
        path = os.path.join(devices, vf, "nvidia", "current_vgpu_type")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as handle:
                assert handle.read().strip() == "0", vf
    # what the node published: a counter set per GPU in a counter slice, profile devices that consume them
    items = [i for i in stored("/apis/resource.k8s.io/v1/resourceslices")["items"]
             if i["spec"]["nodeName"] == "demo-claim-node"]
    assert sorted(c["name"] for i in items for c in i["spec"].get("sharedCounters") or ()) == [
        "gpu-0000-41-00-0", "gpu-0000-42-00-0"]
    offered = [d for i in items for d in i["spec"].get("devices") or ()]
    assert offered and all(d["allowMultipleAllocations"] and d["consumesCounters"] for d in offered)
    assert {attribute(d, "profile") for d in offered} >= {"L40S-12Q", "L40S-24Q"}
    # the claims: made from the examples' templates for the launcher pods, gone with the VMIs; no relabel
    templates = stored("/apis/resource.k8s.io/v1/namespaces/vms/resourceclaimtemplates")["items"]
    assert sorted(t["metadata"]["name"] for t in templates) == ["l40s-12q", "l40s-24q-else-12q"]
    assert stored("/apis/resource.k8s.io/v1/namespaces/vms/resourceclaims")["items"] == []
    with open(os.path.join(DEMO, "kubeconfig"), encoding="utf-8") as handle:
        server = json.load(handle)["clusters"][0]["cluster"]["server"]
    with urllib.request.urlopen(server + "/_ctl/log", timeout=10) as response:
        requests = json.load(response)
    posts = [r["path"] for r in requests if r["method"] == "POST"
             and r["path"] == "/apis/resource.k8s.io/v1/namespaces/vms/resourceclaims"]
    assert len(posts) == 2
    labels = stored("/api/v1/nodes/demo-claim-node")["metadata"].get("labels") or {}
    assert not [k for k in labels if k.startswith("nvidia.com/vgpu.config")]


def check_claim_time_mig_scene(out):
    """MIG-backed vGPUs placed at claim time (issue 42 item 2): three claims fill one H100 (3g at 0, 2g at 4, 1g at 6),
    a fourth finds no free placement, and unprepare leaves no GPU instance."""
    scene = out.split("MIG-backed vGPUs placed at claim time")[-1].split("The whole GPU or vGPUs")[0]
    placed = re.findall(r"prepared: GPU instance \d+ at (\d+):(\d+), VF (\S+) typed", scene)
    assert sorted((int(start), int(size)) for start, size, _vf in placed) == [(0, 4), (4, 2), (6, 1)], scene[-3000:]
    assert len({vf for _s, _z, vf in placed}) == 3
    assert "not allocated: no placement of H100-3-40C is free" in scene
    assert "GPU instances left: 0" in scene, scene[-3000:]


def check_whole_gpu_scene(out):
    """The whole GPU or vGPUs (issue 42 item 1): one L40S given whole to one VM (VFs off, vfio-pci), then, once that VM
    is deleted, back to nvidia with its VFs and two 24Q vGPUs of it to two VMs. Read from the scene's gpusim."""
    assert "One GPU, one counter: whole to one VM, then vGPUs to two others" in out, out[-4000:]
    root = os.path.join(DEMO, "sys-whole-gpu")
    with open(os.path.join(root, ".gpusim", "log"), encoding="utf-8") as handle:
        log = [(e["path"], e["value"]) for e in (json.loads(line) for line in handle if line.strip())
               if e["result"] == "ok"]
    pf = "0000:41:00.0"
    to_vfio = log.index(("bus/pci/drivers/vfio-pci/bind", pf))
    back = log.index(("bus/pci/drivers/nvidia/bind", pf), to_vfio)
    assert log.index(("bus/pci/devices/%s/sriov_numvfs" % pf, "0")) < to_vfio
    typed = [(path.split("/")[3], value) for path, value in log[back:] if path.endswith("/current_vgpu_type")]
    assert [v for _vf, v in typed] == ["1155", "1155", "0", "0"] and len({vf for vf, _v in typed}) == 2, typed
    with open(os.path.join(root, "bus/pci/devices", pf, "sriov_numvfs"), encoding="utf-8") as handle:
        assert int(handle.read()) == 32
    assert os.path.basename(os.readlink(os.path.join(root, "bus/pci/devices", pf, "driver"))) == "nvidia"


def test_make_demo_programs_the_node_attests_it_and_follows_a_relabel(tmp_path):
    log = tmp_path / "demo.log"   # a file, not a pipe: the API double and gpusim of --keep hold their stdout open
    try:
        with open(log, "w", encoding="utf-8") as handle:
            proc = subprocess.run([os.path.join(REPO, "tools", "demo.sh"), "--keep"], cwd=REPO, stdout=handle,
                                  stderr=subprocess.STDOUT, timeout=900, check=False)
        out = log.read_text(encoding="utf-8")
        assert proc.returncode == 0, out[-4000:]
        assert "playbooks/site.yml succeeded" in out
        assert re.search(r"nvidia\.com/NVIDIA_L40S-24Q\s+4 on demo-node", out), out[-4000:]
        assert "no nvidia.com/vgpu.config label -> DEFAULT_VGPU_CONFIG 'demo'" in out
        # the conformance playbook ran against the demo cluster: rc 0 and no FAIL row
        assert "playbooks/conformance.yml   (rc 0)" in out
        summary = re.search(r"\*\*(\d+) PASS, (\d+) FAIL, (\d+) UNKNOWN\*\*", out)
        assert summary and int(summary.group(1)) > 0 and summary.group(2) == "0", out[-4000:]
        # the DRA rows: the agent's DRA driver published, the chart's DeviceClass existed, the fake scheduler
        # allocated the claims: every DRA row PASSes, one sharing.dra and over-allocation.dra per profile
        with open(os.path.join(DEMO, "conformance", "vgpu-conformance.json"), encoding="utf-8") as handle:
            checks = json.load(handle)["checks"]
        dra = sorted((c["check"], c["subject"], c["status"]) for c in checks if c["check"].endswith(".dra"))
        assert dra == [("consistency.dra", "resource.k8s.io/v1", "PASS")] + [
            (check, "%s@demo-node" % profile, "PASS") for check in ("over-allocation.dra", "sharing.dra")
            for profile in ("A16-4Q", "L40S-24Q", "T4-8Q")], dra
        # each GPU served one way only (issue 31.5: both on the same GPU offered every vGPU twice)
        split = re.search(r"the device plugin serves (\S.*), the DRA driver (\S.*)", out)
        plugin_gpus, dra_gpus = split.group(1).split(", "), split.group(2).split(", ")
        assert plugin_gpus and dra_gpus and not set(plugin_gpus) & set(dra_gpus)
        # the GitOps path: the agent converged the relabel and the kubelet's resources followed it
        assert "nvidia.com/vgpu.config.state: success -> pending -> success" in out
        after = re.search(r"status\.allocatable \(written by the test kubelet\): (.*)", out.split("GitOps")[-1])
        assert after and "nvidia.com/NVIDIA_L40S-8Q=6" in after.group(1), out[-4000:]   # one L40S of two
        # ... and so did the DRA driver's ResourceSlices: they publish exactly the vGPUs its GPUs have now
        published, node = published_vgpus(), node_vgpus()
        assert published == dict((key, value) for key, value in node.items() if value[0] in dra_gpus)
        assert set(value[0] for value in published.values()) == set(dra_gpus)
        assert sorted(type_id for _gpu, type_id in node.values() if type_id) == [1152] * 12  # 12 x L40S-8Q
        assert stored("/apis/resource.k8s.io/v1/deviceclasses/" + DRIVER)["spec"]["selectors"]
        check_claim_time_scene(out)
        check_claim_time_mig_scene(out)
        check_whole_gpu_scene(out)
    finally:
        subprocess.run([os.path.join(REPO, "tools", "demo.sh"), "--down"], cwd=REPO, capture_output=True,
                       timeout=120, check=False)
    # torn down: nothing of the simulated node stays mounted
    with open("/proc/mounts", encoding="utf-8") as mounts:
        assert os.path.join(REPO, ".build", "demo") not in mounts.read()
