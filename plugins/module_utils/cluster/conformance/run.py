# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The I/O of a conformance run: read the cluster, create and watch the test VMIs, clean up.

Order (nothing is created before every input and precondition is checked):
1. inputs (timeouts, namespace name, runner) -> 2. reads: KubeVirt CR, Nodes, our namespace, DRA ->
3. vGPU resources and DRA devices (neither: error) and the profile filter (unknown: error) -> 4. the
namespace must be absent or ours -> static checks -> (check mode: stop, list what would be created) ->
per profile: capacity VMIs, wait Running / Ready, guest command, one VMI more, observe it, delete them ->
per profile again through DRA when our driver serves (dra.py): capacity claims + VMIs, wait Running,
one claim + VMI more, observe both, delete the VMIs, then the claims -> cleanup in `finally`, also on
errors and on SIGINT/SIGTERM/SIGHUP.
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
from ansible_collections.accelops.vgpu.plugins.module_utils.cluster.conformance import (
    checks, dra, monitoring, report, workloads)
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

    # the run's namespaced objects: VMIs (kubevirt.io) and ResourceClaims (resource.k8s.io), by their API
    def _create(self, api, body):
        group, version, plural = api
        self.writes.append(("POST", workloads.describe(body), False))
        return self._call(workloads.describe(body), self.custom.create_namespaced_custom_object, group, version,
                          body["metadata"]["namespace"], plural, body)

    def _list_run(self, api, kinds, namespace, run_id):
        group, version, plural = api
        items = self._call("%s in %s" % (kinds, namespace), self.custom.list_namespaced_custom_object,
                           group, version, namespace, plural,
                           label_selector="%s=%s" % (workloads.RUN_LABEL, run_id))["items"]
        # the label selector again, client-side: not every API server double filters
        return dict((o["metadata"]["name"], o) for o in items if workloads.run_of(o) == run_id)

    def _delete(self, api, kind, namespace, name):
        group, version, plural = api
        self.writes.append(("DELETE", "%s %s/%s" % (kind, namespace, name), False))
        self._call("%s %s/%s" % (kind, namespace, name), self.custom.delete_namespaced_custom_object,
                   group, version, namespace, plural, name)

    def create_vmi(self, body):
        return self._create(workloads.VMI_API, body)

    def list_vmis(self, namespace, run_id):
        return self._list_run(workloads.VMI_API, "VirtualMachineInstances", namespace, run_id)

    def delete_vmi(self, namespace, name):
        self._delete(workloads.VMI_API, "VirtualMachineInstance", namespace, name)

    def create_claim(self, body):
        return self._create(workloads.CLAIM_API, body)

    def list_claims(self, namespace, run_id):
        """{name: ResourceClaim} of the run in `namespace`; {} where resource.k8s.io/v1 is not served."""
        try:
            return self._list_run(workloads.CLAIM_API, "ResourceClaims", namespace, run_id)
        except K8sError as exc:
            if exc.status == 404:
                return {}
            raise

    def delete_claim(self, namespace, name):
        self._delete(workloads.CLAIM_API, "ResourceClaim", namespace, name)

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
    if params.get("dra_device_class") is not None and not workloads.valid_subdomain(params["dra_device_class"]):
        raise ConformanceError("dra_device_class %s: not a valid DeviceClass name (DNS-1123 subdomain)"
                               % shown(params.get("dra_device_class")))
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


def observe(api, namespace, run_id, name, window, poll, pickup_timeout, clock=time.monotonic, sleep=time.sleep,
            claim=False):
    """Every state of VMI `name` seen during `window` seconds (stops early once it is placed); with `claim`,
    (VMI, its ResourceClaim of the same name) pairs, the claim read right after the VMI.

    The window starts once KubeVirt has picked the VMI up (status.phase set, at most `pickup_timeout`),
    so a slow controller cannot make an unprocessed VMI look blocked."""
    def state(vmis):
        return (vmis.get(name), api.list_claims(namespace, run_id).get(name)) if claim else vmis.get(name)

    picked = wait_for(api, namespace, run_id, lambda v: bool(((v.get(name) or {}).get("status") or {}).get("phase")),
                      pickup_timeout, poll, clock, sleep)
    deadline, seen = clock() + window, [state(picked)]
    while True:
        seen.append(state(api.list_vmis(namespace, run_id)))
        vmi = seen[-1][0] if claim else seen[-1]
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
        self.claims = []                 # ResourceClaims (DRA)
        self.dra = False                 # claims may exist: look for them by the run label too
        self.items = []                  # descriptions, in creation order

    def cleanup(self, api, params, clock=time.monotonic, sleep=time.sleep):
        """Delete our VMIs, wait until they are gone, then our ResourceClaims (their consumers gone, the
        scheduler's delete protection lets them go), delete our namespace; {"deleted", "left"}."""
        deleted, left = [], []
        if not self.namespace_ours and not self.vmis and not self.claims:
            return {"deleted": deleted, "left": left}
        kinds = [("VirtualMachineInstance", self.vmis, api.list_vmis, api.delete_vmi)]
        if self.dra or self.claims:
            kinds.append(("ResourceClaim", self.claims, api.list_claims, api.delete_claim))
        for kind, known, lister, deleter in kinds:
            gone, kept = self._delete_kind(kind, known, lambda lister=lister: lister(self.namespace, self.run_id),
                                           deleter, params, clock, sleep)
            deleted += gone
            left += kept
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
        self.vmis, self.claims = [], []
        return {"deleted": deleted, "left": left}

    def _delete_kind(self, kind, known, lister, deleter, params, clock, sleep):
        """Delete the run's objects of one kind (`known` and what `lister` finds), wait until they are gone;
        (deleted, left) as descriptions."""
        deleted, left = [], []
        names = set(known)
        try:
            names |= set(lister())
        except K8sError:
            pass
        for name in sorted(names):
            what = "%s %s/%s" % (kind, self.namespace, name)
            try:
                deleter(self.namespace, name)
                deleted.append(what)
            except K8sError as exc:
                if exc.status != 404:
                    left.append("%s (%s)" % (what, exc))
        try:
            if not _gone(lambda: not lister(), params, clock, sleep):
                left += ["%s %s/%s (still there after %gs)" % (kind, self.namespace, n, params["cleanup_timeout"])
                         for n in sorted(lister())]
        except K8sError as exc:
            left.append("%ss in %s (%s)" % (kind, self.namespace, exc))
        return deleted, left


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
    cr, nodes, namespace, dra_state = _read_cluster(api, params)
    prefix = params.get("profile_label_prefix") or checks.DEFAULT_PROFILE_PREFIX
    resources = checks.discover_resources(cr, nodes, prefix)
    device_class = params.get("dra_device_class") or dra.DEFAULT_DEVICE_CLASS
    dra_off = dra.unavailable(dra_state[0], dra_state[1], dra_state[2], device_class)
    dra_profiles = set(p for per_node in dra.dra_vgpus(dra_state[2]).values() for p in per_node) if not dra_off else ()
    if not checks.vgpu_resources(resources) and not dra_profiles:
        raise ConformanceError("%s permits no NVIDIA vGPU resource (pciHostDevices / mediatedDevices) and the DRA "
                               "driver %s publishes none: nothing to attest; publish the vGPUs first "
                               "(playbooks/cluster.yml)" % (kubevirt.cr_ref(cr), dra.DRA_VGPU_DRIVER))
    profiles = checks.select_profiles(resources, params.get("profiles"), dra_profiles)
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
    plans, missing = checks.plan_workloads(resources, profiles, node_facts, nodes, dra.dra_gpus(dra_state[2]))
    dra_plans, dra_missing = dra.plan_workloads(profiles, dra_state[2], nodes, device_class) if not dra_off else ([], [])
    exclusion = None if dra_off else dra.plan_exclusion(
        profiles or [p for p in dra_profiles if p != dra.WHOLE], dra_state[2], nodes, device_class)
    return {"exclusion": exclusion, "cr": cr, "nodes": nodes, "namespace": namespace, "dra": dra_state, "resources": resources,
            "profiles": profiles, "plans": plans, "missing": missing, "node_facts": node_facts, "prefix": prefix,
            "dra_off": dra_off, "dra_plans": dra_plans, "dra_missing": dra_missing}


def _would_create(params, run_id, plans, dra_plans, exclusion=None):
    manifests = [workloads.namespace_manifest(params["namespace"], run_id)]
    for plan in plans:
        names, extra = checks.vmi_names(plan)
        manifests += [workloads.vmi_manifest(n, params["namespace"], run_id, plan, params) for n in names + [extra]]
    for plan in dra_plans:
        names, extra = dra.workload_names(plan)
        for name in names + [extra]:
            manifests += [workloads.claim_manifest(name, params["namespace"], run_id, plan),
                          workloads.vmi_manifest(name, params["namespace"], run_id, plan, params, claim=name)]
    if exclusion is not None:
        whole, vgpu = dra.exclusion_sides(exclusion)
        for (a, b), side in zip(dra.exclusion_names(), ((whole, vgpu), (vgpu, whole))):
            for name, plan in zip((a, b), side):
                manifests += [workloads.claim_manifest(name, params["namespace"], run_id, plan),
                              workloads.vmi_manifest(name, params["namespace"], run_id, plan, params, claim=name)]
    return manifests


def _delete_workloads(api, created, names, claims, params, pending=None):
    """Delete the VMIs `names`, wait until they are gone, then their claims, and wait for those. `pending`, the
    one workload more (its VMI, and its claim where `claims` has it), goes first and is waited for on its own:
    deleting the others first frees their devices, and it would be allocated and started on one."""
    if pending is not None:
        _delete_workloads(api, created, [pending], [pending] if pending in claims else [], params)
        names, claims = [n for n in names if n != pending], [c for c in claims if c != pending]
    namespace, run_id = created.namespace, created.run_id
    for delete, lister, items in ((api.delete_vmi, api.list_vmis, names), (api.delete_claim, api.list_claims, claims)):
        for name in items:
            try:
                delete(namespace, name)
            except K8sError as exc:
                if exc.status != 404:
                    raise
        if items:
            _gone(lambda lister=lister, items=items: not set(items) & set(lister(namespace, run_id)), params,
                  time.monotonic, time.sleep)


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
    after = api.list_vmis(namespace, run_id)
    rows.append(checks.overallocation_check(plan, extra, seen, params["pending_timeout"],
                                            dict((n, after.get(n)) for n in names)))
    _delete_workloads(api, created, names + [extra], [], params, pending=extra)


def _claimed(api, params, created, plan, name, what):
    """Create the ResourceClaim `name` and the VMI of the same name that uses it."""
    namespace, run_id = created.namespace, created.run_id
    created.dra = True    # set first: a create cut short may still have happened
    api.create_claim(workloads.claim_manifest(name, namespace, run_id, plan))
    created.claims.append(name)
    created.items.append("ResourceClaim %s/%s (%s)" % (namespace, name, what))
    api.create_vmi(workloads.vmi_manifest(name, namespace, run_id, plan, params, claim=name))
    created.vmis.append(name)
    created.items.append("VirtualMachineInstance %s/%s (claim %s on %s)" % (namespace, name, name, plan["node"]))


def _exercise_dra(api, params, created, plan, rows):
    """The checks through ResourceClaims of one profile; its VMIs and claims are deleted before the next."""
    namespace, run_id, poll = created.namespace, created.run_id, params["poll_interval"]
    names, extra = dra.workload_names(plan)
    for name in names:
        _claimed(api, params, created, plan, name, "1 x %s of DeviceClass %s" % (plan["profile"], plan["device_class"]))
    vmis = wait_for(api, namespace, run_id, lambda v: all(checks.is_running(v.get(n)) for n in names),
                    params["running_timeout"], poll)
    rows.append(dra.sharing_check(plan, names, vmis, api.list_claims(namespace, run_id), params["running_timeout"]))
    _claimed(api, params, created, plan, extra, "one more than the %d %s device(s) of %s"
             % (plan["count"], plan["profile"], plan["node"]))
    seen = observe(api, namespace, run_id, extra, params["pending_timeout"], poll, params["running_timeout"],
                   claim=True)
    capacity = dict((n, c) for n, c in api.list_claims(namespace, run_id).items() if n != extra)
    rows.append(dra.overallocation_check(plan, extra, seen, capacity, params["pending_timeout"]))
    _delete_workloads(api, created, names + [extra], names + [extra], params, pending=extra)


def _exercise_exclusion(api, params, created, plan, rows):
    """exclusion.dra (dra.py): the whole GPU first, a vGPU of it must stay pending; then the other way round."""
    namespace, run_id, poll = created.namespace, created.run_id, params["poll_interval"]
    whole, vgpu = dra.exclusion_sides(plan)
    rounds = []
    for (a, b), (first, second) in zip(dra.exclusion_names(), ((whole, vgpu), (vgpu, whole))):
        _claimed(api, params, created, first, a, "%s of GPU %s" % (first["profile"], plan["gpu"]))
        wait_for(api, namespace, run_id, lambda v, a=a: checks.is_running(v.get(a)), params["running_timeout"], poll)
        _claimed(api, params, created, second, b, "%s of GPU %s while %s holds it" % (second["profile"], plan["gpu"], a))
        seen = observe(api, namespace, run_id, b, params["pending_timeout"], poll, params["running_timeout"],
                       claim=True)
        rounds.append((first, a, api.list_claims(namespace, run_id).get(a), second, b, seen))
        _delete_workloads(api, created, [a, b], [a, b], params, pending=b)
    rows.append(dra.exclusion_check(plan, rounds, params["pending_timeout"]))


def run(api, params, check_mode, now=None):
    """The whole run; returns the module result. Raises ConformanceError / K8sError (one line) after cleanup."""
    validate_params(params)
    plan = preflight(api, params)
    run_id = uuid.uuid4().hex[:12]
    dra_served = dra.dra_vgpus(plan["dra"][2])   # the vGPUs DRA publishes are not the device plugin's to count
    rows = checks.inventory_checks(plan["resources"]) + checks.accounting_checks(plan["resources"], plan["node_facts"],
                                                                                 dra_served)
    manifests = _would_create(params, run_id, plan["plans"], plan["dra_plans"], plan["exclusion"])
    created = Created(params["namespace"], run_id)
    cleanup = {"deleted": [], "left": []}
    workload_rows, dra_rows = [], []
    if check_mode:
        for item in plan["plans"]:
            workload_rows += checks.not_run_rows(item, "check mode: no workload created")
        for item in plan["dra_plans"]:
            dra_rows += dra.not_run_rows(item, "check mode: no claim created")
        if plan["exclusion"] is not None:
            dra_rows.append(checks.Check(dra.EXCLUSION, checks.KAR_SHARING, "%s@%s" % (
                plan["exclusion"]["gpu"], plan["exclusion"]["node"]), checks.UNKNOWN, "check mode: no claim created", {}))
    else:
        try:
            with interruptible():
                if plan["plans"] or plan["dra_plans"] or plan["exclusion"]:
                    created.namespace_ours = True   # set first: a create cut short may still have happened
                    api.create_namespace(workloads.namespace_manifest(params["namespace"], run_id))
                    created.items.append("Namespace %s" % params["namespace"])
                for item in plan["plans"]:
                    _exercise(api, params, created, item, workload_rows)
                for item in plan["dra_plans"]:
                    _exercise_dra(api, params, created, item, dra_rows)
                if plan["exclusion"] is not None:
                    _exercise_exclusion(api, params, created, plan["exclusion"], dra_rows)
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
    if plan["dra_off"]:
        dra_rows += dra.unavailable_rows(plan["dra_off"])
    for profile in plan["dra_missing"]:
        dra_rows += dra.not_run_rows(profile, "%s publishes no device of %s in a complete pool"
                                     % (dra.DRA_VGPU_DRIVER, profile))
    rows += workload_rows + dra_rows
    rows += checks.consistency_checks(plan["resources"], plan["nodes"], plan["prefix"])
    rows.append(dra.dra_check(*plan["dra"]))
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
    result = {"changed": bool(plan["plans"] or plan["dra_plans"]), "report": rep, "summary": counts, "report_files": files,
              "summary_line": "%d PASS, %d FAIL, %d UNKNOWN of %d checks%s" % (
                  counts["pass"], counts["fail"], counts["unknown"], counts["total"],
                  " (check mode: nothing created)" if check_mode else ""),
              "lines": ["%-7s %s %s: %s" % (r.status, r.check, r.subject, r.reason) for r in rows],
              "would_create": [workloads.describe(m) for m in manifests]
              if check_mode and (plan["plans"] or plan["dra_plans"]) else [],
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
        claims = sorted(api.list_claims(params["namespace"], run_id))
        return {"changed": True, "cleanup": {"deleted": [], "left": []},
                "would_delete": ["VirtualMachineInstance %s/%s" % (params["namespace"], n) for n in vmis]
                + ["ResourceClaim %s/%s" % (params["namespace"], n) for n in claims]
                + ["Namespace %s" % params["namespace"]]}
    created = Created(params["namespace"], run_id)
    created.namespace_ours, created.dra = True, True
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
