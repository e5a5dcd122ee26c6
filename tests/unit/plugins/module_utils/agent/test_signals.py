"""The agent's SIGTERM/SIGINT handling (agent.relay_signals): a signal never waits for a lock its own thread holds."""

import signal
import threading

from ansible_collections.accelops.vgpu.plugins.module_utils.agent import agent


def test_a_signal_that_arrives_while_the_thread_holds_the_events_lock_still_stops_the_agent():
    """Event.wait holds the event's condition lock for a moment at every wake-up; a signal handler runs in that
    thread. The old handler (Agent.shutdown: Event.set, which takes the same lock) hung there for good; the
    handler now only writes to a pipe and a relay thread sets the event once the lock is free."""
    stop = threading.Event()
    previous = agent.relay_signals(stop.set, signals=(signal.SIGUSR1,))
    try:
        handler = signal.getsignal(signal.SIGUSR1)

        def interrupted_in_event_wait():
            with stop._cond:        # where Event.wait holds it when the signal comes
                handler(signal.SIGUSR1, None)
                held = stop.is_set()
            return held
        waiter = threading.Thread(target=interrupted_in_event_wait, daemon=True)
        waiter.start()
        waiter.join(5)
        assert not waiter.is_alive(), "the handler waited for a lock its own thread holds"
        assert stop.wait(5)
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def test_a_real_signal_stops_the_agent_loop():
    stop = threading.Event()
    previous = agent.relay_signals(stop.set, signals=(signal.SIGUSR2,))
    try:
        signal.raise_signal(signal.SIGUSR2)
        assert stop.wait(5)
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
