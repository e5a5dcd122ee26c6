"""A Kubernetes API server double for the cluster-side tests, run as its own process.

    python tests/fakes/kmock_serve.py [--port N]      # prints "ready <port>" once listening

kmock 0.8's KubernetesEmulator (pinned: this subclasses its private API) extended with what
real API servers do and the tests rely on:
- every PATCH/PUT bumps metadata.resourceVersion; a write carrying a stale resourceVersion -> 409;
- `?dryRun=All` computes and returns the result without storing it;
- a request log (method, path, dryRun, content type, auth scheme, impersonation headers) so tests
  can prove check mode mutates nothing and how the client authenticated.

Test controls (JSON over HTTP, never logged):
    POST /_ctl/reset     {"resources": {"kubevirt.io/v1/kubevirts": {"kind": ..., "namespaced": true}},
                          "objects": [{"resource": ..., "namespace": ..., "name": ..., "body": {...}}]}
    POST /_ctl/conflict  {"count": 1, "patch": {...}}  the next `count` writes lose a race: the stored
                          object first gets `patch` (merge) and a new resourceVersion, then 409
    POST /_ctl/forbid    {"method": "PATCH", "plural": "kubevirts"}  -> 403 for matching requests
    GET  /_ctl/log       the request log;  POST /_ctl/log/clear
    GET  /_ctl/object?resource=...&namespace=...&name=...   the stored object
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import itertools
import signal
import sys

import aiohttp.web
from kmock import KubernetesEmulator, ResourceInfo, Server
from kmock._internal.dicts import patch_dict
from kmock._internal import parsing
from kmock._internal.k8s import KubernetesError, KubernetesObjectNotFoundError

WRITE_METHODS = ("POST", "PUT", "PATCH", "DELETE")
_KMOCK_PARSE_PATH = parsing.parse_path


def _parse_path(path):
    """kmock 0.8 reads /api/v1/namespaces[/NAME] as a namespace prefix without a resource (404/500);
    a real API server serves the Namespace objects there."""
    parts = path.strip("/").split("/")
    if parts[:3] == ["api", "v1", "namespaces"] and len(parts) <= 4:
        return parsing.ParsedPath("", "v1", "namespaces", None, parts[3] if len(parts) == 4 else None, None)
    return _KMOCK_PARSE_PATH(path)


parsing.parse_path = _parse_path


class StrictEmulator(KubernetesEmulator):
    """KubernetesEmulator with resourceVersion bumps, 409s, dry runs, a request log and controls."""

    def __attrs_post_init__(self):
        super().__attrs_post_init__()
        self.request_log = []
        self.conflicts = {"count": 0, "patch": None}
        self.forbidden = []
        self.versions = itertools.count(1000)

    # --- controls ---------------------------------------------------------------------------
    async def _control(self, request, method):
        path = request.url.path
        data = request.data if isinstance(request.data, dict) else {}
        if path == "/_ctl/log" and method == "GET":
            return aiohttp.web.json_response(self.request_log)
        if path == "/_ctl/log/clear":
            self.request_log.clear()
        elif path == "/_ctl/reset":
            self._reset(data)
        elif path == "/_ctl/conflict":
            self.conflicts = {"count": int(data.get("count", 1)), "patch": data.get("patch")}
        elif path == "/_ctl/forbid":
            self.forbidden.append({"method": data["method"].upper(), "plural": data["plural"]})
        elif path == "/_ctl/object":
            key = (request.params["resource"], request.params.get("namespace") or None, request.params["name"])
            try:
                stored = self.objects[key]  # `in` does not parse a "group/version/plural" string key
            except KeyError:
                stored = None
            if stored is None or stored.deleted:
                return aiohttp.web.json_response(None, status=404)
            return aiohttp.web.json_response(stored.raw)
        else:
            return aiohttp.web.json_response({"error": "unknown control " + path}, status=400)
        return aiohttp.web.json_response({"ok": True})

    def _reset(self, state):
        self.objects.clear()
        self.resources.clear()
        self.request_log.clear()
        self.forbidden.clear()
        self.conflicts = {"count": 0, "patch": None}
        for key, info in (state.get("resources") or {}).items():
            self.resources[key] = ResourceInfo(**info)
        for item in state.get("objects") or []:
            body = copy.deepcopy(item["body"])
            body.setdefault("metadata", {}).setdefault("resourceVersion", "1")
            self.objects[item["resource"], item.get("namespace"), item["name"]] = body

    # --- request handling ---------------------------------------------------------------------
    async def _handle(self, request):
        method = str(getattr(request.method, "value", request.method)).upper()
        if request.url.path.startswith("/_ctl/"):
            return await self._control(request, method)
        self.request_log.append({"method": method, "path": request.url.path,
                                 "dryRun": request.params.get("dryRun"),
                                 "contentType": request.headers.get("Content-Type"),
                                 # the scheme only: tests check how we authenticate, never the secret
                                 "auth": (request.headers.get("Authorization") or "").split(" ")[0] or None,
                                 "impersonate": [request.headers.get("Impersonate-User"),
                                                 request.headers.get("Impersonate-Group")]})
        plural = request.resource.plural if request.resource is not None else None
        if any(rule["method"] == method and rule["plural"] == plural for rule in self.forbidden):
            raise KubernetesError(status=403, reason="Forbidden",
                                  message='%s "%s" is forbidden: User "system:serviceaccount:test:ansible" cannot %s '
                                          'resource "%s"' % (plural, request.name, method.lower(), plural))
        if request.resource is not None and request.name and method in ("PATCH", "PUT"):
            return await self._write(request, method)
        return await super()._handle(request)

    async def _write(self, request, method):
        key = (request.resource, request.namespace, request.name)
        if key not in self.objects or self.objects[key].deleted:
            raise KubernetesObjectNotFoundError()
        stored = self.objects[key]
        if self.conflicts["count"] > 0:
            # Someone else wrote between our client's read and its write.
            self.conflicts["count"] -= 1
            stored.patch(copy.deepcopy(self.conflicts["patch"] or {}))
            stored.patch({"metadata": {"resourceVersion": str(next(self.versions))}})
        data = request.data
        current = stored.get("metadata", {}).get("resourceVersion")
        wanted = data.get("metadata", {}).get("resourceVersion") if isinstance(data, dict) else None
        if wanted is not None and wanted != current:
            raise KubernetesError(status=409, reason="Conflict",
                                  message="Operation cannot be fulfilled on %s \"%s\": the object has been modified; "
                                          "please apply your changes to the latest version and try again"
                                          % (request.resource.plural, request.name))
        if method == "PUT":
            result = copy.deepcopy(data)
        else:
            result = patch_dict(copy.deepcopy(stored.raw), copy.deepcopy(data))
        if request.params.get("dryRun") == "All":
            return aiohttp.web.json_response(result)
        result.setdefault("metadata", {})["resourceVersion"] = str(next(self.versions))
        stored.create(result)
        return aiohttp.web.json_response(stored.raw)


async def serve(port):
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    emulator = StrictEmulator()
    async with emulator, Server(emulator, host="127.0.0.1", port=port) as server:
        print("ready %d" % server.port, flush=True)
        await stop.wait()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=None, help="TCP port on 127.0.0.1 (default: a free one)")
    args = parser.parse_args(argv)
    try:
        asyncio.run(serve(args.port))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
