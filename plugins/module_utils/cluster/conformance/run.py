# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The I/O of a conformance run: read the cluster, create and watch the test VMIs, clean up.

Order (nothing is created before every input and precondition is checked):
1. inputs (timeouts, namespace name, runner) -> 2. reads: KubeVirt CR, Nodes, our namespace, DRA ->
3. vGPU resources (none: error) and the profile filter (unknown: error) -> 4. the namespace must be
absent or ours -> static checks -> (check mode: stop, list what would be created) -> per profile:
capacity VMIs, wait Running / Ready, guest command, one VMI more, observe it, delete them ->
cleanup in `finally`, also on errors and on SIGINT/SIGTERM/SIGHUP.
"""

from __future__ import annotations

import datetime
import os
import shutil
import signal
import subprocess
import time
import uuid
from contextlib import contextmanager

from ansible_collections.accelops.vgpu.plugins.module_utils.errors import shown
from ansible_collections.accelops.vgpu.plugins.module_utils.cluster import kubevirt
from ansible_collections.accelops.vgpu.plugins.module_utils.cluster.k8s_client import K8sError, KubeApi
from ansible_collections.accelops.vgpu.plugins.module_utils.cluster.conformance import checks, monitoring, report, workloads
from ansible_collections.accelops.vgpu.plugins.module_utils.cluster.conformance.checks import ConformanceError

TIMEOUTS = ("running_timeout", "ready_timeout", "pending_timeout", "cleanup_timeout", "guest_command_timeout",
            "poll_interval")
DEFAULT_GUEST_RUNNER = ["virtctl", "ssh", "--namespace", "{namespace}", "--command", "{command}", "vmi/{vmi}"]
DRA = ("resource.k8s.io", "v1")


class Interrupted(ConformanceError):
    """A signal arrived; raised where the run was, so `finally` cleans up."""


class ConformanceApi(KubeApi):
    """KubeApi plus the calls a conformance run makes (plain dicts in and out, K8sError naming the object)."""

    def list_nodes(self):
        return self._dict(self._call("Nodes", self.core.list_node)).get("items") or []

    def get_namespace(self, name):
        try:
            return self._dict(self._call("Namespace %s" % name, self.core.read_namespace, name))
        except K8sError as exc:
            if exc.status == 404:
                return None
            raise

    def create_namespace(self, body):
        self.writes.append(("POST", workloads.describe(body), False))
        return self._dict(self._call(workloads.describe(body), self.core.create_namespace, body))

    def delete_namespace(self, name):
        self.writes.append(("DELETE", "Namespace %s" % name, False))
        self._call("Namespace %s" % name, self.core.delete_namespace, name)

    def create_vmi(self, body):
        group, version, plural = workloads.VMI_API
        self.writes.append(("POST", workloads.describe(body), False))
        return self._call(workloads.describe(body), self.custom.create_namespaced_custom_object, group, version,
                          body["metadata"]["namespace"], plural, body)

    def list_vmis(self, namespace, run_id):
        group, version, plural = workloads.VMI_API
        items = self._call("VirtualMachineInstances in %s" % namespace, self.custom.list_namespaced_custom_object,
                           group, version, namespace, plural,
                           label_selector="%s=%s" % (workloads.RUN_LABEL, run_id))["items"]
        # the label selector again, client-side: not every API server double filters
        return dict((v["metadata"]["name"], v) for v in items
                    if ((v["metadata"].get("labels") or {}).get(workloads.RUN_LABEL)) == run_id)

    def delete_vmi(self, namespace, name):
        group, version, plural = workloads.VMI_API
        self.writes.append(("DELETE", "VirtualMachineInstance %s/%s" % (namespace, name), False))
        self._call("VirtualMachineInstance %s/%s" % (namespace, name), self.custom.delete_namespaced_custom_object,
                   group, version, namespace, plural, name)

    def list_dra(self, plural):
        """(True, items), (False, []) when resource.k8s.io/v1 is not served, or (reason, []) when unreadable."""
        try:
            return True, self.list_custom("%s.%s" % (plural, DRA[0]), DRA[0], DRA[1], plural)
        except K8sError as exc:
            if exc.status == 404:
                return False, []
            return str(exc), []


# --- inputs ----------------------------------------------------------------------------------

def validate_params(params):
    """Every input problem as one ConformanceError, before any request is made."""
    for option in TIMEOUTS:
        value = params.get(option)
        if value is None or value <= 0:
            raise ConformanceError("%s %s: must be a number of seconds greater than 0" % (option, shown(value)))
    if params["poll_interval"] > min(params[o] for o in TIMEOUTS if o != "poll_interval"):
        raise ConformanceError("poll_interval %s: must not be longer than the shortest timeout" % params["poll_interval"])
    if not workloads.valid_namespace(params.get("namespace")):
        raise ConformanceError("namespace %s: not a valid namespace name (DNS-1123 label)" % shown(params.get("namespace")))
    if params.get("guest_command"):
        runner = params.get("guest_runner") or DEFAULT_GUEST_RUNNER
        if not any("{command}" in part for part in runner):
            raise ConformanceError("guest_runner %s: no {command} placeholder" % shown(" ".join(runner)))
        if shutil.which(runner[0]) is None:
            raise ConformanceError("guest_runner %s: command not found on this host" % shown(runner[0]))
    report_dir = params.get("report_dir")
    if report_dir and not os.path.isdir(report_dir):
        raise ConformanceError("report_dir %s: not a directory" % shown(report_dir))
    if report_dir and not os.access(report_dir, os.W_OK):
        raise ConformanceError("report_dir %s: not writable" % shown(report_dir))


# --- waiting ---------------------------------------------------------------------------------

def wait_for(api, namespace, run_id, done, timeout, poll, clock=time.monotonic, sleep=time.sleep):
    """Poll the run's VMIs until done(vmis) or the timeout; returns the last {name: vmi} seen."""
    deadline = clock() + timeout
    while True:
        vmis = api.list_vmis(namespace, run_id)
        if done(vmis) or clock() >= deadline:
            return vmis
        sleep(min(poll, max(0.0, deadline - clock())))


def observe(api, namespace, run_id, name, window, poll, pickup_timeout, clock=time.monotonic, sleep=time.sleep):
    """Every state of VMI `name` seen during `window` seconds (stops early once it is placed).

    The window starts once KubeVirt has picked the VMI up (status.phase set, at most `pickup_timeout`),
    so a slow controller cannot make an unprocessed VMI look blocked."""
    picked = wait_for(api, namespace, run_id, lambda v: bool(((v.get(name) or {}).get("status") or {}).get("phase")),
                      pickup_timeout, poll, clock, sleep)
    deadline, seen = clock() + window, [picked.get(name)]
    while True:
        vmi = api.list_vmis(namespace, run_id).get(name)
        seen.append(vmi)
        if vmi and (checks.is_running(vmi) or checks.node_of(vmi)) or clock() >= deadline:
            return seen
        sleep(min(poll, max(0.0, deadline - clock())))


def run_guest(params, namespace, names):
    """{vmi: (rc, last output line)} for the guest command; {} when none is configured."""
    command = params.get("guest_command")
    if not command:
        return {}
    runner = params.get("guest_runner") or DEFAULT_GUEST_RUNNER
    results = {}
    for name in names:
        argv = [part.replace("{namespace}", namespace).replace("{vmi}", name).replace("{command}", command)
                for part in runner]
        try:
            # not AnsibleModule.run_command: it has no timeout, and a hanging `virtctl ssh` must not stop
            # the run (and its cleanup) forever
            proc = subprocess.run(argv, capture_output=True, text=True,  # pylint: disable=ansible-bad-function
                                  timeout=params["guest_command_timeout"], check=False)
            lines = [line.strip() for line in (proc.stdout + "\n" + proc.stderr).splitlines() if line.strip()]
            results[name] = (proc.returncode, (lines[-1] if lines else "")[:200])
        except subprocess.TimeoutExpired:
            results[name] = (None, "timed out after %gs" % params["guest_command_timeout"])
        except OSError as exc:
            results[name] = (None, "cannot run %s: %s" % (argv[0], exc.strerror))
    return results


# --- signals and cleanup ---------------------------------------------------------------------

@contextmanager
def interruptible():
    """SIGINT/SIGTERM/SIGHUP raise Interrupted where the run is, so its `finally` cleans up."""
    def handler(signum, _frame):
        raise Interrupted("interrupted by %s" % signal.Signals(signum).name)
    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        previous[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextmanager
def uninterrupted():
    """Cleanup must finish: signals are held off (bounded by cleanup_timeout) while it runs."""
    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        previous[sig] = signal.signal(sig, signal.SIG_IGN)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _gone(test, params, clock, sleep):
    deadline = clock() + params["cleanup_timeout"]
    while not test():
        if clock() >= deadline:
            return False
        sleep(params["poll_interval"])
    return True


class Created:
    """What this run created, so cleanup deletes exactly that."""

    def __init__(self, namespace, run_id):
        self.namespace, self.run_id = namespace, run_id
        self.namespace_ours = False      # this run created it (or tried to)
        self.vmis = []
        self.items = []                  # descriptions, in creation order

    def cleanup(self, api, params, clock=time.monotonic, sleep=time.sleep):
        """Delete our VMIs, wait until they are gone, delete our namespace; {"deleted", "left"}."""
        deleted, left = [], []
        if not self.namespace_ours and not self.vmis:
            return {"deleted": deleted, "left": left}
        names = set(self.vmis)
        try:
            names |= set(api.list_vmis(self.namespace, self.run_id))
        except K8sError:
            pass
        for name in sorted(names):
            try:
                api.delete_vmi(self.namespace, name)
                deleted.append("VirtualMachineInstance %s/%s" % (self.namespace, name))
            except K8sError as exc:
                if exc.status != 404:
                    left.append("VirtualMachineInstance %s/%s (%s)" % (self.namespace, name, exc))
        try:
            remaining = wait_for(api, self.namespace, self.run_id, lambda vmis: not vmis, params["cleanup_timeout"],
                                 params["poll_interval"], clock, sleep)
            left += ["VirtualMachineInstance %s/%s (still there after %gs)" % (self.namespace, n, params["cleanup_timeout"])
                     for n in sorted(remaining)]
        except K8sError as exc:
            left.append("VirtualMachineInstances in %s (%s)" % (self.namespace, exc))
        if self.namespace_ours:
            try:
                current = api.get_namespace(self.namespace)
                # only the namespace carrying this run's label: a 409 on create means someone else's
                if current is not None and workloads.run_of(current) == self.run_id:
                    api.delete_namespace(self.namespace)
                    deleted.append("Namespace %s" % self.namespace)
                    if not _gone(lambda: api.get_namespace(self.namespace) is None, params, clock, sleep):
                        left.append("Namespace %s (still there after %gs)" % (self.namespace, params["cleanup_timeout"]))
            except K8sError as exc:
                if exc.status != 404:
                    left.append("Namespace %s (%s)" % (self.namespace, exc))
        self.vmis = []
        return {"deleted": deleted, "left": left}


# --- the run ---------------------------------------------------------------------------------

def _read_cluster(api, params):
    cr = kubevirt.read_kubevirt(api, params.get("kubevirt_name"), params.get("kubevirt_namespace"))
    nodes = api.list_nodes()
    namespace = api.get_namespace(params["namespace"])
    dra_served, classes = api.list_dra("deviceclasses")
    slices = api.list_dra("resourceslices")[1] if dra_served is True else []
    return cr, nodes, namespace, (dra_served, classes, slices)


def preflight(api, params):
    """Reads and every check that must pass before anything is created; returns the plan."""
    cr, nodes, namespace, dra = _read_cluster(api, params)
    prefix = params.get("profile_label_prefix") or checks.DEFAULT_PROFILE_PREFIX
    resources = checks.discover_resources(cr, nodes, prefix)
    if not checks.vgpu_resources(resources):
        raise ConformanceError("%s permits no NVIDIA vGPU resource (pciHostDevices / mediatedDevices): nothing to "
                               "attest; publish the vGPUs first (playbooks/cluster.yml)" % kubevirt.cr_ref(cr))
    profiles = checks.select_profiles(resources, params.get("profiles"))
    if namespace is not None and not workloads.is_ours(namespace):
        raise ConformanceError("namespace %s exists and is not ours (no %s label): pick another namespace"
                               % (params["namespace"], workloads.RUN_LABEL))
    if namespace is not None:
        # a run that was killed hard (SIGKILL) left it; its VMIs may still hold vGPUs
        raise ConformanceError("namespace %s is left from run %s: delete it first (state=absent)"
                               % (params["namespace"], workloads.run_of(namespace)))
    node_facts = params.get("node_facts") or {}
    if profiles:
        # only the selected profiles' resources are reported
        resources = [r for r in resources if r.profiles & set(profiles) or not r.profiles]
    plans, missing = checks.plan_workloads(resources, profiles, node_facts, nodes)
    return {"cr": cr, "nodes": nodes, "namespace": namespace, "dra": dra, "resources": resources,
            "profiles": profiles, "plans": plans, "missing": missing, "node_facts": node_facts, "prefix": prefix}


def _would_create(params, run_id, plans):
    manifests = [workloads.namespace_manifest(params["namespace"], run_id)]
    for plan in plans:
        names, extra = checks.vmi_names(plan)
        manifests += [workloads.vmi_manifest(n, params["namespace"], run_id, plan, params) for n in names + [extra]]
    return manifests


def _exercise(api, params, created, plan, rows):
    """The workload checks of one profile; its VMIs are deleted before the next profile runs."""
    namespace, run_id, poll = created.namespace, created.run_id, params["poll_interval"]
    names, extra = checks.vmi_names(plan)
    for name in names:
        api.create_vmi(workloads.vmi_manifest(name, namespace, run_id, plan, params))
        created.vmis.append(name)
        created.items.append("VirtualMachineInstance %s/%s (%s on %s)" % (namespace, name, plan["resource"], plan["node"]))
    vmis = wait_for(api, namespace, run_id, lambda v: all(checks.is_running(v.get(n)) for n in names),
                    params["running_timeout"], poll)
    rows.append(checks.sharing_check(plan, names, vmis, params["running_timeout"]))
    vmis = wait_for(api, namespace, run_id, lambda v: all(checks.is_ready(v.get(n)) for n in names),
                    params["ready_timeout"], poll)
    rows.append(checks.ready_check(plan, names, vmis, params["ready_timeout"]))
    ready = [n for n in names if checks.is_ready(vmis.get(n))]
    rows.append(checks.guest_check(plan, params.get("guest_command"), run_guest(params, namespace, ready)))
    api.create_vmi(workloads.vmi_manifest(extra, namespace, run_id, plan, params))
    created.vmis.append(extra)
    created.items.append("VirtualMachineInstance %s/%s (one more than the %d vGPU(s) of %s)"
                         % (namespace, extra, plan["count"], plan["node"]))
    seen = observe(api, namespace, run_id, extra, params["pending_timeout"], poll, params["running_timeout"])
    rows.append(checks.overallocation_check(plan, extra, seen, params["pending_timeout"]))
    for name in names + [extra]:
        try:
            api.delete_vmi(namespace, name)
        except K8sError as exc:
            if exc.status != 404:
                raise
    wait_for(api, namespace, run_id, lambda v: not v, params["cleanup_timeout"], poll)


def run(api, params, check_mode, now=None):
    """The whole run; returns the module result. Raises ConformanceError / K8sError (one line) after cleanup."""
    validate_params(params)
    plan = preflight(api, params)
    run_id = uuid.uuid4().hex[:12]
    rows = checks.inventory_checks(plan["resources"]) + checks.accounting_checks(plan["resources"], plan["node_facts"])
    manifests = _would_create(params, run_id, plan["plans"])
    created = Created(params["namespace"], run_id)
    cleanup = {"deleted": [], "left": []}
    workload_rows = []
    if check_mode:
        for item in plan["plans"]:
            workload_rows += checks.not_run_rows(item, "check mode: no workload created")
    else:
        try:
            with interruptible():
                if plan["plans"]:
                    created.namespace_ours = True   # set first: a create cut short may still have happened
                    api.create_namespace(workloads.namespace_manifest(params["namespace"], run_id))
                    created.items.append("Namespace %s" % params["namespace"])
                for item in plan["plans"]:
                    _exercise(api, params, created, item, workload_rows)
        except BaseException as exc:
            with uninterrupted():
                cleanup = created.cleanup(api, params)
            left = (", left: " + ", ".join(cleanup["left"])) if cleanup["left"] else ""
            what = "; cleanup deleted %d object(s)%s" % (len(cleanup["deleted"]), left)
            if isinstance(exc, (ConformanceError, K8sError)):
                raise type(exc)(str(exc) + what) from None
            raise
        with uninterrupted():
            cleanup = created.cleanup(api, params)
    for profile in plan["missing"]:
        workload_rows += checks.not_run_rows(profile, "no node advertises a vGPU of %s" % profile)
    rows += workload_rows
    rows += checks.consistency_checks(plan["resources"], plan["nodes"], plan["prefix"])
    rows.append(checks.dra_check(*plan["dra"]))
    meta = plan["cr"]["metadata"]
    context = {"generated": (now or datetime.datetime.now(datetime.timezone.utc)).strftime("%Y-%m-%dT%H:%M:%SZ"),
               "run_id": run_id, "check_mode": bool(check_mode), "namespace": params["namespace"],
               "cluster": {"server": api.client.configuration.host, "kubevirt": kubevirt.cr_ref(plan["cr"]),
                           "version": kubevirt.deployed_version(plan["cr"])},
               "profiles": plan["profiles"],
               "monitoring": monitoring.section(plan["nodes"], plan["prefix"]),
               "created": [workloads.describe(m) for m in manifests] if check_mode else created.items,
               "cleanup": cleanup}
    rep = report.build(rows, checks.summary(rows), context)
    files = {}
    if params.get("report_dir") and not check_mode:
        files = report.write(rep, params["report_dir"], params.get("report_name") or "vgpu-conformance")
    counts = rep["summary"]
    result = {"changed": bool(plan["plans"]), "report": rep, "summary": counts, "report_files": files,
              "summary_line": "%d PASS, %d FAIL, %d UNKNOWN of %d checks%s" % (
                  counts["pass"], counts["fail"], counts["unknown"], counts["total"],
                  " (check mode: nothing created)" if check_mode else ""),
              "lines": ["%-7s %s %s: %s" % (r.status, r.check, r.subject, r.reason) for r in rows],
              "would_create": [workloads.describe(m) for m in manifests] if check_mode and plan["plans"] else [],
              "cleanup": cleanup, "failed_checks": ["%s %s: %s" % (r.check, r.subject, r.reason)
                                                    for r in rows if r.status == checks.FAIL]}
    if cleanup["left"]:
        raise ConformanceError("cleanup left %s (delete by hand)" % ", ".join(cleanup["left"]))
    return result


def clean(api, params, check_mode):
    """state=absent: delete what an earlier run left in `namespace` (only if the namespace is ours)."""
    validate_params(dict(params, guest_command=None, report_dir=None))
    namespace = api.get_namespace(params["namespace"])
    if namespace is None:
        return {"changed": False, "cleanup": {"deleted": [], "left": []}}
    if not workloads.is_ours(namespace):
        raise ConformanceError("namespace %s exists and is not ours (no %s label): not deleting it"
                               % (params["namespace"], workloads.RUN_LABEL))
    run_id = workloads.run_of(namespace)
    if check_mode:
        vmis = sorted(api.list_vmis(params["namespace"], run_id))
        return {"changed": True, "cleanup": {"deleted": [], "left": []},
                "would_delete": ["VirtualMachineInstance %s/%s" % (params["namespace"], n) for n in vmis]
                + ["Namespace %s" % params["namespace"]]}
    created = Created(params["namespace"], run_id)
    created.namespace_ours = True
    with uninterrupted():
        cleanup = created.cleanup(api, params)
    if cleanup["left"]:
        raise ConformanceError("cleanup left %s (delete by hand)" % ", ".join(cleanup["left"]))
    return {"changed": True, "cleanup": cleanup}


def run_module_engine(api, params, check_mode):
    """The engine behind the vgpu_conformance module (k8s_client.run_cluster_module builds `api`)."""
    api = ConformanceApi(api.client)
    if params.get("state") == "absent":
        result = clean(api, params, check_mode)
        gone = result.get("would_delete") or result["cleanup"]["deleted"]
        result["diff"] = {"before": {"objects": gone}, "after": {"objects": []}}
        return result
    result = run(api, params, check_mode)
    made = result["would_create"] if check_mode else result["report"]["created"]
    result["diff"] = {"before": {"created": []}, "after": {"created": made}}
    return result
