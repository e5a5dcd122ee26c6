# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Follow one Node through the API server: list, then watch from the list's resourceVersion.

A watch ends for ordinary reasons (the server's timeoutSeconds, an API server restart, a dropped
connection): it is resumed from the last resourceVersion seen (events and BOOKMARKs carry one). A
resourceVersion older than the server's history gives an ERROR event with a Status of code 410:
then the node is listed again and watched from the new list's resourceVersion. Failures, and
streams that end at once without an event, wait a bounded exponential backoff with jitter first,
so a broken server is never hammered; a stream that delivered something resets the backoff.
"""

from __future__ import annotations

import json
import random
import threading
import time

from ansible_collections.accelops.vgpu.plugins.module_utils.agent.kube import KubeApiError, KubeUnavailable, retry_after, retry_delay

SHORT_STREAM = 1.0  # seconds: a watch that ends sooner without an event counts as a failure


class Backoff:
    """Delays base, 2*base, 4*base ... capped at `cap`, each stretched by up to `jitter` (a fraction)."""

    def __init__(self, base=1.0, cap=30.0, jitter=0.2, rand=random.random):
        self.base, self.cap, self.jitter, self.rand = base, cap, jitter, rand
        self.failures = 0

    def next(self):
        delay = min(self.cap, self.base * (2 ** self.failures))
        self.failures = min(self.failures + 1, 32)
        return delay * (1.0 + self.jitter * self.rand())

    def reset(self):
        self.failures = 0


class Gone(Exception):
    """The watch's resourceVersion is older than the server's history (410): relist."""


class NodeWatcher:
    """Calls `on_node(node_or_None)` for the node as listed and for every change the watch reports.

    `run()` loops until `stop` (a threading.Event) is set; meant for a daemon thread.
    """

    def __init__(self, api, node_name, on_node, stop=None, watch_timeout=300, backoff=None, log=None,
                 clock=time.monotonic):
        self.api, self.node_name, self.on_node = api, node_name, on_node
        self.stop = stop or threading.Event()
        self.watch_timeout = watch_timeout
        self.backoff = backoff or Backoff()
        self.log = log or (lambda message: None)
        self.clock = clock
        self.resource_version = None
        self.relists = 0

    def run(self):
        while not self.stop.is_set():
            try:
                if self.resource_version is None:
                    self._list()
                healthy = self._watch_once()
                if self.stop.is_set():
                    return
                if healthy:
                    self.backoff.reset()
                    continue
                delay = self.backoff.next()
            except Gone:
                self.log("watch of node %s: resourceVersion %s is too old (410), listing again"
                         % (self.node_name, self.resource_version))
                self.resource_version = None
                delay = self.backoff.next() if self.relists > 1 else 0
            except (KubeApiError, KubeUnavailable) as exc:
                self.log("watch of node %s: %s" % (self.node_name, exc))
                delay = retry_delay(exc, self.backoff.next())
            except Exception as exc:  # pylint: disable=broad-exception-caught
                # a surprise (an odd event shape) must not end the only thread that sees label changes
                self.log("watch of node %s: unexpected %s: %s; listing again" % (self.node_name, type(exc).__name__, exc))
                self.resource_version = None
                delay = self.backoff.next()
            if delay:
                self.stop.wait(delay)

    def _list(self):
        node, version = self.api.list_node(self.node_name)
        self.relists += 1
        if node is None:
            self.log("node %s does not exist (yet); watching for it" % self.node_name)
        self.on_node(node)
        self.resource_version = version

    def _watch_once(self):
        """One watch stream; True when it was healthy (delivered an event, or lasted a while)."""
        started, delivered = self.clock(), False
        for event in self.api.watch_node(self.node_name, self.resource_version, self.watch_timeout):
            if self.stop.is_set():
                return True
            kind, obj = event.get("type"), event.get("object") or {}
            if kind == "ERROR":
                if obj.get("code") == 410:
                    raise Gone()
                raise KubeApiError("watch of node %s: %s" % (self.node_name, obj.get("message") or obj),
                                   obj.get("code"), obj.get("reason"), retry_after(None, json.dumps(obj)))
            version = (obj.get("metadata") or {}).get("resourceVersion")
            if version:
                self.resource_version = version
            delivered = True
            self.relists = 0
            if kind in ("ADDED", "MODIFIED"):
                self.on_node(obj)
            elif kind == "DELETED":
                self.log("node %s was deleted" % self.node_name)
                self.on_node(None)
        return delivered or self.clock() - started >= SHORT_STREAM
