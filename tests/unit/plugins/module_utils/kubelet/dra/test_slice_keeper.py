"""The SliceKeeper (kubelet/dra/slice_keeper.py): republish at once when asked (the kubelet registered the plugin),
a second after the last deletion its watch sees, and again after a broken watch or a failed republish."""

from __future__ import annotations

import queue
import threading
import time

from ansible_collections.accelops.vgpu.plugins.module_utils.kube_errors import KubeUnavailable
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import slice_keeper
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.slice_keeper import SliceKeeper


class WatchApi:
    """watch_resource_slices yields what the test puts in `events` (an exception is raised)."""

    def __init__(self):
        self.events, self.watches = queue.Queue(), []

    def watch_resource_slices(self, node_name, driver, resource_version, timeout_seconds):
        self.watches.append((node_name, driver, resource_version))
        while True:
            event = self.events.get()
            if isinstance(event, Exception):
                raise event
            if event is None:
                return
            yield event


def deleted(name, version):
    return {"type": "DELETED", "object": {"metadata": {"name": name, "resourceVersion": version}}}


def keeper_with(api, fail=0):
    calls, lock = [], threading.Lock()

    def republish():
        with lock:
            calls.append(time.monotonic())
            if len(calls) <= fail:
                raise KubeUnavailable("the API server is away")

    keeper = SliceKeeper(api, "gpu-a", "vgpu.accelops.io", republish, lambda line: None).start()
    return keeper, calls


def wait_until(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.02)
    return predicate()


def test_a_registration_republishes_at_once_and_a_wipe_once_a_second_after_its_last_delete():
    api = WatchApi()
    keeper, calls = keeper_with(api)
    try:
        asked = time.monotonic()
        keeper.resync()
        assert wait_until(lambda: calls) and calls[0] - asked < 0.5
        wiped = time.monotonic()
        for index in range(3):                      # a DeleteCollection: one event per slice
            api.events.put(deleted("gpu-a-vgpu.accelops.io-%d" % index, str(10 + index)))
        assert wait_until(lambda: len(calls) == 2)
        assert calls[1] - wiped >= slice_keeper.RESYNC_DELAY * 0.9
        time.sleep(slice_keeper.RESYNC_DELAY * 1.5)
        assert len(calls) == 2                      # one republish for the whole collection
        assert api.watches == [("gpu-a", "vgpu.accelops.io", None)]
    finally:
        keeper.stop()
        api.events.put(None)


def test_a_broken_watch_is_opened_again_and_a_failed_republish_tried_again(monkeypatch):
    monkeypatch.setattr(slice_keeper, "WATCH_RETRY", 0.2)
    monkeypatch.setattr(slice_keeper, "RESYNC_DELAY", 0.1)
    api = WatchApi()
    keeper, calls = keeper_with(api, fail=1)
    try:
        api.events.put(deleted("gpu-a-vgpu.accelops.io-0", "11"))
        api.events.put(KubeUnavailable("watch of ResourceSlices of node gpu-a broke"))
        assert wait_until(lambda: len(calls) >= 2)   # the first failed, the retry went through
        assert wait_until(lambda: len(api.watches) == 2) and api.watches[1][2] is None
    finally:
        keeper.stop()
        api.events.put(None)
