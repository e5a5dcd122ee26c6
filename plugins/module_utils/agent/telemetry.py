# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the agent reports about itself: its Prometheus metrics (names per the Prometheus naming conventions:
`accelops_vgpu_agent_` prefix, base units, `_total` counters) and its probe state (health.Health).

The agent calls `loop_beat()`, `reconcile_started()` and `reconciled(...)`; the API client is wrapped by
`instrument(api)` (API errors by operation and status, watch restarts, watch activity for the liveness probe).

Hook for the device plugin and the DRA driver: `Telemetry.plugin_requests` (a counter by plugin, method and
result), e.g. `telemetry.plugin_requests.inc(plugin="device-plugin", method="Allocate", result="ok")`; a new
metric: `telemetry.registry.counter(...)` / `.gauge(...)` with an `accelops_vgpu_agent_` name, listed in README.
"""

from __future__ import annotations

import time

from ansible_collections.accelops.vgpu.plugins.module_utils.agent import metrics
from ansible_collections.accelops.vgpu.plugins.module_utils.agent.health import Health
from ansible_collections.accelops.vgpu.plugins.module_utils.agent.kube import KubeApiError, KubeUnavailable
from ansible_collections.accelops.vgpu.plugins.module_utils.node.engine import facts
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.vgpu_types import short_name

PREFIX = "accelops_vgpu_agent_"
STATES = ("pending", "success", "failed")
VGPU_STATES = ("free", "in_use", "unhealthy")
API_OPERATIONS = ("get_node", "list_node", "patch_node", "list_pods", "create_event")


class Telemetry:
    def __init__(self, settings=None, clock=time.monotonic, wall=time.time):
        self.clock, self.wall = clock, wall
        self.health = Health.for_settings(settings, clock)
        self.registry = r = metrics.Registry()
        self.node_info = r.gauge(PREFIX + "node_info",
                                 "The Node this agent reconciles (constant 1; join on instance for a node label).",
                                 ["node"])
        if getattr(settings, "node_name", None):
            self.node_info.set(1, node=settings.node_name)
        self.applies = r.counter(PREFIX + "applies_total",
                                 "Reconciles of the node's layout by result: changed (vGPUs written), unchanged "
                                 "(the node already matched), failed.", ["result"])
        self.apply_duration = r.histogram(PREFIX + "apply_duration_seconds",
                                          "Duration of a reconcile (plan, writes, verification), in seconds.")
        self.last_success = r.gauge(PREFIX + "last_success_timestamp_seconds",
                                    "Unix time of the last reconcile that ended in state success.")
        self.state = r.gauge(PREFIX + "config_state",
                             "The layout the node asks for and its state: 1 for the current state "
                             "(nvidia.com/vgpu.config.state), 0 for the others.", ["config", "state"])
        self.vgpus = r.gauge(PREFIX + "vgpus",
                             "vGPUs on the node by profile and state: free, in_use (a VM holds it), unhealthy "
                             "(typed but not assignable: no IOMMU group, or a type the driver cannot name).",
                             ["profile", "state"])
        self.api_errors = r.counter(PREFIX + "api_errors_total",
                                    "Failed Kubernetes API requests by operation and HTTP status (unavailable: no "
                                    "answer).", ["operation", "code"])
        self.watch_restarts = r.counter(PREFIX + "watch_restarts_total",
                                        "Node watch streams started after the first (server timeouts, errors, "
                                        "relists).")
        self.plugin_requests = r.counter(PREFIX + "plugin_requests_total",
                                         "Requests served by the agent's kubelet plugins (device plugin, DRA) by "
                                         "plugin, method and result.", ["plugin", "method", "result"])
        self.manager_restarts = r.counter(PREFIX + "manager_restarts_total",
                                          "vGPU-manager restarts noticed between reconciles: vGPUs of the last apply "
                                          "gone (agent/manager_probe.py); each is re-applied at once.")
        self.watches = 0
        self.started_at = None

    # --- the reconcile loop ----------------------------------------------------------------------------------
    def loop_beat(self):
        self.health.beat()

    def reconcile_started(self):
        self.started_at = self.clock()
        self.health.reconcile_started()

    def reconciled(self, config, state, changed, vgpu_counts=None):
        """A reconcile ended with `state` (success/failed); `vgpu_counts`: {(profile, state): n} or None."""
        if self.started_at is not None:
            self.apply_duration.observe(max(0.0, self.clock() - self.started_at))
        self.started_at = None
        result = "failed" if state == "failed" else "changed" if changed else "unchanged"
        self.applies.inc(result=result)
        if state == "success":
            self.last_success.set(self.wall())
        self.state.replace(dict(((config, s), 1 if s == state else 0) for s in STATES))
        if vgpu_counts is not None:
            self.vgpus.replace(vgpu_counts)
        self.health.reconcile_finished(state == "success")

    def reconcile_aborted(self):
        """The reconcile stopped on an API error (retried with backoff): no result, the loop goes on."""
        self.started_at = None
        self.health.reconcile_finished(False)

    # --- the API client ----------------------------------------------------------------------------------------
    def instrument(self, api):
        return InstrumentedApi(api, self)

    def api_error(self, operation, exc):
        code = getattr(exc, "status", None)
        self.api_errors.inc(operation=operation, code=str(code) if code else "unavailable")

    def watch_started(self):
        self.watches += 1
        if self.watches > 1:
            self.watch_restarts.inc()
        self.health.watch_active()


class InstrumentedApi:
    """The agent's KubeClient with every call counted when it fails and the watch reported to health."""

    def __init__(self, api, telemetry):
        self.api, self.telemetry = api, telemetry
        for operation in API_OPERATIONS:
            if hasattr(api, operation):
                setattr(self, operation, self._counted(operation, getattr(api, operation)))

    def _counted(self, operation, call):
        def counted(*args, **kwargs):
            try:
                return call(*args, **kwargs)
            except (KubeApiError, KubeUnavailable) as exc:
                self.telemetry.api_error(operation, exc)
                raise
        return counted

    def __getattr__(self, name):  # anything not instrumented (request, ...) goes through unchanged
        return getattr(self.api, name)

    def watch_node(self, name, resource_version, timeout_seconds):
        self.telemetry.watch_started()
        try:
            for event in self.api.watch_node(name, resource_version, timeout_seconds):
                self.telemetry.health.watch_active()
                if event.get("type") == "ERROR":
                    status = (event.get("object") or {}).get("code")
                    self.telemetry.api_errors.inc(operation="watch_node", code=str(status or "unknown"))
                yield event
        except (KubeApiError, KubeUnavailable) as exc:
            self.telemetry.api_error("watch_node", exc)
            raise
        finally:
            self.telemetry.health.watch_active()


def vgpu_counts(node_facts):
    """{(profile, state): count} from node facts (node/engine/facts.gather): every VF with a vGPU type and every mdev."""
    counts = {}

    def add(profile, held, assignable):
        state = "in_use" if held else "free" if assignable else "unhealthy"
        key = (profile, state)
        counts[key] = counts.get(key, 0) + 1

    for vf in node_facts.get("vfs", ()):
        if not vf.get("vgpu_type_id"):
            continue
        name = vf.get("vgpu_type")
        add(short_name(name) if name else "unknown", vf.get("held"), bool(name and vf.get("iommu_group")))
    for mdev in node_facts.get("mdevs", ()):
        name = mdev.get("type_name")
        add(short_name(name) if name else "unknown", mdev.get("held"), bool(name and mdev.get("iommu_group")))
    # every profile present gets all three states, so a graph shows 0 instead of a gap
    for profile in set(p for p, _s in counts):
        for state in VGPU_STATES:
            counts.setdefault((profile, state), 0)
    return counts


def node_vgpu_counts(engine_factory, log=None):
    """vgpu_counts of the node the agent's engine sees (its sysfs, the VFIO handles under its /proc), or None
    when the node cannot be read now (the gauge then keeps its last value). `engine_factory()`: the reconcile's
    own engine where it made one, so its walk of /proc and the devices' groups stand (one walk per resync)."""
    try:
        engine = engine_factory()
        in_use = engine.in_use
        with engine.sysfs.walk_cache():     # one read per VF, each walked from its bus's directory as the apply's
            held = engine.held(reuse=True)
            return vgpu_counts(facts.vgpu_census(engine.sysfs, held, engine.names, lambda vf: in_use.facts(vf).group))
    except Exception as exc:  # pylint: disable=broad-exception-caught
        if log is not None:
            log("cannot count the node's vGPUs for the metrics: %s" % exc)
        return None
