"""Liveness and readiness of the agent, with a clock the test turns."""

from types import SimpleNamespace

from ansible_collections.accelops.vgpu.plugins.module_utils.agent.health import Health


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def make():
    clock = Clock()
    return Health(loop_limit=30, reconcile_limit=600, watch_limit=390, clock=clock), clock


def test_a_turning_loop_and_an_active_watch_are_alive_and_not_ready_until_a_success():
    health, clock = make()
    for dummy in range(20):
        clock.now += 20
        health.beat()
        health.watch_active()
    assert health.live() == (True, "ok")
    assert health.readiness() == (False, "no reconcile has succeeded yet")
    health.reconcile_started()
    health.reconcile_finished(False)
    assert health.readiness()[0] is False
    health.reconcile_started()
    health.reconcile_finished(True)
    health.reconcile_started()
    health.reconcile_finished(False)  # a later failure: still ready (the state label says failed)
    assert health.readiness() == (True, "ok")


def test_a_loop_that_stops_turning_is_not_alive():
    health, clock = make()
    clock.now += 31
    health.watch_active()
    assert health.live() == (False, "the reconcile loop has not turned for 31 s (limit 30 s)")


def test_a_long_reconcile_is_alive_until_its_limit():
    health, clock = make()
    health.reconcile_started()
    clock.now += 300
    health.watch_active()
    assert health.live() == (True, "ok")
    clock.now += 301
    health.watch_active()
    assert health.live() == (False, "a reconcile has run for 601 s (limit 600 s)")


def test_a_silent_watch_is_not_alive():
    health, clock = make()
    for dummy in range(40):
        clock.now += 10
        health.beat()
    assert health.live() == (False, "the node watch has been silent for 400 s (limit 390 s)")
    health.watch_active()
    assert health.live() == (True, "ok")


def test_limits_follow_the_settings():
    settings = SimpleNamespace(config_poll_interval=20.0, lock_timeout=100.0, wait_timeout=50.0,
                               operand_wait_timeout=30.0, watch_timeout=60.0)
    health = Health.for_settings(settings)
    assert (health.loop_limit, health.reconcile_limit, health.watch_limit) == (60.0, 300.0, 150.0)
    assert Health.for_settings(None).loop_limit == 30.0
