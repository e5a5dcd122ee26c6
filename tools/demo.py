# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""make demo: run playbooks/site.yml against a simulated GPU node and say what it did.

1. mounts a gpusim tree (a simulated /sys with NVIDIA GPUs) at .build/demo/sys and puts the fake
   sriov-manage / nvidia-smi on PATH;
2. starts the Kubernetes API emulator (tests/fakes/kmock_serve.py) with a KubeVirt CR, if present;
3. runs `ansible-playbook -i inventories/demo playbooks/site.yml`, streaming its output;
4. prints a summary (GPUs, VFs, vGPUs, KubeVirt resources, what changed, how to look further);
5. the node agent (`accelops-vgpu agent`, a real process) starts with its device plugin, registered with the
   test kubelet (tests/fakes/kubelet_double.py, the kubelet's gRPC APIs), which writes demo-node's
   status.capacity/allocatable from the plugin's ListAndWatch; the agent is also the DRA driver
   vgpu.accelops.io (registered with the same kubelet): its ResourceSlices of demo-node appear in the
   emulator next to the chart's DeviceClasses; each GPU is served by one of the two, never both (the first
   half of each model's GPUs by the device plugin, the rest by DRA: DEVICE_PLUGIN_GPUS, DRA_DRIVER_GPUS;
   both on the same GPU would offer every vGPU twice); the conformance report reads both; then the GitOps path:
   demo-node is relabelled in the emulator, the agent converges it, the resources and slices follow; then
   profiles chosen at claim time (tools/demo_claim_time.py): a second simulated node with two claim-time L40S,
   two VMs of the examples (docs/examples/claim-time) get a 12Q and a 24Q on its two GPUs, typed at prepare,
   cleared at unprepare, without a relabel; then MIG-backed vGPUs placed at claim time
   (tools/demo_claim_time_mig.py): one H100 in MIG mode, three claims get GPU instances created at prepare;
   then the whole GPU or vGPUs (tools/demo_whole_gpu.py): a node of one L40S gives its GPU whole to one VM, then, once
   that VM is deleted, as vGPUs to two others;
6. tears everything down, unless --keep (then `tools/demo.py --down` does it later).
Last, the conformance report of the demo cluster (playbooks/conformance.yml, KAR-0003 / KAR-0004) against
the API emulator and the fake KubeVirt controller tests/fakes/vmi_controller.py.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV_BIN = os.path.join(REPO, ".venv", "bin")
DEMO = os.path.join(REPO, ".build", "demo")
SYS = os.path.join(DEMO, "sys")
TOOLS = os.path.join(DEMO, "bin")
FACTS = os.path.join(DEMO, "facts")
KUBECONFIG = os.path.join(DEMO, "kubeconfig")
KMOCK = os.path.join(REPO, "tests", "fakes", "kmock_serve.py")
NODE_ROOT = os.path.join(DEMO, "node-root")
CDI_DIR = os.path.join(DEMO, "cdi")   # the agent's CDI specs of prepared claims (the runtime's /var/run/cdi)
CLAIM_TIME_SYS = os.path.join(DEMO, "sys-claim-time")    # the claim-time scene's node: two L40S
CLAIM_TIME_WORK = os.path.join(DEMO, "claim-time")       # its DRA driver's kubelet and CDI files
CLAIM_TIME_NODE = "demo-claim-node"
MIG_SYS = os.path.join(DEMO, "sys-claim-time-mig")    # the MIG-backed claim-time scene's node: one H100
MIG_WORK = os.path.join(DEMO, "claim-time-mig")
WHOLE_SYS = os.path.join(DEMO, "sys-whole-gpu")          # the whole-GPU scene's node: one L40S
WHOLE_WORK = os.path.join(DEMO, "whole-gpu")
WHOLE_NODE = "demo-whole-node"
DEFAULT_GPUS = "l40s:2,a16:1,t4:2"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
KUBEVIRT_PATH = "/apis/kubevirt.io/v1/namespaces/kubevirt/kubevirts/kubevirt"


def rel(path):
    return os.path.relpath(path, REPO)


def gpusim(*args, check=True):
    return subprocess.run([os.path.join(VENV_BIN, "gpusim"), *args], check=check,
                          stdout=subprocess.PIPE, text=True).stdout


def is_mounted(path):
    return os.path.ismount(path)


# ---------------------------------------------------------------- bring up / tear down

# A runbook's hand-written entry for the L40S VFs; the demo inventory takes it over
# (kubevirt_vgpu_take_over), as a cluster migrating to the collection would.
HAND_WRITTEN = {"pciVendorSelector": "10DE:26B9", "resourceName": "nvidia.com/L40S-24Q"}


def cluster_seed(node_name):
    """What the emulated cluster holds before the run: KubeVirt (with another team's NIC entry the
    run must keep, and a hand-written L40S entry the run takes over), the GPU Operator ClusterPolicy
    and the node object."""
    kubevirt = {"apiVersion": "kubevirt.io/v1", "kind": "KubeVirt",
                "metadata": {"name": "kubevirt", "namespace": "kubevirt", "resourceVersion": "1"},
                "spec": {"configuration": {
                    "permittedHostDevices": {"pciHostDevices": [
                        {"pciVendorSelector": "8086:1572", "resourceName": "intel.com/x710"}, dict(HAND_WRITTEN)]},
                    "developerConfiguration": {"featureGates": ["LiveMigration"]}}},
                "status": {"observedKubeVirtVersion": "v1.9.0", "operatorVersion": "v1.9.0", "phase": "Deployed"}}
    policy = {"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy",
              "metadata": {"name": "cluster-policy", "resourceVersion": "1"},
              "spec": {"sandboxWorkloads": {"enabled": False, "defaultWorkload": "container"},
                       "vgpuDeviceManager": {"enabled": True}}}
    node = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": node_name, "resourceVersion": "1", "labels": {"kubernetes.io/hostname": node_name}}}
    verbs = ["get", "list", "patch"]
    dra_verbs = ["get", "list", "watch", "create", "update", "patch", "delete"]
    resources = {
        "kubevirt.io/v1/kubevirts": {"kind": "KubeVirt", "singular": "kubevirt", "namespaced": True, "verbs": verbs},
        "nvidia.com/v1/clusterpolicies": {"kind": "ClusterPolicy", "singular": "clusterpolicy", "namespaced": False,
                                          "verbs": verbs},
        # create: the claim-time scene adds its node (demo_claim_time.py)
        "v1/nodes": {"kind": "Node", "singular": "node", "namespaced": False, "verbs": verbs + ["watch", "create"]},
        # the node agent's Events (GitOps part of the demo)
        "v1/events": {"kind": "Event", "singular": "event", "namespaced": True, "verbs": ["create", "list"]},
        # the conformance run's namespace and test VMIs (the API double, like a real server, serves only what
        # is declared: KubeVirt's CRD declares VirtualMachineInstances)
        "v1/namespaces": {"kind": "Namespace", "singular": "namespace", "namespaced": False,
                          "verbs": ["get", "list", "create", "delete"]},
        "kubevirt.io/v1/virtualmachineinstances": {
            "kind": "VirtualMachineInstance", "singular": "virtualmachineinstance", "namespaced": True,
            "verbs": ["get", "list", "create", "delete", "patch"]},
        # DRA (resource.k8s.io/v1, GA since Kubernetes 1.34): the agent's ResourceSlices, the chart's
        # DeviceClasses, the conformance run's ResourceClaims (allocated by the fake controller)
        "resource.k8s.io/v1/resourceslices": {"kind": "ResourceSlice", "singular": "resourceslice", "namespaced": False,
                                              "verbs": dra_verbs},
        "resource.k8s.io/v1/deviceclasses": {"kind": "DeviceClass", "singular": "deviceclass", "namespaced": False,
                                             "verbs": dra_verbs},
        "resource.k8s.io/v1/resourceclaims": {"kind": "ResourceClaim", "singular": "resourceclaim", "namespaced": True,
                                              "verbs": dra_verbs},
        # the claim-time scene's templates (docs/examples/claim-time), made into claims by the fake controller
        "resource.k8s.io/v1/resourceclaimtemplates": {"kind": "ResourceClaimTemplate", "singular": "resourceclaimtemplate",
                                                      "namespaced": True, "verbs": dra_verbs}}
    objects = [
        {"resource": "kubevirt.io/v1/kubevirts", "namespace": "kubevirt", "name": "kubevirt", "body": kubevirt},
        {"resource": "nvidia.com/v1/clusterpolicies", "name": "cluster-policy", "body": policy},
        {"resource": "v1/nodes", "name": node_name, "body": node}]
    return {"resources": resources, "objects": objects}


def start_api_server(state_dir, node_name):
    """The API emulator (its own process) seeded for one node; returns its URL. Leaves its pid and a
    kubeconfig for it in state_dir. Also used by the Molecule cluster scenario."""
    proc = subprocess.Popen([sys.executable, KMOCK], stdout=subprocess.PIPE, text=True, start_new_session=True)
    with open(os.path.join(state_dir, "kmock.pid"), "w", encoding="utf-8") as handle:
        handle.write(str(proc.pid))
    line = proc.stdout.readline().split()
    if len(line) != 2 or line[0] != "ready":
        raise SystemExit("demo: the API server did not start (%s printed %r)" % (rel(KMOCK), " ".join(line)))
    url = "http://127.0.0.1:%s" % line[1]
    request = urllib.request.Request(url + "/_ctl/reset", data=json.dumps(cluster_seed(node_name)).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=10):
        pass
    with open(os.path.join(state_dir, "kubeconfig"), "w", encoding="utf-8") as handle:
        json.dump({"apiVersion": "v1", "kind": "Config", "current-context": "demo",
                   "clusters": [{"name": "demo", "cluster": {"server": url}}],
                   "users": [{"name": "demo", "user": {"token": "demo-token"}}],
                   "contexts": [{"name": "demo", "context": {"cluster": "demo", "user": "demo"}}]}, handle)
    return url


def stop_api_server(state_dir):
    pid_file = os.path.join(state_dir, "kmock.pid")
    try:
        with open(pid_file, encoding="utf-8") as handle:
            pid = int(handle.read())
        os.killpg(pid, signal.SIGTERM)
    except (OSError, ValueError):
        pass
    for path in (pid_file, os.path.join(state_dir, "kubeconfig")):
        if os.path.exists(path):
            os.remove(path)


def down():
    stop_api_server(DEMO)
    for root in (SYS, CLAIM_TIME_SYS, MIG_SYS, WHOLE_SYS):
        if is_mounted(root):
            gpusim("down", root, check=False)


def up(gpus):
    down()
    for path in (FACTS, NODE_ROOT, CDI_DIR, CLAIM_TIME_WORK, MIG_WORK, WHOLE_WORK):
        shutil.rmtree(path, ignore_errors=True)
    os.makedirs(SYS, exist_ok=True)
    os.makedirs(TOOLS, exist_ok=True)
    gpusim("up", SYS, "--gpus", gpus)
    gpusim("tools", TOOLS)


# ---------------------------------------------------------------- the run

def ansible_env():
    env = dict(os.environ)
    env.update({
        "PATH": TOOLS + os.pathsep + VENV_BIN + os.pathsep + env.get("PATH", ""),
        "GPUSIM_ROOT": SYS,
        "ANSIBLE_CONFIG": os.path.join(REPO, "ansible.cfg"),
        "ANSIBLE_COLLECTIONS_PATH": os.path.join(REPO, ".build", "collections"),
        "ANSIBLE_CACHE_PLUGIN": "ansible.builtin.jsonfile",
        "ANSIBLE_CACHE_PLUGIN_CONNECTION": FACTS,
        "K8S_AUTH_KUBECONFIG": KUBECONFIG,
    })
    return env


def run_playbook(env, with_cluster):
    """Runs site.yml with its output streaming through; returns (rc, {task: [hosts changed]})."""
    env = dict(env, ANSIBLE_FORCE_COLOR="1" if sys.stdout.isatty() else "0")
    argv = [os.path.join(VENV_BIN, "ansible-playbook"), "-i", "inventories/demo", "playbooks/site.yml"]
    if not with_cluster:
        argv += ["--limit", "all:!vgpu_cluster"]
    print("$ " + " ".join(argv), flush=True)
    changed, task = {}, None
    with subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, bufsize=1) as proc:
        for line in proc.stdout:
            sys.stdout.write(line)
            plain = ANSI.sub("", line)
            header = re.match(r"TASK \[(.*)\] \*", plain)
            if header:
                task = header.group(1)
            done = re.match(r"changed: \[([^\]]+)\]", plain)
            if done and task:
                changed.setdefault(task, []).append(done.group(1))
    return proc.returncode, changed


# ---------------------------------------------------------------- what the node looks like now

def read(*parts):
    try:
        with open(os.path.join(*parts), encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError:
        return None


def vf_counts():
    """{PF address: (numvfs, totalvfs)} from the simulated sysfs."""
    devices = os.path.join(SYS, "bus", "pci", "devices")
    counts = {}
    for address in sorted(os.listdir(devices)):
        total = read(devices, address, "sriov_totalvfs")
        if total is not None:
            counts[address] = (int(read(devices, address, "sriov_numvfs") or 0), int(total))
    return counts


def node_facts(env):
    """What the vgpu_profiles role published for demo-node (module results), through the fact cache."""
    expression = "{{ {'gpus': vgpu_profiles_gpus | default([]), 'resources': vgpu_profiles_resources | default([])} }}"
    argv = [os.path.join(VENV_BIN, "ansible"), "demo-node", "-i", "inventories/demo",
            "-m", "ansible.builtin.debug", "-a", "msg=" + expression]
    env = dict(env, ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json")
    proc = subprocess.run(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                          check=False)
    try:
        return json.loads(proc.stdout)["plays"][0]["tasks"][0]["hosts"]["demo-node"]["msg"]
    except (ValueError, KeyError, IndexError, TypeError):
        return {"gpus": [], "resources": []}


def write_log():
    """The simulator's log of sysfs writes: [{path, value, result, ...}]."""
    text = read(SYS, ".gpusim", "log") or ""
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def api_get(api_url, path):
    try:
        with urllib.request.urlopen(api_url + path, timeout=5) as response:
            return json.load(response)
    except (OSError, ValueError):
        return None


# ---------------------------------------------------------------- the summary

def section(title):
    print("\n" + title)
    print("-" * len(title))


def write_kind(entry):
    """A short name for one sysfs write of the simulator's log."""
    path = entry["path"]
    if "/mdev_supported_types/" in path:
        return "mdev create"
    if path.startswith("bus/pci/drivers/") or path.endswith("/driver_override"):
        return "driver (un)bind"
    return path.rsplit("/", 1)[-1]


def profile_counts(vgpus, key):
    counts = Counter(vgpu[key] for vgpu in vgpus if vgpu.get(key))
    return ", ".join("%d x %s" % (count, name) for name, count in sorted(counts.items())) or "none"


def print_gpus(facts):
    section("GPUs on demo-node")
    vfs = vf_counts()
    print("%-14s %-8s %-12s %-7s %s" % ("PCI address", "model", "framework", "VFs", "vGPUs per GPU"))
    for gpu in facts["gpus"]:
        numvfs, total = vfs.get(gpu["address"], (0, 0))
        row = (gpu["address"], gpu.get("model") or "?", gpu.get("framework", "?"),
               "%d/%d" % (numvfs, total) if total else "-", profile_counts(gpu.get("vgpus", []), "after"))
        print("%-14s %-8s %-12s %-7s %s" % row)
    if not facts["gpus"]:
        print("(no results: the vgpu_profiles role did not finish)")


def print_resources(facts, api_url):
    section("KubeVirt resources (what VMs request)")
    for resource in facts["resources"]:
        if resource.get("framework") == "vendor-vfio":
            selector = "pciHostDevices   pciVendorSelector %s" % resource.get("pci_vendor_selector")
        else:
            selector = "mediatedDevices  mdevNameSelector  %r" % resource.get("mdev_name_selector")
        print("%-30s %3d on demo-node   %s" % (resource["resource_name"], resource["count"], selector))
    if api_url:
        print_cluster(api_url)
    else:
        print("(cluster part skipped: no API emulator %s)" % rel(KMOCK))


def print_cluster(api_url):
    """The objects the cluster part patched, as the API emulator now holds them."""
    kubevirt = api_get(api_url, KUBEVIRT_PATH) or {}
    permitted = kubevirt.get("spec", {}).get("configuration", {}).get("permittedHostDevices", {})
    print("In the cluster (API emulator %s):" % api_url)
    for key in ("pciHostDevices", "mediatedDevices"):
        names = [entry.get("resourceName") for entry in permitted.get(key) or []]
        print("  KubeVirt kubevirt/kubevirt %-16s %s" % (key + ":", ", ".join(names) or "-"))
    print_take_over(permitted.get("pciHostDevices") or [])
    labels = ((api_get(api_url, "/api/v1/nodes/demo-node") or {}).get("metadata") or {}).get("labels") or {}
    print("  Node demo-node labels:           %s" % ", ".join(
        "%s=%s" % item for item in sorted(labels.items()) if item[0] != "kubernetes.io/hostname"))
    policy = (api_get(api_url, "/apis/nvidia.com/v1/clusterpolicies/cluster-policy") or {}).get("spec") or {}
    print("  ClusterPolicy cluster-policy:    sandboxWorkloads.enabled=%s, vgpuDeviceManager.enabled=%s"
          % ((policy.get("sandboxWorkloads") or {}).get("enabled"), (policy.get("vgpuDeviceManager") or {}).get("enabled")))


def print_take_over(pci_entries):
    """The hand-written entry: replaced by ours (taken over), or still there when no GPU of ours has its ID."""
    selector = HAND_WRITTEN["pciVendorSelector"]
    if HAND_WRITTEN in pci_entries:
        print("  hand-written %s (%s) kept: no GPU of this demo has that PCI ID" % (HAND_WRITTEN["resourceName"], selector))
        return
    ours = [e["resourceName"] for e in pci_entries if str(e.get("pciVendorSelector", "")).upper() == selector]
    print("  taken over: hand-written %s (pciVendorSelector %s) -> %s (kubevirt_vgpu_take_over)"
          % (HAND_WRITTEN["resourceName"], selector, ", ".join(ours) or "-"))


def print_changes(facts, changed):
    section("What changed")
    writes = write_log()
    enabled = {entry["path"].split("/")[3]: entry["value"] for entry in writes
               if entry["path"].endswith("/sriov_numvfs") and entry.get("result") == "ok"}
    for address, count in sorted(enabled.items()):
        print("SR-IOV  %s: %s VFs enabled" % (address, count))
    for gpu in facts["gpus"]:
        created = [vgpu for vgpu in gpu.get("vgpus", []) if vgpu.get("after") != vgpu.get("before")]
        if created:
            before, after = profile_counts(created, "before"), profile_counts(created, "after")
            print("vGPU    %s: %s -> %s" % (gpu["address"], before, after))
    kinds = Counter(write_kind(entry) for entry in writes)
    failed = sum(1 for entry in writes if entry.get("result") != "ok")
    print("%d sysfs writes (%s)%s" % (len(writes), ", ".join("%s %d" % item for item in sorted(kinds.items())),
                                      ", %d refused" % failed if failed else ""))
    print("Tasks that reported a change:")
    for task, hosts in changed.items():
        print("  %s [%s]" % (task, ", ".join(sorted(set(hosts)))))
    if not changed:
        print("  none (the node already had this layout)")


def print_persistence():
    section("Boot persistence (installed below %s, not on this machine)" % rel(NODE_ROOT))
    unit = read(NODE_ROOT, "etc", "systemd", "system", "accelops-vgpu.service") or ""
    exec_start = [line[len("ExecStart="):] for line in unit.splitlines() if line.startswith("ExecStart=")]
    print("accelops-vgpu.service re-applies the layout at boot and when the vGPU manager restarts:")
    print("  " + (exec_start[0] if exec_start else "(not installed)"))
    return exec_start[0] if exec_start else None


def print_next_steps(keep, exec_start):
    section("Look further")
    cli = rel(os.path.join(NODE_ROOT, "usr", "local", "bin", "accelops-vgpu"))
    layout = rel(os.path.join(NODE_ROOT, "etc", "accelops-vgpu", "layout.json"))
    if not keep:
        print("The simulated node has been torn down. Keep it for a look around: tools/demo.sh --keep")
        print("The layout file the node got: %s" % layout)
        return
    print("The simulated node is still up (--keep):")
    print("  ls %s/bus/pci/devices/" % rel(SYS))
    print("  cat %s/bus/pci/devices/0000:41:00.4/nvidia/current_vgpu_type   # a VF's vGPU type ID" % rel(SYS))
    print("  .venv/bin/gpusim log %s                                     # every sysfs write" % rel(SYS))
    if exec_start:
        check = exec_start.replace(" apply ", " assert ", 1).replace("/usr/local/bin/accelops-vgpu", cli, 1)
        print("  " + check.replace("/etc/accelops-vgpu/layout.json", layout) + "   # node CLI: layout in place?")
    print("  .venv/bin/gpusim ctl %s reboot   # then the assert above fails; the ExecStart line restores it"
          % rel(SYS))
    print("Tear down: tools/demo.sh --down")


def summarize(gpus, rc, changed, facts, api_url, elapsed):
    print("\n" + "=" * 78)
    print("accelops.vgpu demo: playbooks/site.yml %s in %.0f s on a simulated node (%s)"
          % ("succeeded" if rc == 0 else "FAILED (rc %d)" % rc, elapsed, gpus))
    print("=" * 78)
    print_gpus(facts)
    print_resources(facts, api_url)
    print_changes(facts, changed)
    return print_persistence()


# ---------------------------------------------------------------- conformance (KAR-0003 / KAR-0004)

VMI_CONTROLLER = os.path.join(REPO, "tests", "fakes", "vmi_controller.py")


def run_conformance(env, api_url):
    """playbooks/conformance.yml against the emulator. demo-node's status.allocatable comes from the agent's
    device plugin through the test kubelet; the fake KubeVirt controller schedules the test VMIs by it."""
    shutil.rmtree(os.path.join(DEMO, "conformance"), ignore_errors=True)
    controller = subprocess.Popen([sys.executable, VMI_CONTROLLER, "--api", api_url], stdout=subprocess.DEVNULL)
    argv = [os.path.join(VENV_BIN, "ansible-playbook"), "-i", "inventories/demo", "playbooks/conformance.yml"]
    try:
        proc = subprocess.run(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              check=False)
    finally:
        controller.terminate()
        controller.wait()
    section("Conformance report of the demo cluster (KAR-0003 / KAR-0004)")
    print("Against the Kubernetes API emulator %s and the fake KubeVirt controller %s, not a real cluster:"
          % (rel(KMOCK), rel(VMI_CONTROLLER)))
    print("demo-node's allocatable vGPUs come from the node agent's device plugin through the test kubelet %s, "
          "the DRA rows' claims are allocated from its ResourceSlices; the VMIs never boot." % rel(KUBELET))
    print("$ ansible-playbook " + " ".join(argv[1:]) + "   (rc %d)\n" % proc.returncode)
    report = read(DEMO, "conformance", "vgpu-conformance.md")
    if report is None:
        print(proc.stdout[-3000:])
        return proc.returncode or 1
    print(report)
    print("\nFiles: %s/vgpu-conformance.{json,md,junit.xml}" % rel(os.path.join(DEMO, "conformance")))
    return proc.returncode


# ---------------------------------------------------------------- GitOps: the node agent

AGENT_LAYOUT = "demo-l40s-8q"
STATE_LABEL = "nvidia.com/vgpu.config.state"


def node_labels(api_url):
    return ((api_get(api_url, "/api/v1/nodes/demo-node") or {}).get("metadata") or {}).get("labels") or {}


def agent_status():
    try:
        return json.loads(read(DEMO, "agent-status.json") or "null") or {}
    except ValueError:
        return {}


def wait_for(predicate, timeout, on_poll=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if on_poll:
            on_poll()
        if predicate():
            return True
        time.sleep(0.05)
    return False


KUBELET = os.path.join(REPO, "tests", "fakes", "kubelet_double.py")


class Kubelet:
    """The test kubelet as a process: kubelet.sock in a short temporary kubelet directory (socket paths are at
    most 107 bytes), demo-node's status.capacity/allocatable written into the emulator."""

    def __init__(self, api_url):
        self.root = tempfile.mkdtemp(prefix="accelops-demo-kubelet.", dir="/tmp")
        self.proc = subprocess.Popen([sys.executable, KUBELET, "--root", self.root, "--api", api_url,
                                      "--node", "demo-node", "--grace", "5"], stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline().split()
        self.url = "http://127.0.0.1:%s" % line[1] if line[:1] == ["ready"] else None

    def devices(self):
        try:
            with urllib.request.urlopen(self.url + "/devices", timeout=10) as resp:
                return json.load(resp)
        except (OSError, ValueError, TypeError):
            return {}

    def stop(self):
        self.proc.terminate()
        self.proc.wait()
        shutil.rmtree(self.root, ignore_errors=True)


def node_allocatable(api_url):
    return ((api_get(api_url, "/api/v1/nodes/demo-node") or {}).get("status") or {}).get("allocatable") or {}


def print_served(kubelet, api_url):
    for resource, devices in sorted(kubelet.devices().items()):
        health = Counter(d["health"] for d in devices)
        shown = ", ".join(d["id"] for d in devices[:4]) + (" +%d more" % (len(devices) - 4) if len(devices) > 4 else "")
        print("  %-30s %s   (%s)" % (resource, shown, ", ".join("%d %s" % (n, h) for h, n in sorted(health.items()))))
    print("demo-node status.allocatable (written by the test kubelet): %s" % (", ".join(
        "%s=%s" % item for item in sorted(node_allocatable(api_url).items())) or "none"))


AGENT_ENDPOINT = {}  # "port": the agent's /metrics port on loopback, once started


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def agent_metrics(prefixes):
    """The agent's /metrics samples whose names start with one of `prefixes`, non-zero ones."""
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % AGENT_ENDPOINT["port"], timeout=5) as response:
            text = response.read().decode()
    except (OSError, KeyError) as exc:
        return ["(no /metrics: %s)" % exc]
    return [line for line in text.splitlines() if line.startswith(prefixes) and not line.endswith(" 0")]


def gpu_split(facts):
    """(device plugin GPUs, DRA GPUs): of each GPU model (PCI ID) the first half of its GPUs goes to the device
    plugin, the rest to the DRA driver, so both show every profile and no vGPU is offered twice."""
    models = {}
    for gpu in facts["gpus"]:
        models.setdefault(gpu.get("pci_id"), []).append(gpu["address"])
    plugin, dra = [], []
    for dummy, addresses in sorted(models.items()):
        addresses = sorted(addresses)
        half = (len(addresses) + 1) // 2
        plugin, dra = plugin + addresses[:half], dra + addresses[half:]
    return plugin, dra


def served_profiles(facts, gpus):
    """{profile: vGPUs} the playbook left on `gpus` of demo-node (its vgpu_profiles facts)."""
    return dict(Counter(vgpu["after"] for gpu in facts["gpus"] if gpu["address"] in gpus
                        for vgpu in gpu.get("vgpus", []) if vgpu.get("after")))


def start_agent(env, kubelet, split):
    """`accelops-vgpu agent`, the agent CLI the agent image carries (tools/build-node-cli.py; the node CLI the
    vgpu_profiles role installs has no agent), as the DaemonSet would run it, with the simulated node's roots
    instead of /host and the emulator's kubeconfig instead of a service account; its device plugin registers with
    the test kubelet, its /metrics listens on a free loopback port; `split`: the GPUs of the device plugin and of
    the DRA driver."""
    cli = os.path.join(DEMO, "accelops-vgpu-agent.pyz")
    subprocess.run([sys.executable, os.path.join(REPO, "tools", "build-node-cli.py"), cli], check=True,
                   stdout=subprocess.DEVNULL)
    AGENT_ENDPOINT["port"] = free_port()
    agent_env = dict(env, NODE_NAME="demo-node", NAMESPACE="default", KUBECONFIG=KUBECONFIG,
                     DEVICE_PLUGIN="true", KUBELET_DIR=kubelet.root, DRA_DRIVER="true" if split[1] else "false",
                     CDI_DIR=CDI_DIR,
                     DEVICE_PLUGIN_GPUS=",".join(split[0]), DRA_DRIVER_GPUS=",".join(split[1]),
                     CONFIG_FILE=os.path.join(NODE_ROOT, "etc", "accelops-vgpu", "layout.json"),
                     DEFAULT_VGPU_CONFIG="demo", ACCELOPS_VGPU_SYSFS_ROOT=SYS,
                     ACCELOPS_VGPU_DEV_ROOT=os.path.join(SYS, ".gpusim", "dev"), ACCELOPS_VGPU_PROC_ROOT="/proc",
                     STATUS_FILE=os.path.join(DEMO, "agent-status.json"),
                     METRICS_PORT=str(AGENT_ENDPOINT["port"]), METRICS_BIND_ADDRESS="127.0.0.1")
    if os.path.exists(agent_env["STATUS_FILE"]):
        os.remove(agent_env["STATUS_FILE"])
    log = open(os.path.join(DEMO, "agent.log"), "w", encoding="utf-8")  # noqa: SIM115 (the agent's stderr)
    proc = subprocess.Popen([sys.executable, cli, "agent"], env=agent_env, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    return proc, cli


def relabel(api_url, layout):
    """What `kubectl label node demo-node nvidia.com/vgpu.config=<layout> --overwrite` sends."""
    request = urllib.request.Request(api_url + "/api/v1/nodes/demo-node", method="PATCH",
                                     data=json.dumps({"metadata": {"labels": {"nvidia.com/vgpu.config": layout}}}).encode(),
                                     headers={"Content-Type": "application/merge-patch+json"})
    with urllib.request.urlopen(request, timeout=10):
        pass


def vf_parents():
    """{VF address: PF address} of the simulated node."""
    devices = os.path.join(SYS, "bus", "pci", "devices")
    parents = {}
    for address in os.listdir(devices):
        link = os.path.join(devices, address, "physfn")
        if os.path.islink(link):
            parents[address] = os.path.basename(os.readlink(link))
    return parents


def start_serving(env, api_url, facts):
    """The test kubelet, then the agent with its device plugin and DRA driver; (agent, kubelet, rc) once the
    kubelet reports the vGPUs the playbook created and the ResourceSlices publish them."""
    section("The node agent serves the kubelet (device plugin API v1beta1, one resource per profile; DRA driver)")
    kubelet = Kubelet(api_url)
    if kubelet.url is None:
        print("the test kubelet did not start")
        kubelet.stop()
        return None, None, 1
    split = gpu_split(facts)
    agent, cli = start_agent(env, kubelet, split)
    try:
        return agent, kubelet, wait_served(api_url, facts, agent, kubelet, cli, split)
    except BaseException:   # an error or Ctrl-C: no agent or kubelet outlives the demo
        stop_serving(agent, kubelet)
        raise


def wait_served(api_url, facts, agent, kubelet, cli, split):
    """0 once the kubelet reports the playbook's vGPUs of the device plugin's GPUs and the DRA driver publishes
    those of its own, else 1."""
    print("$ %s --root %s --api %s --node demo-node   (the test kubelet)" % (rel(KUBELET), kubelet.root, api_url))
    print("$ NODE_NAME=demo-node CONFIG_FILE=%s DEFAULT_VGPU_CONFIG=demo DEVICE_PLUGIN=true DRA_DRIVER=true "
          "DEVICE_PLUGIN_GPUS=%s DRA_DRIVER_GPUS=%s KUBELET_DIR=%s CDI_DIR=%s %s agent"
          "   (pid %d; log %s)" % (rel(os.path.join(NODE_ROOT, "etc", "accelops-vgpu", "layout.json")),
                                   ",".join(split[0]), ",".join(split[1]), kubelet.root, rel(CDI_DIR), rel(cli),
                                   agent.pid, rel(os.path.join(DEMO, "agent.log"))))
    print("Each GPU is served one way only (both ways would offer every vGPU twice): the device plugin serves %s, "
          "the DRA driver %s" % (", ".join(split[0]), ", ".join(split[1])))
    resource_of = dict((r["profile"], r["resource_name"]) for r in facts["resources"])
    wanted = dict((resource_of[p], str(n)) for p, n in served_profiles(facts, split[0]).items())
    if not wait_for(lambda: (node_allocatable(api_url) == wanted and agent_status().get("config"))
                    or agent.poll() is not None, 60):
        print("the kubelet did not report %s within 60 s (it has %s); see %s" % (
            wanted, node_allocatable(api_url), rel(os.path.join(DEMO, "agent.log"))))
        return 1
    first = agent_status()
    print("started: no nvidia.com/vgpu.config label -> DEFAULT_VGPU_CONFIG %r, already in place -> %s=%s"
          % (first.get("config"), STATE_LABEL, node_labels(api_url).get(STATE_LABEL)))
    print("The kubelet's devices, from the agent's ListAndWatch streams (IDs: VF addresses, mdev UUIDs):")
    print_served(kubelet, api_url)
    if not split[1]:
        print("No GPU model has a second GPU for the DRA driver (--gpus): DRA stays off")
        return 0
    return wait_published(api_url, served_profiles(facts, split[1]), kubelet)


def wait_published(api_url, wanted, kubelet):
    """The chart's DeviceClasses created, then 0 once the DRA driver is registered with the kubelet and its
    ResourceSlices publish the playbook's vGPUs of its GPUs (`wanted`: {profile: count}), else 1."""
    classes = create_device_classes(api_url)
    if not wait_for(lambda: dra_profiles(api_url) == wanted and dra_registered(kubelet), 30):
        print("the DRA driver %s did not publish the vGPUs of its GPUs %s within 30 s (ResourceSlices: %s); see %s" % (
            DRA_DRIVER, wanted, dra_profiles(api_url), rel(os.path.join(DEMO, "agent.log"))))
        return 1
    print("The other GPUs' vGPUs through DRA (the agent is also the DRA driver %s, registered with the test kubelet):"
          % DRA_DRIVER)
    print("  DeviceClasses (the chart's templates/deviceclasses.yaml, what vgpu_node_agent_dra creates): %s"
          % ", ".join(classes))
    print_dra(api_url)
    return 0


DRA_DRIVER = "vgpu.accelops.io"
CHART = os.path.join(REPO, "charts", "accelops-vgpu-node-agent")
DRA_API = "/apis/resource.k8s.io/v1/"


def create_device_classes(api_url):
    """The chart's DeviceClasses (dra.enabled), rendered by helm and created in the emulator, as
    `helm template ... | kubectl create -f -` would: the objects the vgpu_node_agent role applies with
    vgpu_node_agent_dra. The demo runs the agent as a process, not as the chart's DaemonSet, so only these
    objects of the chart are created. Returns their names."""
    layout = os.path.join(NODE_ROOT, "etc", "accelops-vgpu", "layout.json")
    with tempfile.NamedTemporaryFile("w", suffix=".json", dir=DEMO, encoding="utf-8") as values:
        with open(layout, encoding="utf-8") as handle:
            json.dump({"vdmConfig": json.load(handle), "defaultConfig": "demo", "dra": {"enabled": True}}, values)
        values.flush()
        rendered = subprocess.run([os.path.join(VENV_BIN, "helm"), "template", "accelops-vgpu-node-agent", CHART,
                                   "-f", values.name, "--show-only", "templates/deviceclasses.yaml"],
                                  stdout=subprocess.PIPE, text=True, check=True).stdout
    names = []
    for body in yaml.safe_load_all(rendered):
        if body:
            request = urllib.request.Request(api_url + DRA_API + "deviceclasses", data=json.dumps(body).encode(),
                                             headers={"Content-Type": "application/json"}, method="POST")
            with urllib.request.urlopen(request, timeout=10):
                names.append(body["metadata"]["name"])
    return names


def dra_devices(api_url):
    """The devices of demo-node's ResourceSlices of the driver, as the emulator holds them (every slice of the
    pool's newest generation)."""
    items = [item for item in (api_get(api_url, DRA_API + "resourceslices") or {}).get("items") or []
             if (item.get("spec") or {}).get("driver") == DRA_DRIVER
             and item["spec"].get("nodeName") == "demo-node"]
    newest = max([int(item["spec"]["pool"].get("generation") or 0) for item in items] or [0])
    return [device for item in items if int(item["spec"]["pool"].get("generation") or 0) == newest
            for device in item["spec"].get("devices") or []], len(items)


def dra_attribute(device, name):
    """A device attribute's value (an unqualified name is in the driver's domain, resource.k8s.io/v1)."""
    attributes = device.get("attributes") or {}
    value = attributes.get(name) or attributes.get("%s/%s" % (DRA_DRIVER, name)) or {}
    return next(iter(value.values()), "?")


def dra_profiles(api_url):
    """{profile: devices} demo-node's ResourceSlices publish."""
    return dict(Counter(dra_attribute(device, "profile") for device in dra_devices(api_url)[0]))


def dra_registered(kubelet):
    try:
        with urllib.request.urlopen(kubelet.url + "/registrations", timeout=10) as resp:
            registrations = json.load(resp)
    except (OSError, ValueError, TypeError):
        return False
    return any(r["type"] == "DRAPlugin" and r["name"] == DRA_DRIVER and r["registered"] for r in registrations.values())


def print_dra(api_url):
    devices, count = dra_devices(api_url)
    frameworks = Counter(dra_attribute(device, "framework") for device in devices)
    print("  ResourceSlices of demo-node: %d, devices per profile: %s   (%s)" % (
        count, ", ".join("%d x %s" % (n, p) for p, n in sorted(dra_profiles(api_url).items())) or "none",
        ", ".join("%d %s" % (n, name) for name, n in sorted(frameworks.items()))))


def stop_serving(agent, kubelet):
    if agent is not None:
        agent.terminate()
        try:
            agent.wait(20)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait()
    if kubelet is not None:
        kubelet.stop()


def vgpus_on(gpus):
    """How many vGPUs the simulated sysfs shows on `gpus`: typed VFs (current_vgpu_type) and mdevs."""
    devices = os.path.join(SYS, "bus", "pci", "devices")
    parents = vf_parents()
    count = sum(1 for vf, pf in parents.items() if pf in gpus and read(devices, vf, "nvidia", "current_vgpu_type")
                not in (None, "", "0"))
    mdevs = os.path.join(SYS, "bus", "mdev", "devices")
    for uuid in os.listdir(mdevs) if os.path.isdir(mdevs) else ():
        parent = os.path.basename(os.path.dirname(os.path.realpath(os.path.join(mdevs, uuid))))
        count += parents.get(parent, parent) in gpus
    return count


def run_gitops(api_url, kubelet, split):
    """Relabel demo-node in the emulator; the node agent, a real process, converges the simulated node and its
    device plugin follows: the kubelet's resources change with it."""
    section("GitOps: the node agent (accelops-vgpu agent, a real process, against the API emulator)")
    before, dra_before = dict(node_allocatable(api_url)), dra_profiles(api_url)
    log_start = len(write_log())
    print("$ kubectl label node demo-node nvidia.com/vgpu.config=%s --overwrite   (the same merge patch)" % AGENT_LAYOUT)
    states = []

    def record():
        state = node_labels(api_url).get(STATE_LABEL)
        if not states or states[-1] != state:
            states.append(state)
    started = time.monotonic()
    relabel(api_url, AGENT_LAYOUT)
    done = wait_for(lambda: agent_status().get("config") == AGENT_LAYOUT
                    and node_labels(api_url).get(STATE_LABEL) in ("success", "failed"), 120, record)
    record()
    elapsed = time.monotonic() - started
    labels = node_labels(api_url)
    print("%s: %s   (%.1f s from the relabel)" % (STATE_LABEL, " -> ".join(map(str, states)), elapsed))
    if not done or labels.get(STATE_LABEL) != "success":
        annotations = ((api_get(api_url, "/api/v1/nodes/demo-node") or {}).get("metadata") or {}).get("annotations")
        print("not converged: %s" % (annotations or {}).get("accelops.io/vgpu.config.reason"))
        return 1
    print("Node demo-node labels now:  %s" % ", ".join(
        "%s=%s" % item for item in sorted(labels.items())
        if item[0].startswith(("nvidia.com/vgpu.config", "accelops.io/vgpu.profile."))))
    writes = write_log()[log_start:]
    parents, per_gpu = vf_parents(), Counter()
    for entry in writes:
        address = entry["path"].split("/")[3] if entry["path"].startswith("bus/pci/devices/") else "?"
        per_gpu[parents.get(address, address)] += 1
    print("sysfs writes of the change: %d, per GPU: %s" % (len(writes), ", ".join(
        "%s %d" % item for item in sorted(per_gpu.items())) or "none"))
    untouched = sorted(set(vf_counts()) - set(per_gpu))
    print("GPUs the change did not touch (their vGPUs kept, no clear-all): %s" % (", ".join(untouched) or "none"))
    events = (api_get(api_url, "/api/v1/namespaces/default/events") or {}).get("items") or []
    for event in events[-2:]:
        print("Event %s %s: %s" % (event.get("type"), event.get("reason"), event.get("message")))
    print("$ curl -s 127.0.0.1:%d/metrics | grep -E 'agent_(vgpus|applies_total|config_state)'   "
          "(what a dashboard graphs; README \"Metrics and probes\")" % AGENT_ENDPOINT.get("port", 0))
    for line in agent_metrics(("accelops_vgpu_agent_vgpus", "accelops_vgpu_agent_applies_total",
                               "accelops_vgpu_agent_config_state")):
        print("  " + line)

    def followed():  # every device healthy, the resources gone from the node gone from status.allocatable too
        served = kubelet.devices()
        return (all(d["health"] == "Healthy" for devs in served.values() for d in devs)
                and node_allocatable(api_url) == dict((r, str(len(d))) for r, d in served.items()) != before)
    if not wait_for(followed, 30):
        print("the kubelet's resources did not follow the relabel within 30 s")
        print_served(kubelet, api_url)
        return 1
    print("The kubelet's devices after the relabel, without a playbook run (KubeVirt permits new profiles with "
          "kubevirt_vgpu_provider: agent; README, \"Scheduling vGPUs\"):")
    print_served(kubelet, api_url)
    print("status.allocatable before the relabel: %s" % ", ".join("%s=%s" % i for i in sorted(before.items())))

    def slices_followed():
        now = dra_profiles(api_url)
        return now != dra_before and sum(now.values()) == vgpus_on(split[1])
    if split[1] and not wait_for(slices_followed, 30):
        print("the DRA driver's ResourceSlices did not follow the relabel within 30 s")
        print_dra(api_url)
        return 1
    if split[1]:
        print("The DRA driver's ResourceSlices followed too:")
        print_dra(api_url)
    return 0


def run_claim_time(env):
    """The claim-time scene (tools/demo_claim_time.py) on a second simulated node of two L40S: two VMs with different
    profiles land on its two GPUs, chosen by their claims, without a relabel. Returns its exit status."""
    section("Profiles chosen at claim time: two VMs, two profiles, one node's two GPUs, no relabel (README)")
    return run_scene(env, "demo_claim_time.py", CLAIM_TIME_SYS, CLAIM_TIME_WORK, CLAIM_TIME_NODE, "l40s:2")


def run_whole_gpu(env):
    """The whole-GPU scene (tools/demo_whole_gpu.py) on a node of one L40S: given whole to one VM, then as vGPUs to
    two others once it is deleted (one counter). Returns its exit status."""
    section("The whole GPU or vGPUs: one VM gets the GPU whole, then two VMs get vGPUs of it (README)")
    return run_scene(env, "demo_whole_gpu.py", WHOLE_SYS, WHOLE_WORK, WHOLE_NODE, "l40s:1")


def run_scene(env, script, root, work, node, spec):
    """A scene script of tools/ on its own simulated node (gpusim `spec` at `root`); its exit status."""
    os.makedirs(root, exist_ok=True)
    os.makedirs(work, exist_ok=True)
    gpusim("up", root, "--gpus", spec)
    scene_env = dict(env, GPUSIM_ROOT=root, PYTHONPATH=os.path.join(REPO, ".build", "collections"))
    argv = [sys.executable, os.path.join(REPO, "tools", script), "--api", api_server_url(),
            "--kubeconfig", KUBECONFIG, "--sys", root, "--work", work, "--node", node]
    print("$ %s   (gpusim %s: %s)" % (" ".join(rel(a) if a.startswith(REPO) else a for a in argv[1:]), rel(root), spec),
          flush=True)
    return subprocess.run(argv, cwd=REPO, env=scene_env, check=False).returncode


def run_claim_time_mig(env):
    """The MIG-backed claim-time scene (tools/demo_claim_time_mig.py) on a third simulated node, one H100 in MIG mode:
    three claims get GPU instances placed at prepare (3g, 2g, 1g), a fourth finds no room. Returns its exit status."""
    section("MIG-backed vGPUs placed at claim time: GPU instances created at prepare (README)")
    os.makedirs(MIG_SYS, exist_ok=True)
    os.makedirs(MIG_WORK, exist_ok=True)
    gpusim("up", MIG_SYS, "--gpus", "h100-pcie:1")
    scene_env = dict(env, GPUSIM_ROOT=MIG_SYS, PYTHONPATH=os.path.join(REPO, ".build", "collections"))
    argv = [sys.executable, os.path.join(REPO, "tools", "demo_claim_time_mig.py"), "--sys", MIG_SYS, "--work", MIG_WORK]
    shown = " ".join(rel(a) if a.startswith(REPO) else a for a in argv[1:])
    print("$ %s   (gpusim %s: h100-pcie:1)" % (shown, rel(MIG_SYS)), flush=True)
    return subprocess.run(argv, cwd=REPO, env=scene_env, check=False).returncode


def api_server_url():
    with open(KUBECONFIG, encoding="utf-8") as handle:
        return json.load(handle)["clusters"][0]["cluster"]["server"]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", default=DEFAULT_GPUS, help="gpusim SPEC of the node (default %(default)s)")
    parser.add_argument("--keep", action="store_true", help="leave the simulated node (and API server) running")
    parser.add_argument("--down", action="store_true", help="tear down what a --keep run left, then exit")
    args = parser.parse_args(argv)
    os.makedirs(DEMO, exist_ok=True)
    if args.down:
        down()
        print("demo: torn down")
        return 0
    start = time.monotonic()
    try:
        up(args.gpus)
        api_url = start_api_server(DEMO, "demo-node") if os.path.exists(KMOCK) else None
        env = ansible_env()
        rc, changed = run_playbook(env, with_cluster=api_url is not None)
        facts = node_facts(env)
        exec_start = summarize(args.gpus, rc, changed, facts, api_url, time.monotonic() - start)
        print_next_steps(args.keep, exec_start)
        agent = kubelet = None
        try:
            if api_url and rc == 0:
                agent, kubelet, rc = start_serving(env, api_url, facts)
            if api_url and rc == 0:
                rc = run_conformance(env, api_url)
            if api_url and rc == 0:
                rc = run_gitops(api_url, kubelet, gpu_split(facts))
            if api_url and rc == 0:
                rc = run_claim_time(env)
            if api_url and rc == 0:
                rc = run_claim_time_mig(env)
            if api_url and rc == 0:
                rc = run_whole_gpu(env)
        finally:
            stop_serving(agent, kubelet)
    finally:
        if not args.keep:
            down()
    return rc


if __name__ == "__main__":
    sys.exit(main())
