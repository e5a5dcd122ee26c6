# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The agent's HTTP endpoint (METRICS_BIND_ADDRESS:METRICS_PORT), a daemon thread with the standard library:

    GET /metrics   Prometheus text format 0.0.4 (telemetry.Telemetry's registry)
    GET /healthz   200 "ok", or 503 with the reason (liveness: the reconcile loop or the node watch is stuck)
    GET /readyz    200 "ok" once a reconcile succeeded, else 503

Everything else is 404; only GET and HEAD are served. Nothing here reads the node: a scrape costs no sysfs access.
"""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from ansible_collections.accelops.vgpu.plugins.module_utils.agent.metrics import CONTENT_TYPE


class _Handler(BaseHTTPRequestHandler):
    telemetry = None  # set on the per-server subclass
    server_version = "accelops-vgpu-agent"

    def _answer(self, body=True):
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            status, ctype, text = 200, CONTENT_TYPE, self.telemetry.registry.render()
        elif path in ("/healthz", "/livez"):
            ok, why = self.telemetry.health.live()
            status, ctype, text = (200 if ok else 503), "text/plain; charset=utf-8", why + "\n"
        elif path == "/readyz":
            ok, why = self.telemetry.health.readiness()
            status, ctype, text = (200 if ok else 503), "text/plain; charset=utf-8", why + "\n"
        else:
            status, ctype, text = 404, "text/plain; charset=utf-8", "not found\n"
        data = text.encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)

    def do_GET(self):  # noqa: N802 (http.server's naming)
        self._answer()

    def do_HEAD(self):  # noqa: N802
        self._answer(body=False)

    def log_message(self, *args):  # scrapes and probes every few seconds: not worth a log line
        pass


class HttpEndpoint:
    def __init__(self, telemetry, address, port):
        handler = type("Handler", (_Handler,), {"telemetry": telemetry})
        server_class = ThreadingHTTPServer
        if ":" in address:  # an IPv6 address ("::" for every address)
            server_class = type("Server6", (ThreadingHTTPServer,), {"address_family": socket.AF_INET6})
        self.server = server_class((address, int(port)), handler)
        self.server.daemon_threads = True
        self.address, self.port = self.server.server_address[:2]
        self.thread = threading.Thread(target=self.server.serve_forever, name="http-endpoint", daemon=True)

    def start(self):
        self.thread.start()
        return self

    def stop(self):
        self.server.shutdown()
        self.server.server_close()
