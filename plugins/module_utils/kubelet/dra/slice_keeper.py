# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Puts this node's ResourceSlices back when someone else deletes them while nothing on the node changed.

The kubelet deletes every ResourceSlice of its node, all drivers, when it starts, and registers the plugins
again (kubernetes pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go, NewDRAPluginManager -> wipeResourceSlices,
run in the background, so it may come before or after the registration); it also deletes a driver's slices when
no plugin of that driver is connected for a while. The kubeletplugin helper's slice controller notices and
re-creates them after DefaultSyncDelay, 30 s (dynamic-resource-allocation resourceslice/resourceslicecontroller.go).
Here:

    keeper = SliceKeeper(api, node_name, driver, republish, log).start()
    keeper.resync(delay=0.0)    # republish after `delay` s (the kubelet registered the plugin: at once)
    keeper.stop()

- a watch of this node's slices of the driver (field selectors spec.nodeName, spec.driver) asks for a republish
  RESYNC_DELAY s after the last deletion it sees (the kubelet deletes the whole collection: one republish);
  a watch that breaks or expires is opened again (after WATCH_RETRY s when it failed) and asks for one too, a
  deletion may have passed unseen;
- `republish()` is the plugin's: a listing publish of the devices last published, which writes only what is
  missing or different (a deletion of our own, a shrinking pool, costs one LIST); one that fails
  (KubeApiError, KubeUnavailable) is tried again after WATCH_RETRY s.
"""

from __future__ import annotations

import threading
import time

from ansible_collections.accelops.vgpu.plugins.module_utils.kube_errors import KubeApiError, KubeUnavailable

RESYNC_DELAY = 1.0      # seconds from the last deletion seen to the republish
WATCH_RETRY = 5.0       # seconds before a failed watch or republish is tried again
WATCH_TIMEOUT = 300     # seconds a watch request lasts before it is opened again


class SliceKeeper:
    def __init__(self, api, node_name, driver, republish, log, clock=time.monotonic):
        self.api, self.node_name, self.driver, self.republish, self.log = api, node_name, driver, republish, log
        self.clock = clock
        self._changed = threading.Condition()
        self._due = None            # clock time of the next republish; None: none asked for
        self._stopped = False

    def start(self):
        threading.Thread(target=self._watch_loop, name="dra-slice-watch", daemon=True).start()
        threading.Thread(target=self._resync_loop, name="dra-slice-resync", daemon=True).start()
        return self

    def stop(self):
        with self._changed:
            self._stopped = True
            self._changed.notify_all()

    def resync(self, delay=0.0):
        """Republish `delay` s from now: a deletion pushes a pending republish to its own delay (one after the
        last of a collection), an immediate request brings it forward."""
        with self._changed:
            at = self.clock() + delay
            self._due = at if self._due is None or delay > 0 else min(self._due, at)
            self._changed.notify_all()

    def _sleep(self, seconds):
        """False once stopped."""
        with self._changed:
            if not self._stopped:
                self._changed.wait(seconds)
            return not self._stopped

    def _resync_loop(self):
        while True:
            with self._changed:
                while not self._stopped and (self._due is None or self.clock() < self._due):
                    self._changed.wait(None if self._due is None else max(0.0, self._due - self.clock()))
                if self._stopped:
                    return
                self._due = None
            try:
                self.republish()
            except (KubeApiError, KubeUnavailable) as exc:
                self.log("DRA driver: cannot publish the ResourceSlices of node %s again: %s; trying again in %.0f s"
                         % (self.node_name, exc, WATCH_RETRY))
                self.resync(WATCH_RETRY)

    def _watch_loop(self):
        version, failed = None, False
        while not self._stopped:
            try:
                for event in self.api.watch_resource_slices(self.node_name, self.driver, version, WATCH_TIMEOUT):
                    if self._stopped:
                        return
                    if failed:
                        failed = False
                        self.log("DRA driver: watching the ResourceSlices of node %s again" % self.node_name)
                    kind, obj = event.get("type"), event.get("object") or {}
                    if kind == "ERROR":     # 410 Expired: the version is gone; watch from now, check what was missed
                        version = None
                        self.resync(RESYNC_DELAY)
                        break
                    version = (obj.get("metadata") or {}).get("resourceVersion") or version
                    if kind == "DELETED":
                        self.resync(RESYNC_DELAY)
            except (KubeApiError, KubeUnavailable) as exc:
                if not failed:
                    self.log("DRA driver: cannot watch the ResourceSlices of node %s: %s; trying again every %.0f s"
                             % (self.node_name, exc, WATCH_RETRY))
                failed, version = True, None
                if not self._sleep(WATCH_RETRY):
                    return
                self.resync(RESYNC_DELAY)   # a deletion may have passed while the watch was down
