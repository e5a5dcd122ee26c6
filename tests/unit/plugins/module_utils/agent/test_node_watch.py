import threading

from ansible_collections.accelops.vgpu.plugins.module_utils.agent import node_watch as nw
from ansible_collections.accelops.vgpu.plugins.module_utils.agent.kube import KubeUnavailable


def node(version, config=None):
    labels = {"nvidia.com/vgpu.config": config} if config else {}
    return {"metadata": {"name": "gpu-a", "resourceVersion": str(version), "labels": labels}}


class FakeApi:
    """Scripted answers: `watches` is a list of event lists or exceptions, one per watch call."""

    def __init__(self, watches, stop):
        self.watches, self.stop = list(watches), stop
        self.calls = []

    def list_node(self, name):
        self.calls.append(("list", name))
        return node(5), "100"

    def watch_node(self, name, version, timeout):
        self.calls.append(("watch", version))
        if not self.watches:
            self.stop.set()
            return
        item = self.watches.pop(0)
        if isinstance(item, Exception):
            raise item
        yield from item


def run(watches, clock=None):
    stop = threading.Event()
    api = FakeApi(watches, stop)
    seen, delays = [], []
    watcher = nw.NodeWatcher(api, "gpu-a", seen.append, stop, backoff=nw.Backoff(rand=lambda: 0.0),
                             clock=clock or (lambda: 0.0))
    watcher.stop.wait = delays.append  # record the delay instead of sleeping
    watcher.run()
    return api.calls, seen, delays


def test_a_watch_is_resumed_from_the_last_resource_version_and_bookmarks_count():
    calls, seen, delays = run([
        [{"type": "MODIFIED", "object": node(101, "a")}],
        [{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "150"}}}],
    ])
    assert calls == [("list", "gpu-a"), ("watch", "100"), ("watch", "101"), ("watch", "150")]
    assert [n["metadata"]["resourceVersion"] for n in seen] == ["5", "101"]
    assert delays == []  # streams that delivered something resume at once


def test_410_relists_and_watches_from_the_new_list():
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}
    calls, seen, dummy = run([[{"type": "MODIFIED", "object": node(101)}], [gone]])
    assert calls == [("list", "gpu-a"), ("watch", "100"), ("watch", "101"), ("list", "gpu-a"), ("watch", "100")]
    assert len(seen) == 3  # listed, modified, listed again


def test_failures_and_empty_streams_back_off_exponentially_never_hot_looping():
    down = KubeUnavailable("refused")
    calls, dummy, delays = run([down, down, [], down, [{"type": "MODIFIED", "object": node(101)}], down])
    assert delays == [1.0, 2.0, 4.0, 8.0, 1.0]  # an empty, instant stream counts as a failure; events reset
    assert calls.count(("list", "gpu-a")) == 1


def test_backoff_is_capped_and_jittered_upwards_only():
    backoff = nw.Backoff(base=1.0, cap=30.0, jitter=0.2, rand=lambda: 1.0)
    assert [round(backoff.next(), 3) for dummy in range(7)] == [1.2, 2.4, 4.8, 9.6, 19.2, 36.0, 36.0]
    backoff.reset()
    assert backoff.next() == 1.2


def test_an_odd_event_does_not_end_the_watcher_it_relists_after_a_backoff():
    calls, seen, delays = run([[{"type": "MODIFIED", "object": "not a node"}]])
    assert calls == [("list", "gpu-a"), ("watch", "100"), ("list", "gpu-a"), ("watch", "100")]
    assert delays == [1.0] and len(seen) == 2


def test_a_429_with_retry_after_waits_at_least_what_the_server_asked():
    from ansible_collections.accelops.vgpu.plugins.module_utils.agent.kube import KubeApiError
    throttled = KubeApiError("GET /api/v1/nodes: Too many requests", 429, "TooManyRequests", retry_after=7.0)
    calls, dummy, delays = run([throttled, KubeUnavailable("refused")])
    assert delays == [7.0, 2.0]     # the server's 7 s, not our 1 s; then our own backoff goes on
