"""A small fake KubeVirt controller + scheduler for the conformance tests and the demo.

    python tests/fakes/vmi_controller.py --api http://127.0.0.1:PORT [--never-ready NAME] [--no-block]

It talks HTTP to the Kubernetes API server double (tests/fakes/kmock_serve.py) like a controller
would, polling every --interval seconds:
- a new VMI becomes Pending; a Pending VMI is placed on the first node (by name) that matches its
  nodeSelector and still has `status.allocatable` room for every resource its
  `spec.domain.devices.gpus[]/hostDevices[].deviceName` request (counting the VMIs already placed);
  without room it stays Pending with the condition KubeVirt mirrors from an unschedulable launcher
  pod (PodScheduled=False, reason Unschedulable, "0/N nodes are available: ... Insufficient <res>");
- a placed VMI goes Scheduling -> Scheduled -> Running -> Ready (one step per poll);
- `never_ready` VMIs reach Running but never Ready (a broken guest);
- `block_overallocation=False` is a broken scheduler: a VMI without room is placed anyway.
It never creates or deletes anything: it only PATCHes the status of VMIs it sees.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import urllib.error
import urllib.request
from collections import Counter

VMIS = "/apis/kubevirt.io/v1/virtualmachineinstances"
NODES = "/api/v1/nodes"
NEXT = {"Scheduling": "Scheduled", "Scheduled": "Running"}


def _int(value):
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return 0


def requests_of(vmi):
    devices = ((vmi.get("spec") or {}).get("domain") or {}).get("devices") or {}
    return Counter(d.get("deviceName") for d in (devices.get("gpus") or []) + (devices.get("hostDevices") or [])
                   if d.get("deviceName"))


def selects(vmi, node):
    labels = (node.get("metadata") or {}).get("labels") or {}
    wanted = (vmi.get("spec") or {}).get("nodeSelector") or {}
    return all(labels.get(key) == value for key, value in wanted.items())


class VmiController(threading.Thread):
    """Run as a thread (tests) or through main() as a process (demo)."""

    def __init__(self, api_url, never_ready=(), block_overallocation=True, interval=0.05):
        super().__init__(daemon=True)
        self.api_url, self.interval = api_url.rstrip("/"), interval
        self.never_ready, self.block = set(never_ready), block_overallocation
        self.stopped = threading.Event()
        self.errors = []

    def _request(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/merge-patch+json"} if data else {}
        req = urllib.request.Request(self.api_url + path, data=data, method=method, headers=headers)
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.load(resp)

    def _patch_status(self, vmi, status):
        meta = vmi["metadata"]
        path = "/apis/kubevirt.io/v1/namespaces/%s/virtualmachineinstances/%s" % (meta["namespace"], meta["name"])
        try:
            self._request("PATCH", path, {"status": status})
        except urllib.error.HTTPError as exc:
            if exc.code != 404:   # deleted meanwhile
                raise

    def step(self):
        """One reconcile pass over every VMI."""
        nodes = sorted(self._request("GET", NODES).get("items") or [], key=lambda n: n["metadata"]["name"])
        try:
            vmis = self._request("GET", VMIS).get("items") or []
        except urllib.error.HTTPError as exc:
            if exc.code == 404:   # no VMI resource known yet
                return
            raise
        used = Counter()
        for vmi in vmis:
            placed = (vmi.get("status") or {}).get("nodeName")
            if placed:
                for res, count in requests_of(vmi).items():
                    used[placed, res] += count
        for vmi in vmis:
            if (vmi.get("metadata") or {}).get("deletionTimestamp"):
                continue
            status = vmi.get("status") or {}
            phase = status.get("phase")
            if not phase:
                self._patch_status(vmi, {"phase": "Pending"})
            elif phase == "Pending":
                self._schedule(vmi, nodes, used)
            elif phase in NEXT:
                self._patch_status(vmi, {"phase": NEXT[phase]})
            elif phase == "Running" and not any(c.get("type") == "Ready" for c in status.get("conditions") or []):
                ready = vmi["metadata"]["name"] not in self.never_ready
                self._patch_status(vmi, {"conditions": [{"type": "Ready", "status": "True" if ready else "False",
                                                         "reason": "" if ready else "GuestNotReady"}]})

    def _schedule(self, vmi, nodes, used):
        wanted = requests_of(vmi)
        candidates = [n for n in nodes if selects(vmi, n)]

        def room(node):
            alloc = (node.get("status") or {}).get("allocatable") or {}
            name = node["metadata"]["name"]
            return all(used[name, res] + count <= _int(alloc.get(res)) for res, count in wanted.items())

        fitting = [n for n in candidates if room(n)]
        if not fitting and not self.block:
            fitting = candidates   # the broken scheduler: over-allocates
        if fitting:
            name = fitting[0]["metadata"]["name"]
            for res, count in wanted.items():
                used[name, res] += count
            self._patch_status(vmi, {"phase": "Scheduling", "nodeName": name, "conditions": []})
            return
        short = sorted(res for res, count in wanted.items()
                       if all(used[n["metadata"]["name"], res] + count > _int(
                           ((n.get("status") or {}).get("allocatable") or {}).get(res)) for n in candidates))
        message = "0/%d nodes are available: %s" % (len(nodes), ", ".join(
            ["%d node(s) didn't match Pod's node affinity/selector" % (len(nodes) - len(candidates))]
            * (len(candidates) < len(nodes)) + ["%d Insufficient %s" % (len(candidates), res) for res in short]))
        conditions = (vmi.get("status") or {}).get("conditions") or []
        if not any(c.get("reason") == "Unschedulable" for c in conditions):
            self._patch_status(vmi, {"conditions": [{"type": "PodScheduled", "status": "False",
                                                     "reason": "Unschedulable", "message": message}]})

    def run(self):
        while not self.stopped.is_set():
            try:
                self.step()
            except (OSError, ValueError) as exc:   # keep going: the API server may be restarting
                self.errors.append(str(exc))
            self.stopped.wait(self.interval)

    def stop(self):
        self.stopped.set()
        self.join(timeout=10)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--api", required=True, help="URL of the API server double")
    parser.add_argument("--never-ready", action="append", default=[], help="VMI name that never becomes Ready")
    parser.add_argument("--no-block", action="store_true", help="do not block over-allocation (a broken scheduler)")
    parser.add_argument("--interval", type=float, default=0.2, help="seconds between passes (default %(default)s)")
    args = parser.parse_args(argv)
    controller = VmiController(args.api, args.never_ready, not args.no_block, args.interval)
    print("ready", flush=True)
    try:
        controller.run()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
