#!/usr/bin/env python3
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""make demo: run playbooks/site.yml against a simulated GPU node and say what it did.

1. mounts a gpusim tree (a simulated /sys with NVIDIA GPUs) at .build/demo/sys and puts the fake
   sriov-manage / nvidia-smi on PATH;
2. starts the Kubernetes API emulator (tests/fakes/kmock_serve.py) with a KubeVirt CR, if present;
3. runs `ansible-playbook -i inventories/demo playbooks/site.yml`, streaming its output;
4. prints a summary (GPUs, VFs, vGPUs, KubeVirt resources, what changed, how to look further);
5. tears everything down, unless --keep (then `tools/demo.py --down` does it later).
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
import time
import urllib.request
from collections import Counter

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV_BIN = os.path.join(REPO, ".venv", "bin")
DEMO = os.path.join(REPO, ".build", "demo")
SYS = os.path.join(DEMO, "sys")
TOOLS = os.path.join(DEMO, "bin")
FACTS = os.path.join(DEMO, "facts")
KUBECONFIG = os.path.join(DEMO, "kubeconfig")
API_PID = os.path.join(DEMO, "kmock.pid")
KMOCK = os.path.join(REPO, "tests", "fakes", "kmock_serve.py")
NODE_ROOT = os.path.join(DEMO, "node-root")
DEFAULT_GPUS = "l40s:2,a16:1,t4:1"
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

def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_api_server():
    """The API emulator on a free port; returns its URL once it printed "ready"."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, KMOCK, str(port)], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    with open(API_PID, "w", encoding="utf-8") as handle:
        handle.write(str(proc.pid))
    line = proc.stdout.readline()
    if "ready" not in line:
        raise SystemExit("demo: the API server did not start (%s printed %r)" % (rel(KMOCK), line))
    url = "http://127.0.0.1:%d" % port
    with open(KUBECONFIG, "w", encoding="utf-8") as handle:
        json.dump({"apiVersion": "v1", "kind": "Config", "current-context": "demo",
                   "clusters": [{"name": "demo", "cluster": {"server": url}}],
                   "users": [{"name": "demo", "user": {"token": "demo"}}],
                   "contexts": [{"name": "demo", "context": {"cluster": "demo", "user": "demo"}}]}, handle)
    return url


def stop_api_server():
    try:
        with open(API_PID, encoding="utf-8") as handle:
            pid = int(handle.read())
        os.killpg(pid, signal.SIGTERM)
    except (OSError, ValueError):
        pass
    for path in (API_PID, KUBECONFIG):
        if os.path.exists(path):
            os.remove(path)


def down():
    stop_api_server()
    if is_mounted(SYS):
        gpusim("down", SYS, check=False)


def up(gpus):
    down()
    for path in (FACTS, NODE_ROOT):
        shutil.rmtree(path, ignore_errors=True)
    os.makedirs(SYS, exist_ok=True)
    os.makedirs(TOOLS, exist_ok=True)
    gpusim("up", SYS, "--gpus", gpus)
    gpusim("tools", TOOLS)


# ---------------------------------------------------------------- the run

def run_playbook(with_cluster):
    """Runs site.yml with its output streaming through; returns (rc, {task: [hosts changed]})."""
    env = dict(os.environ)
    env.update({
        "PATH": TOOLS + os.pathsep + VENV_BIN + os.pathsep + env.get("PATH", ""),
        "GPUSIM_ROOT": SYS,
        "ANSIBLE_CONFIG": os.path.join(REPO, "ansible.cfg"),
        "ANSIBLE_COLLECTIONS_PATH": os.path.join(REPO, ".build", "collections"),
        "ANSIBLE_CACHE_PLUGIN": "ansible.builtin.jsonfile",
        "ANSIBLE_CACHE_PLUGIN_CONNECTION": FACTS,
        "ANSIBLE_FORCE_COLOR": "1" if sys.stdout.isatty() else "0",
        "K8S_AUTH_KUBECONFIG": KUBECONFIG,
    })
    argv = [os.path.join(VENV_BIN, "ansible-playbook"), "-i", "inventories/demo", "playbooks/site.yml", "--diff"]
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


def cached_facts(host):
    try:
        with open(os.path.join(FACTS, host), encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return {}


def write_log():
    """The simulator's log of sysfs writes: [{path, value, result, ...}]."""
    text = read(SYS, ".gpusim", "log") or ""
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def kubevirt_devices(api_url):
    try:
        with urllib.request.urlopen(api_url + KUBEVIRT_PATH, timeout=5) as response:
            kubevirt = json.load(response)
    except (OSError, ValueError):
        return None
    return kubevirt.get("spec", {}).get("configuration", {}).get("permittedHostDevices", {})


# ---------------------------------------------------------------- the summary

def section(title):
    print("\n" + title)
    print("-" * len(title))


def describe_write(entry):
    """'sriov_numvfs on 0000:41:00.0 := 32' from a log entry's canonical path."""
    parts = entry["path"].split("/")
    device = parts[3] if len(parts) > 3 else entry["path"]
    attribute = "/".join(parts[4:]) or parts[-1]
    if parts[:3] == ["bus", "mdev", "devices"]:
        attribute, device = "mdev " + attribute, device[:8] + "..."
    if "mdev_supported_types" in attribute:
        attribute = "create mdev " + attribute.split("/")[1]
    outcome = "" if entry.get("result") == "ok" else "  (%s)" % entry.get("errno", "failed")
    return "%-30s %-14s := %s%s" % (attribute, device, str(entry.get("value", "")).strip()[:36], outcome)


def summarize(gpus, rc, changed, api_url, elapsed):
    facts = cached_facts("demo-node")
    node_gpus = facts.get("vgpu_profiles_gpus") or []
    resources = facts.get("vgpu_profiles_resources") or []
    vfs = vf_counts()
    print("\n" + "=" * 78)
    print("accelops.vgpu demo: site.yml %s in %.0f s against a simulated node (%s)"
          % ("succeeded" if rc == 0 else "FAILED (rc %d)" % rc, elapsed, gpus))
    print("=" * 78)

    section("GPUs on demo-node")
    print("%-14s %-8s %-12s %-9s %s" % ("PCI address", "model", "framework", "VFs", "vGPUs (instances x profile)"))
    for gpu in node_gpus:
        numvfs, total = vfs.get(gpu["address"], (0, 0))
        profiles = Counter(vgpu["after"] for vgpu in gpu.get("vgpus", []) if vgpu.get("after"))
        print("%-14s %-8s %-12s %-9s %s" % (
            gpu["address"], gpu.get("model") or "?", gpu.get("framework", "?"),
            "%d/%d" % (numvfs, total) if total else "-",
            ", ".join("%d x %s" % (count, name) for name, count in sorted(profiles.items())) or "none"))
    if not node_gpus:
        print("(no vGPU facts: the vgpu_profiles role did not finish)")

    section("KubeVirt resources this node offers")
    for resource in resources:
        selector = resource.get("pci_vendor_selector") if resource.get("framework") == "vendor-vfio" \
            else resource.get("type_name")
        kind = "pciHostDevices  pciVendorSelector" if resource.get("framework") == "vendor-vfio" \
            else "mediatedDevices mdevNameSelector "
        print("%-34s %3d   %s %s" % (resource["resource_name"], resource["count"], kind, selector))
    permitted = kubevirt_devices(api_url) if api_url else None
    if permitted is not None:
        names = [entry.get("resourceName") for key in ("pciHostDevices", "mediatedDevices")
                 for entry in permitted.get(key) or []]
        print("KubeVirt CR (emulated API at %s): permittedHostDevices lists %s"
              % (api_url, ", ".join(names) or "nothing"))
    elif not api_url:
        print("(cluster part skipped: %s is not there yet)" % rel(KMOCK))

    section("What changed")
    writes = write_log()
    by_kind = Counter(describe_write(entry).split()[0] for entry in writes)
    print("%d writes to the simulated sysfs: %s" % (
        len(writes), ", ".join("%s x%d" % item for item in sorted(by_kind.items())) or "none"))
    for entry in writes[:12]:
        print("  " + describe_write(entry))
    if len(writes) > 12:
        print("  ... %d more: .venv/bin/gpusim log %s" % (len(writes) - 12, rel(SYS)))
    print("Tasks that changed something:")
    for task, hosts in changed.items():
        print("  %-60s %s" % (task[:60], ", ".join(sorted(set(hosts)))))
    if not changed:
        print("  none")

    section("Boot persistence (installed below %s, not on this machine)" % rel(NODE_ROOT))
    unit = read(NODE_ROOT, "etc", "systemd", "system", "accelops-vgpu.service") or ""
    exec_start = [line[len("ExecStart="):] for line in unit.splitlines() if line.startswith("ExecStart=")]
    print("accelops-vgpu.service runs at boot and after vGPU manager restarts:")
    print("  " + (exec_start[0] if exec_start else "(not installed)"))
    return exec_start[0] if exec_start else None


def next_steps(keep, exec_start):
    section("Look further")
    cli = os.path.join(NODE_ROOT, "usr", "local", "bin", "accelops-vgpu")
    layout = os.path.join(NODE_ROOT, "etc", "accelops-vgpu", "layout.json")
    if keep:
        print("The simulated node is still up (--keep):")
        print("  ls %s/bus/pci/devices/                  # the node's PCI functions" % rel(SYS))
        print("  cat %s/bus/pci/devices/0000:41:00.4/nvidia/current_vgpu_type" % rel(SYS))
        print("  .venv/bin/gpusim log %s                 # every sysfs write" % rel(SYS))
        if exec_start:
            print("  %s" % exec_start.replace("/usr/local/bin/accelops-vgpu", rel(cli), 1)
                  .replace("/etc/accelops-vgpu/layout.json", rel(layout)).replace(" apply ", " assert ", 1)
                  + "   # node CLI: is the layout in place?")
        print("  make demo ARGS=... / tools/demo.sh --keep   # run again: nothing changes the second time")
        print("Tear down: tools/demo.sh --down")
    else:
        print("Keep the simulated node for a look around: tools/demo.sh --keep (tear down: --down)")
        print("Layout written for the node: %s" % rel(layout))
        print("The simulated node has been torn down.")


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
        api_url = start_api_server() if os.path.exists(KMOCK) else None
        rc, changed = run_playbook(with_cluster=api_url is not None)
        exec_start = summarize(args.gpus, rc, changed, api_url, time.monotonic() - start)
        next_steps(args.keep, exec_start)
    finally:
        if not args.keep:
            down()
    return rc


if __name__ == "__main__":
    sys.exit(main())
