"""The agent's holder watch (agent.Agent._holders_freed) while a refused layout stays refused for hours: bounded
work and no log line per check when the same answer comes back every HOLDER_POLL seconds."""

from __future__ import annotations

import argparse

from ansible_collections.accelops.vgpu.plugins.module_utils.agent import agent as agent_module
from ansible_collections.accelops.vgpu.plugins.module_utils.agent import settings as agent_settings
from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError
from ansible_collections.accelops.vgpu.plugins.module_utils.node.layout.vgpu_layout import LayoutError

VF = "0000:41:00.4"


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class Record:
    def __init__(self):
        self.syncs = 0

    def sync(self):
        self.syncs += 1
        return True


class Plugin:
    def __init__(self):
        self.allocations = Record()


class InUse:
    def __init__(self, answer):
        self.answer = answer
        self.forgotten = 0

    def forget(self):
        self.forgotten += 1

    def recheck(self, names, name_holders=True):
        if isinstance(self.answer, Exception):
            raise self.answer
        return dict((name, self.answer) for name in names if self.answer)


class Engine:
    def __init__(self, answer):
        self.in_use = InUse(answer)


def watching_agent(tmp_path, monkeypatch, answer):
    settings = agent_settings.resolve(argparse.Namespace(), dict(
        NODE_NAME="node-1", DEFAULT_VGPU_CONFIG="default", CONFIG_FILE=str(tmp_path / "config.yaml"),
        NAMESPACE="vgpu-agent",
        ACCELOPS_VGPU_SYSFS_ROOT=str(tmp_path), STATUS_FILE=str(tmp_path / "status.json"),
        KUBELET_DIR=str(tmp_path / "kubelet")))
    clock, lines = Clock(), []
    monkeypatch.setattr(agent_module, "log", lines.append)
    agent = agent_module.Agent(settings, None, "vgpu-agent", clock=clock, device_plugin=Plugin())
    engine = agent.reconcile_engine = Engine(answer)     # the refused reconcile's

    def no_engine(*dummy):
        raise AssertionError("a node engine built for a holder check")
    agent.engine = no_engine
    agent.refused_by, agent.next_holder_check = {VF}, clock.now
    return agent, clock, lines, engine


def watch_for(agent, clock, seconds):
    freed = []
    for dummy in range(int(seconds / agent_module.HOLDER_POLL)):
        freed.append(agent._holders_freed("default"))
        clock.now += agent_module.HOLDER_POLL
    return freed


def test_an_error_that_stays_is_logged_once_not_every_check(tmp_path, monkeypatch):
    # a damaged DRA checkpoint or allocation record (a holder source raises): unsure is held, checked every 2 s
    damaged = EngineError("allocation record /var/lib/kubelet/x.json: checksum mismatch")
    agent, clock, lines, engine = watching_agent(tmp_path, monkeypatch, damaged)
    assert watch_for(agent, clock, 3600) == [False] * 1800
    assert agent.device_plugin.allocations.syncs == 1800
    assert len(lines) == 1 and "cannot tell whether the vGPUs that refused it are free" in lines[0], lines[:3]
    engine.in_use.answer = EngineError("another error")          # a new answer is told once
    watch_for(agent, clock, 10)
    assert len(lines) == 2 and "another error" in lines[1]
    engine.in_use.answer = []                                      # free: reconciled, told once
    assert watch_for(agent, clock, 2) == [True]
    assert "no longer held; reconciling" in lines[-1]


def test_a_holder_that_stays_costs_one_check_per_poll_and_no_line(tmp_path, monkeypatch):
    agent, clock, lines, engine = watching_agent(tmp_path, monkeypatch, ["VFIO group 7 is open"])
    assert watch_for(agent, clock, 600) == [False] * 300
    assert lines == [] and agent.device_plugin.allocations.syncs == 300
    assert engine.in_use.forgotten == 300       # the refused reconcile's holders, their device facts read again


def test_the_devices_watched_are_those_the_error_was_refused_for_not_those_its_text_contains(tmp_path, monkeypatch):
    agent, clock, lines, dummy = watching_agent(tmp_path, monkeypatch, [])
    other = "0000:41:00.5"
    agent._watch_holders("default", LayoutError("VF %s of GPU 0000:41:00.0 is held by a VM (pid 7)" % other,
                                                held=[other]))
    assert agent.refused_by == {other}
    # an error that names a held VF without being refused for it (the plan saw VF held): nothing to watch
    agent._watch_holders("default", LayoutError("GPU 0000:41:00.0: no free VF left for L40S-24Q (%s held)" % VF))
    assert agent.refused_by == set()
