# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The agent's settings: environment variables (VDM's names where VDM has one), each also a flag.

A flag wins over its variable. `add_arguments(parser)` declares them all (their help is what
`accelops-vgpu agent --help` prints); `resolve(args)` checks them and fills derived values.
"""

from __future__ import annotations

import os

from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw import pci
from ansible_collections.accelops.vgpu.plugins.module_utils.node.boot import handover

# (flag, environment variable, default, kind, help); kind: str, seconds, bool, port, gpus
OPTIONS = (
    ("--node-name", "NODE_NAME", None, "str", "required: the Node this agent reconciles (the pod's spec.nodeName)"),
    ("--config-file", "CONFIG_FILE", None, "str",
     "required: vgpu-device-manager config (JSON, or YAML with PyYAML), usually a mounted ConfigMap key; "
     "re-read when its content changes (the ConfigMap's ..data swap included)"),
    ("--default-vgpu-config", "DEFAULT_VGPU_CONFIG", None, "str",
     "required: config name used while the node has no nvidia.com/vgpu.config label"),
    ("--namespace", "NAMESPACE", None, "str",
     "namespace for the agent's Events (default: the service account's namespace, else 'default')"),
    ("--host-root-mount", "HOST_ROOT_MOUNT", "/host", "str",
     "where the host's / is mounted: sysfs, dev and proc default to its sys, dev and proc (default /host)"),
    ("--sysfs-root", "ACCELOPS_VGPU_SYSFS_ROOT", None, "str", "node sysfs (default $HOST_ROOT_MOUNT/sys)"),
    ("--dev-root", "ACCELOPS_VGPU_DEV_ROOT", None, "str", "node /dev for VFIO device nodes (default $HOST_ROOT_MOUNT/dev)"),
    ("--proc-root", "ACCELOPS_VGPU_PROC_ROOT", None, "str",
     "node /proc to find VFIO handles VMs hold (default $HOST_ROOT_MOUNT/proc; needs hostPID or the host's /proc)"),
    ("--lock-key", "ACCELOPS_VGPU_LOCK_KEY", None, "str",
     "the host's path of the sysfs root, naming the node lock shared with the boot unit and the modules "
     "(default: its host path when the sysfs root lies below $HOST_ROOT_MOUNT, /host/sys -> /sys, whether "
     "derived or given as ACCELOPS_VGPU_SYSFS_ROOT; else the sysfs root); mount the host's "
     "/run/accelops-vgpu at /run/accelops-vgpu to share it"),
    ("--kubeconfig", "KUBECONFIG", None, "str",
     "kubeconfig file (out of cluster, tests); default: the in-cluster service account "
     "(KUBERNETES_SERVICE_HOST/PORT, /var/run/secrets/kubernetes.io/serviceaccount/{token,ca.crt,namespace})"),
    ("--sriov-manage", "SRIOV_MANAGE", None, "str",
     "sriov-manage to enable VFs with (GPU Operator nodes: /run/nvidia/driver/usr/lib/nvidia/sriov-manage; "
     "default /usr/lib/nvidia/sriov-manage, then PATH)"),
    ("--resync-interval", "RESYNC_INTERVAL", "300", "seconds",
     "seconds after which a failed layout is retried and an idle node re-asserted (default 300)"),
    ("--manager-probe-interval", "MANAGER_PROBE_INTERVAL", "5", "seconds",
     "seconds between checks that the vGPUs of the last apply are still there (one sysfs read per GPU with "
     "vGPUs); a vGPU-manager restart that removed them is re-applied at once (default 5)"),
    ("--config-poll-interval", "CONFIG_POLL_INTERVAL", "5", "seconds",
     "seconds between checks of CONFIG_FILE for a new content (default 5; a stat and a readlink, no sysfs)"),
    ("--watch-timeout", "WATCH_TIMEOUT", "300", "seconds",
     "timeoutSeconds of each watch of the node; it is resumed afterwards (default 300)"),
    ("--lock-timeout", "LOCK_TIMEOUT", "300", "seconds",
     "seconds to wait for the node lock held by another apply (default 300)"),
    ("--wait-timeout", "WAIT_TIMEOUT", "120", "seconds", "seconds enabled VFs may take to appear (default 120)"),
    ("--mixed-size", "MIXED_SIZE", "false", "bool", "true: allow several framebuffer sizes per GPU (apply --mixed-size)"),
    ("--operand-namespace", "OPERAND_NAMESPACE", None, "str",
     "namespace of the GPU Operator's sandbox operands (e.g. gpu-operator): after pausing them, wait for their "
     "pods on this node to terminate, as VDM does (needs pods list there); unset: no wait"),
    ("--operand-wait-timeout", "OPERAND_WAIT_TIMEOUT", "120", "seconds",
     "seconds to wait for the paused operands' pods to terminate (default 120); longer fails the change"),
    ("--device-plugin", "DEVICE_PLUGIN", "false", "bool",
     "true: also serve this node's vGPUs to the kubelet, one resource per profile (device plugin API v1beta1, "
     "nvidia.com/<type name>; for KubeVirt entries with externalResourceProvider: true); needs grpcio and protobuf "
     "(the agent image has them)"),
    ("--kubelet-dir", "KUBELET_DIR", "/var/lib/kubelet", "str",
     "the kubelet's root directory as this container sees it (device-plugins/ holds kubelet.sock and the "
     "plugin's sockets); k0s: /var/lib/k0s/kubelet, MicroK8s: /var/snap/microk8s/common/var/lib/kubelet "
     "(default /var/lib/kubelet)"),
    ("--kubelet-restart-grace", "KUBELET_RESTART_GRACE", "60", "seconds",
     "seconds after a kubelet restart (its sockets made anew) during which every vGPU the device plugin allocated "
     "stays held, while the kubelet lists its pods again; also how long an allocation the kubelet has not listed "
     "yet stays held (default 60). Otherwise a vGPU no live pod holds is free at the next check"),
    ("--dra-driver", "DRA_DRIVER", "false", "bool",
     "true: also be the DRA driver vgpu.accelops.io: publish this node's vGPUs as ResourceSlices (resource.k8s.io/v1) "
     "and prepare ResourceClaims for the kubelet (registration in $KUBELET_DIR/plugins_registry/, service in "
     "$KUBELET_DIR/plugins/vgpu.accelops.io/); needs grpcio and protobuf (the agent image has them)"),
    ("--device-plugin-gpus", "DEVICE_PLUGIN_GPUS", None, "gpus",
     "the GPUs whose vGPUs the device plugin serves: comma-separated PF PCI addresses (0000:41:00.0) or PCI IDs "
     "(10de:26b9, 0x26B910DE); unset: every GPU. Required, with DRA_DRIVER_GPUS, when DEVICE_PLUGIN and DRA_DRIVER "
     "are both true: each GPU goes to one of them, never both (a vGPU offered twice is handed to two pods)"),
    ("--dra-driver-gpus", "DRA_DRIVER_GPUS", None, "gpus",
     "the GPUs whose vGPUs the DRA driver publishes, in DEVICE_PLUGIN_GPUS' form; unset: every GPU. The agent "
     "refuses to start when a GPU of the node is in both lists"),
    ("--cdi-dir", "CDI_DIR", "/var/run/cdi", "str",
     "where the DRA driver writes CDI specs for prepared claims, as this container sees the host's CDI directory "
     "(default /var/run/cdi)"),
    ("--status-file", "STATUS_FILE", None, "str",
     "file the agent rewrites with its last state as JSON (for a readiness/liveness probe)"),
    ("--handover-file", "HANDOVER_FILE", None, "str",
     "where the agent writes each config it applied, for the boot unit and the vGPU manager image to re-apply "
     "(default $HOST_ROOT_MOUNT/etc/accelops-vgpu/agent-applied.json, written only where the boot unit's layout.json is there; "
     "'none': never)"),
    ("--metrics-port", "METRICS_PORT", None, "port",
     "TCP port of the HTTP endpoint: /metrics (Prometheus), /healthz (liveness: fails when the reconcile loop or "
     "the node watch is stuck), /readyz (ready after the first successful reconcile); unset: no endpoint"),
    ("--metrics-bind-address", "METRICS_BIND_ADDRESS", "0.0.0.0", "str",
     "address the HTTP endpoint listens on (default 0.0.0.0, the pod's addresses; :: for IPv6)"),
)
REQUIRED = ("node_name", "config_file", "default_vgpu_config")
SA_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


class SettingsError(EngineError):
    """Bad startup configuration (exit 2)."""


BOTH_MODES = ("DEVICE_PLUGIN=true and DRA_DRIVER=true offer every vGPU twice (an extended resource and a DRA device, "
              "so two pods get the same VF): enable one of them, or give each GPU to exactly one with "
              "DEVICE_PLUGIN_GPUS and DRA_DRIVER_GPUS (disjoint)")


class GpuSelection:
    """The GPUs one mode serves (DEVICE_PLUGIN_GPUS, DRA_DRIVER_GPUS): PF addresses and PCI IDs; empty: every GPU."""

    def __init__(self, addresses=(), ids=()):
        self.addresses, self.ids = frozenset(addresses), frozenset(ids)

    @property
    def everything(self):
        return not (self.addresses or self.ids)

    def selects(self, gpu):
        """`gpu`: an object with address, vendor, device (node/layout/vgpu_layout.nvidia_gpus)."""
        return self.everything or gpu.address in self.addresses or (gpu.vendor, gpu.device) in self.ids

    def __repr__(self):
        return "GpuSelection(%s)" % ", ".join(sorted(self.addresses) + sorted("%s:%s" % i for i in self.ids))


def _gpus(name, text):
    """DEVICE_PLUGIN_GPUS / DRA_DRIVER_GPUS -> GpuSelection; SettingsError names the bad entry."""
    addresses, ids = set(), set()
    for item in [part.strip() for part in str(text or "").split(",") if part.strip()]:
        try:
            if (item.count(":") == 1 and "." not in item) or item.lower().startswith("0x"):
                ids.add(pci.parse_id_filter(item))
            else:
                addresses.add(pci.parse_address(item))
        except pci.PciAddressError:
            raise SettingsError("%s: %r is neither a GPU's PCI address (0000:41:00.0) nor a PCI ID (10de:26b9)"
                                % (name, item[:64])) from None
    return GpuSelection(addresses, ids)


def _check_modes(values):
    """Both kubelet modes on: each needs its own GPUs, and no GPU named for both (the node's GPUs are checked at
    start by `check_split`)."""
    plugin, dra = values["device_plugin_gpus"], values["dra_driver_gpus"]
    if not (values["device_plugin"] and values["dra_driver"]):
        return
    if plugin.everything or dra.everything:
        raise SettingsError(BOTH_MODES)
    both = sorted(plugin.addresses & dra.addresses) + sorted("%s:%s" % i for i in plugin.ids & dra.ids)
    if both:
        raise SettingsError("DEVICE_PLUGIN_GPUS and DRA_DRIVER_GPUS both name %s: each GPU is served by one of "
                            "them only" % ", ".join(both))


def served(selection, gpus):
    """The addresses of the node's `gpus` a mode serves, as a predicate for the plugins; None: every GPU."""
    if selection.everything:
        return None
    return frozenset(gpu.address for gpu in gpus if selection.selects(gpu)).__contains__


def check_split(settings, gpus):
    """SettingsError naming the first of the node's `gpus` both modes would serve (DEVICE_PLUGIN and DRA_DRIVER
    true, e.g. its address in one list and its PCI ID in the other)."""
    if not (settings.device_plugin and settings.dra_driver):
        return
    for gpu in gpus:
        if settings.device_plugin_gpus.selects(gpu) and settings.dra_driver_gpus.selects(gpu):
            raise SettingsError("GPU %s (%s:%s) is in both DEVICE_PLUGIN_GPUS and DRA_DRIVER_GPUS: each GPU is "
                                "served by one of them only" % (gpu.address, gpu.vendor, gpu.device))


def check_claim_time(settings, gpus, claim_time):
    """SettingsError naming the first of the node's `gpus` that the config file declares claim-time (`claim_time`:
    their PF addresses, node/engine/claim_time_layout.Declaration.select) and the settings cannot serve: only the DRA
    driver serves a claim-time GPU (its VFs are typed by NodePrepareResources), whatever DRA_DRIVER_GPUS says;
    DEVICE_PLUGIN_GPUS naming it (its address or its PCI ID) is a configuration error."""
    for gpu in gpus:
        if gpu.address not in claim_time:
            continue
        if not settings.dra_driver:
            raise SettingsError("GPU %s is claim-time in %s but DRA_DRIVER is not true: only the DRA driver serves a "
                                "claim-time GPU (it types the VFs when a claim is prepared)"
                                % (gpu.address, settings.config_file))
        if settings.device_plugin and not settings.device_plugin_gpus.everything and \
                settings.device_plugin_gpus.selects(gpu):
            raise SettingsError("GPU %s is claim-time in %s and in DEVICE_PLUGIN_GPUS: a claim-time GPU is served by "
                                "the DRA driver only; take it out of DEVICE_PLUGIN_GPUS"
                                % (gpu.address, settings.config_file))


def _dest(flag):
    return flag[2:].replace("-", "_")


def add_arguments(parser):
    for flag, env, default, kind, text in OPTIONS:
        shown = " (env %s)" % env
        if kind == "bool":
            parser.add_argument(flag, dest=_dest(flag), nargs="?", const="true", default=None, metavar="true|false",
                                help=text + shown)
        else:
            parser.add_argument(flag, dest=_dest(flag), default=None, metavar="S" if kind == "seconds" else "VALUE",
                                help=text + shown)


def _seconds(name, text):
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = -1.0
    if not value > 0:
        raise SettingsError("%s=%r is not a positive number of seconds" % (name, text))
    return value


def _port(name, text):
    if text in (None, ""):
        return None
    try:
        value = int(str(text).strip())
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise SettingsError("%s=%r is not a TCP port (0-65535)" % (name, text))
    return value


def _bool(name, text):
    lowered = str(text).strip().lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off", ""):
        return False
    raise SettingsError("%s=%r is neither true nor false" % (name, text))


def _handover_file(given, host):
    """The hand-over file (node/boot/handover.py): given, or below the host's /etc; None for 'none'."""
    if given and given.lower() == "none":
        return None
    return given or os.path.join(host, handover.NODE_DIR.lstrip("/"), handover.FILE_NAME)


def host_path(path, host):
    """The host's path of `path` when it lies below the host's / mounted at `host` (/host/sys -> /sys), else None
    (the lock is then named after `path` itself): the node lock key is the same whether the sysfs root was
    derived from HOST_ROOT_MOUNT or given as ACCELOPS_VGPU_SYSFS_ROOT (node/holders/node_lock.py lock_name)."""
    if not host:
        return None
    real, top = os.path.realpath(path), os.path.realpath(host)
    if top == os.sep or not (real == top or real.startswith(top + os.sep)):
        return None
    rel = os.path.relpath(real, top)
    return os.sep + ("" if rel == os.curdir else rel)


def resolve(args, environ=None):
    """A plain object with every setting; SettingsError names the first bad one."""
    environ = os.environ if environ is None else environ
    values = {}
    for flag, env, default, kind, dummy in OPTIONS:
        dest = _dest(flag)
        given = getattr(args, dest, None)
        raw = given if given is not None else environ.get(env) or default
        name = flag if given is not None else env
        if kind == "seconds":
            raw = _seconds(name, raw)
        elif kind == "bool":
            raw = _bool(name, raw)
        elif kind == "port":
            raw = _port(name, raw)
        elif kind == "gpus":
            raw = _gpus(name, raw)
        values[dest] = raw
    for dest in REQUIRED:
        if not values[dest]:
            env = [o[1] for o in OPTIONS if _dest(o[0]) == dest][0]
            raise SettingsError("%s is required (or --%s)" % (env, dest.replace("_", "-")))
    _check_modes(values)
    host = values["host_root_mount"]
    values["sysfs_root"] = values["sysfs_root"] or os.path.join(host, "sys")
    values["dev_root"] = values["dev_root"] or os.path.join(host, "dev")
    values["proc_root"] = values["proc_root"] or os.path.join(host, "proc")
    values["handover_file"] = _handover_file(values["handover_file"], host)
    if not values["lock_key"]:
        values["lock_key"] = host_path(values["sysfs_root"], host)
    if not os.path.isdir(values["sysfs_root"]):
        raise SettingsError("sysfs root %s is not a directory (HOST_ROOT_MOUNT or ACCELOPS_VGPU_SYSFS_ROOT)"
                            % values["sysfs_root"])
    if not values["namespace"]:
        try:
            with open(SA_NAMESPACE) as handle:
                values["namespace"] = handle.read().strip() or None
        except OSError:
            pass
    return type("Settings", (), values)()
