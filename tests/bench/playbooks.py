"""P2 and P4: the node playbook (playbooks/nodes.yml) run by ansible-playbook against gpusim hosts.

Every simulated host is an inventory host with `ansible_connection: local` and its own gpusim root
(role variables point the roots there; the boot files go below a per-host install root, systemd is
left alone). The fake sriov-manage / nvidia-smi act on $GPUSIM_ROOT, so each host's
`ansible_python_interpreter` is a small wrapper that sets GPUSIM_ROOT and PATH for that host and
execs the node Python (Debian's python3, as the integration tests use).

P2: a converged node, nodes.yml again (no change, no sysfs write) vs a one-task ping playbook.
P4: cold converge (VFs off, no vGPUs, no boot files) of 4, 16, 32 hosts, forks = hosts / ratio.
P4b: the same converges' controller CPU per host (all CPU less what the module runs took on the
node side) as a ratio to the ping playbook's on the same fleet and forks.
"""

from __future__ import annotations

import collections
import os
import re
import resource
import shlex
import shutil
import subprocess
import tempfile
import time

import yaml

from tests.bench import REPO, COLLECTIONS, pidns, simnodes, stats

ANSIBLE_PLAYBOOK = os.path.join(REPO, ".venv", "bin", "ansible-playbook")
NODES_PLAYBOOK = os.path.join(REPO, "playbooks", "nodes.yml")
NODE_PYTHON = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else os.path.join(
    REPO, ".venv", "bin", "python")
MODEL = "l40s"
PLAY_TIMEOUT = 1800
RECAP = re.compile(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)
TASK_TIME = re.compile(r"^(.+?) -+ (\d+\.\d+)s$", re.M)
PING_PLAY = [{"name": "One task", "hosts": "vgpu_nodes", "gather_facts": False,
              "tasks": [{"name": "Ping", "ansible.builtin.ping": {}}]}]


PlayRun = collections.namedtuple("PlayRun", "wall cpu node_cpu recap tasks changed")
TIMES = re.compile(r"(\d+)m([\d.]+)s")


def changed_tasks(output):
    """Names of the tasks the default callback reported `changed` for, in order, once each."""
    found, task = [], None
    for line in output.splitlines():
        if line.startswith("TASK ["):
            task = line[len("TASK ["):].rsplit("]", 1)[0]
        elif line.startswith("changed: [") and task and task not in found:
            found.append(task)
    return found


class Fleet:
    """An inventory of mounted gpusim nodes, written to `workdir`; `run(playbook, forks)` -> PlayRun."""

    def __init__(self, nodes, profiles, workdir):
        self.nodes, self.workdir = nodes, workdir
        self.hosts = ["node-%03d" % (i + 1) for i in range(len(nodes))]
        self.profiles = profiles
        self.node_cpu_dir = os.path.join(workdir, "node-cpu")
        os.makedirs(self.node_cpu_dir)
        self.inventory = os.path.join(workdir, "hosts.yml")
        self.ping = os.path.join(workdir, "ping.yml")
        with open(self.ping, "w") as handle:
            yaml.safe_dump(PING_PLAY, handle, sort_keys=False)
        host_vars = dict((host, self._host_vars(host, node)) for host, node in zip(self.hosts, nodes))
        group_vars = {"ansible_connection": "local", "sriov_devices": ["all"],
                      "vgpu_profiles_selected": "bench",
                      "vgpu_profiles_configs": {"bench": [{"devices": "all", "profiles": profiles}]},
                      "vgpu_profiles_manage_service": False,
                      "vgpu_profiles_cli_cache_dir": os.path.join(os.path.dirname(workdir), "cli-cache")}
        with open(self.inventory, "w") as handle:
            yaml.safe_dump({"all": {"children": {"vgpu_nodes": {"hosts": host_vars, "vars": group_vars}}}},
                           handle, sort_keys=False)

    def _host_vars(self, host, node):
        # bash's `times` after the module: its CPU and that of everything it ran (sriov-manage,
        # nvidia-smi), one file per module run, so the node side can be told from the controller's
        wrapper = os.path.join(self.workdir, "python-%s" % host)
        with open(wrapper, "w") as handle:
            handle.write("#!/bin/bash\nexport GPUSIM_ROOT=%s\nexport PATH=%s:\"$PATH\"\n%s \"$@\"\nrc=$?\n"
                         "times > %s/$$.times\nexit $rc\n"
                         % (shlex.quote(node.root), shlex.quote(node.tools_dir), shlex.quote(NODE_PYTHON),
                            shlex.quote(self.node_cpu_dir)))
        os.chmod(wrapper, 0o755)
        return {"ansible_python_interpreter": wrapper,
                "sriov_sysfs_root": node.root, "sriov_dev_root": node.dev_root,
                "vgpu_profiles_sysfs_root": node.root, "vgpu_profiles_dev_root": node.dev_root,
                "vgpu_profiles_install_root": self.install_root(host)}

    def install_root(self, host):
        return os.path.join(self.workdir, "root-%s" % host)

    def run(self, playbook, forks, limit=None, profile=False):
        """A PlayRun; fails unless every host (or `limit`, one host) is ok.

        `cpu` counts ansible-playbook and everything it ran (modules, sriov-manage, nvidia-smi), not the
        gpusim servers; `node_cpu` the part of it the module runs took (what a remote node would
        spend); `profile` fills `tasks` ({task name: seconds}, the profile_tasks callback).
        """
        tmp = os.path.join(self.workdir, "ansible-tmp")
        env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"),
                   ANSIBLE_COLLECTIONS_PATH=COLLECTIONS, ANSIBLE_LOCAL_TEMP=tmp, ANSIBLE_REMOTE_TEMP=tmp,
                   ANSIBLE_NOCOLOR="1", ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default")
        if profile:
            env.update(ANSIBLE_CALLBACKS_ENABLED="ansible.posix.profile_tasks", PROFILE_TASKS_SORT_ORDER="none",
                       PROFILE_TASKS_TASK_OUTPUT_LIMIT="all")
        argv = [ANSIBLE_PLAYBOOK, "-i", self.inventory, "-f", str(forks), playbook] + (["--limit", limit] if limit else [])
        self.node_cpu()  # empties the node CPU records
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=self.workdir,
                              timeout=PLAY_TIMEOUT, check=False)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        recap = dict((m.group(1), {"ok": int(m.group(2)), "changed": int(m.group(3)),
                                   "unreachable": int(m.group(4)), "failed": int(m.group(5))})
                     for m in RECAP.finditer(proc.stdout))
        hosts = [limit] if limit else self.hosts
        bad = [h for h in hosts if h not in recap or recap[h]["failed"] or recap[h]["unreachable"]]
        if proc.returncode != 0 or bad:
            raise simnodes.BenchError("%s failed (rc %d) on %s: %s" % (
                os.path.basename(playbook), proc.returncode, ", ".join(bad) or "-",
                (proc.stdout[-1500:] + proc.stderr[-500:]).strip()))
        tasks = dict((m.group(1).strip(), float(m.group(2))) for m in TASK_TIME.finditer(proc.stdout))
        return PlayRun(wall, cpu, self.node_cpu(), recap, tasks, changed_tasks(proc.stdout))

    def node_cpu(self):
        """Seconds of CPU the module runs took on the node side since the last call (records removed)."""
        total = 0.0
        for name in os.listdir(self.node_cpu_dir):
            path = os.path.join(self.node_cpu_dir, name)
            with open(path) as handle:
                total += sum(int(m) * 60 + float(s) for m, s in TIMES.findall(handle.read()))
            os.unlink(path)
        return total

    def reset(self):
        """Cold nodes: simulated reboot (no VFs, no vGPUs), empty logs, no boot files."""
        for host, node in zip(self.hosts, self.nodes):
            node.ctl("reboot")
            node.clear_log()
            shutil.rmtree(self.install_root(host), ignore_errors=True)

    def expected(self, node):
        types = dict((simnodes.type_id(MODEL, p), n) for p, n in self.profiles.items())
        return dict((pf, types) for pf in node.pfs())

    def check_converged(self, label):
        """Every host has the layout; returns the most writes one host got, by attribute name."""
        most = {}
        for node in self.nodes:
            simnodes.assert_layout(node, self.expected(node), label)
            by_name = simnodes.write_counts(node)["by_name"]
            if sum(by_name.values()) > sum(most.values()):
                most = by_name
        return most

    def minimum_writes(self):
        """Per host: one enable per PF (the sysfs part of sriov-manage aside) and one type per vGPU."""
        pfs = len(self.nodes[0].pfs())
        return {"sriov_numvfs": pfs, "current_vgpu_type": pfs * sum(self.profiles.values())}


def _workdir(parent, name):
    path = os.path.join(parent, name)
    os.makedirs(path)
    return path


def run_p2(settings, tmp):
    """Converge once (untimed), then alternate: nodes.yml (no-op) and the ping playbook."""
    profiles = {"L40S-1Q": 32}
    with simnodes.mounted(["%s:%d" % (MODEL, settings.gpus)]) as nodes:
        fleet = Fleet(nodes, profiles, _workdir(tmp, "p2"))
        fleet.reset()
        fleet.run(NODES_PLAYBOOK, 1)
        fleet.check_converged("P2 converge")
        node_s, ping_s, writes, changed, changed_names = [], [], [], [], []
        for dummy in range(settings.runs["p2"]):
            nodes[0].clear_log()
            play = fleet.run(NODES_PLAYBOOK, 1)
            node_s.append(play.wall)
            changed.append(play.recap[fleet.hosts[0]]["changed"])
            changed_names.extend(name for name in play.changed if name not in changed_names)
            writes.append(simnodes.write_counts(nodes[0])["total"])
            simnodes.assert_layout(nodes[0], fleet.expected(nodes[0]), "P2 re-run")
            ping_s.append(fleet.run(fleet.ping, 1).wall)
        # one more no-op run, untimed in the table, for where the time goes (per-task seconds)
        tasks = fleet.run(NODES_PLAYBOOK, 1, profile=True).tasks
    ratio = stats.ratio_summary(node_s, ping_s)
    return {"gpus": settings.gpus, "profiles": profiles, "runs": settings.runs["p2"], "scan": pidns.scan_state(),
            "node_playbook_s": stats.summary(node_s), "ping_playbook_s": stats.summary(ping_s),
            "ratio": ratio, "writes": max(writes), "tasks_changed": max(changed),
            "changed_task_names": changed_names, "task_seconds": tasks,
            "target_ratio": 2.0, "met": stats.within(ratio["median"], 2.0) and max(writes) == 0 and max(changed) == 0}


def run_p4(settings, tmp):
    """Per fleet size: cold converges (before the first, an untimed one-host run warms the caches)."""
    profiles = {"L40S-24Q": 2}
    sizes = {}
    for position, hosts in enumerate(settings.fleet):
        forks = max(1, hosts // settings.forks_ratio)
        with simnodes.mounted(["%s:%d" % (MODEL, settings.gpus_p4)] * hosts) as nodes:
            fleet = Fleet(nodes, profiles, _workdir(tmp, "p4-%d" % hosts))
            if position == 0:
                fleet.reset()
                fleet.run(NODES_PLAYBOOK, 1, limit=fleet.hosts[0])
            wall, cpu, ping_cpu, controller, ping_controller = [], [], [], [], []
            for dummy in range(settings.runs["p4"]):
                fleet.reset()
                play = fleet.run(NODES_PLAYBOOK, forks)
                writes = fleet.check_converged("P4 %d hosts" % hosts)
                wall.append(play.wall)
                cpu.append(play.cpu)
                controller.append(play.cpu - play.node_cpu)
                # P4b's baseline, same fleet and forks: what Ansible itself costs per host
                ping = fleet.run(fleet.ping, forks)
                ping_cpu.append(ping.cpu)
                ping_controller.append(ping.cpu - ping.node_cpu)
            minimum = fleet.minimum_writes()
        sizes[str(hosts)] = {"hosts": hosts, "forks": forks, "wall_s": stats.summary(wall),
                             "per_host_s": stats.summary([w / hosts for w in wall]),
                             "per_host_per_fork_s": stats.summary([w * forks / hosts for w in wall]),
                             "cpu_per_host_s": stats.summary([c / hosts for c in cpu]),
                             "ping_cpu_per_host_s": stats.summary([c / hosts for c in ping_cpu]),
                             "controller_cpu_per_host_s": stats.summary([c / hosts for c in controller]),
                             "ping_controller_cpu_per_host_s": stats.summary([c / hosts for c in ping_controller]),
                             "cpu_over_ping": stats.ratio_summary(cpu, ping_cpu),
                             "controller_cpu_over_ping": stats.ratio_summary(controller, ping_controller),
                             "writes_per_host_most": writes, "writes_per_host_min": minimum}
    first, last = sizes[str(settings.fleet[0])], sizes[str(settings.fleet[-1])]
    growth = stats.ratio_of_medians(last["per_host_s"], first["per_host_s"])
    cpu_growth = stats.ratio_of_medians(last["cpu_per_host_s"], first["cpu_per_host_s"])
    cpu_over_ping = max(size["controller_cpu_over_ping"]["median"] for size in sizes.values())
    controller_growth = stats.ratio_of_medians(last["controller_cpu_per_host_s"], first["controller_cpu_per_host_s"])
    return {"gpus_per_host": settings.gpus_p4, "profiles": profiles, "forks_ratio": settings.forks_ratio,
            "cpu_over_ping_most": cpu_over_ping, "target_cpu_over_ping": 3.0,
            "controller_cpu_per_host_growth": controller_growth,
            "met_cpu_over_ping": stats.within(cpu_over_ping, 3.0) and stats.within(controller_growth, 1.2),
            "runs": settings.runs["p4"], "sizes": sizes, "per_host_growth": growth,
            "per_host_per_fork_growth": stats.ratio_of_medians(last["per_host_per_fork_s"],
                                                               first["per_host_per_fork_s"]),
            "cpu_per_host_growth": cpu_growth, "target_growth": 1.2,
            # wall/host alone flatters big fleets on a machine with more cores than the small fleet's
            # forks; CPU/host shows cost that grows with the fleet whatever the core count
            "met": stats.within(growth, 1.2) and stats.within(cpu_growth, 1.2)}


def run(settings, part):
    with tempfile.TemporaryDirectory(prefix="bench-%s-" % part) as tmp:
        return (run_p2 if part == "p2" else run_p4)(settings, tmp)
