"""A Kubernetes API server double for the cluster-side tests, run as its own process.

    python tests/fakes/kmock_serve.py [--port N]      # prints "ready <port>" once listening

kmock 0.8's KubernetesEmulator (pinned: this subclasses its private API) extended with what
real API servers do and the tests rely on:
- every PATCH/PUT that changes the object bumps metadata.resourceVersion (a no-op write changes
  nothing and sends no watch event); a write carrying a stale resourceVersion -> 409;
- `?dryRun=All` computes and returns the result without storing it (PATCH, PUT and POST);
- PATCH with `application/json-patch+json` applies an RFC 6902 JSON patch (the `jsonpatch` package);
  a failed `test` op or a path that is not there -> 422, as the real API server answers
  (apiserver endpoints/handlers/patch.go: JSON patch errors are StatusUnprocessableEntity);
- a request log (method, path, dryRun, content type, auth scheme, impersonation headers, and for
  lists/watches the watch flag, resourceVersion and fieldSelector, with a time) so tests can prove
  check mode mutates nothing, how the client authenticated, and how often it asked;
- real list/watch semantics (kmock's own watch has no resourceVersion, history or timeout): one
  global resourceVersion counter bumped by every write, lists carrying the current one, watches
  (`?watch=true`) with `resourceVersion` (replayed from the kept event history; older than the
  history, or not known to this server, e.g. after a restart -> one ERROR event with a 410 `Expired`
  Status and the end of the stream), `fieldSelector=metadata.name=X`, `timeoutSeconds` (the server
  ends the stream) and `allowWatchBookmarks` (BOOKMARK events every `bookmark_interval` seconds
  when that control is set); lists also narrow by `fieldSelector=spec.nodeName=X` and a
  `labelSelector` of `key=value` terms;
- optional HTTPS (`--tls-cert/--tls-key`, a CA the test made) and Bearer-token checking
  (`--token`; 401 otherwise; the scheme is matched case-insensitively as real servers do).

Test controls (JSON over HTTP, never logged):
    POST /_ctl/reset     {"resources": {"kubevirt.io/v1/kubevirts": {"kind": ..., "namespaced": true}},
                          "objects": [{"resource": ..., "namespace": ..., "name": ..., "body": {...}}]}
    POST /_ctl/conflict  {"count": 1, "patch": {...}}  the next `count` writes lose a race: the stored
                          object first gets `patch` (merge) and a new resourceVersion, then 409
    POST /_ctl/forbid    {"method": "PATCH", "plural": "kubevirts"}  -> 403 for matching requests
    POST /_ctl/fail      {"method": "GET", "plural": "pods", "count": 1, "status": 429, "retry_after": 2}
                          the next `count` matching requests fail with `status` (a Status body; with
                          `retry_after`, the `Retry-After` header and details.retryAfterSeconds, as the
                          API server's max-in-flight/priority-and-fairness filters answer a 429)
    GET  /_ctl/log       the request log;  POST /_ctl/log/clear
    GET  /_ctl/object?resource=...&namespace=...&name=...   the stored object
    POST /_ctl/patch     {"resource", "namespace", "name", "patch"}  a merge patch as another client
                          would make it (new resourceVersion, watch event), not logged
    POST /_ctl/compact   forget the event history: watches from an older resourceVersion get 410
    POST /_ctl/drop-watches {"unavailable_s": N}  end every open watch stream; for N seconds
                          answer 503 to API requests (an API server restart)
    POST /_ctl/watch-config {"bookmark_interval": S, "history": N}
    POST /_ctl/token     {"token": "..."}  the token accepted from now on (rotation)
    GET  /_ctl/watches   the number of open watch streams
    GET  /_ctl/history?resource=...&namespace=...&name=...  every stored version of the object
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import copy
import json
import signal
import ssl
import sys
import time

import aiohttp.test_utils
import aiohttp.web
import jsonpatch
import jsonpointer
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

HISTORY = 1000          # watch events kept for resuming watches
DEFAULT_WATCH_TIMEOUT = 1800


class Watch:
    """One open watch stream: what it selects and its queue of events (None = end the stream)."""

    def __init__(self, resource, namespace, name):
        self.resource, self.namespace, self.name = resource, namespace, name
        self.queue = asyncio.Queue()

    def selects(self, resource, namespace, name):
        return resource == self.resource and (self.namespace is None or namespace == self.namespace) and (
            self.name is None or name == self.name)


class StrictEmulator(KubernetesEmulator):
    """KubernetesEmulator with resourceVersion bumps, 409s, dry runs, a request log and controls."""

    def __attrs_post_init__(self):
        super().__attrs_post_init__()
        self.request_log = []
        self.conflicts = {"count": 0, "patch": None}
        self.forbidden = []
        self.faults = []
        self.resource_version = 999
        self.history = collections.deque()   # (resourceVersion, resource, namespace, name, event)
        self.history_floor = self.resource_version
        self.history_max = HISTORY
        self.bookmark_interval = None
        self.watches = set()
        self.unavailable_until = 0.0
        self.token = None

    def bump(self):
        """The next global resourceVersion (every write takes one, as etcd's revision)."""
        self.resource_version += 1
        return str(self.resource_version)

    def record(self, kind, resource, namespace, name, obj):
        """A watch event for a stored change: kept in the history and sent to matching watches."""
        event = {"type": kind, "object": copy.deepcopy(obj)}
        self.history.append((self.resource_version, resource, namespace, name, event))
        while len(self.history) > self.history_max:
            self.history_floor = self.history.popleft()[0]
        for watch in self.watches:
            if watch.selects(resource, namespace, name):
                watch.queue.put_nowait(event)

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
        elif path == "/_ctl/fail":
            self.faults.append({"method": data["method"].upper(), "plural": data["plural"],
                                "count": int(data.get("count", 1)), "status": int(data.get("status", 503)),
                                "retry_after": data.get("retry_after")})
        elif path == "/_ctl/forbid":
            self.forbidden.append({"method": data["method"].upper(), "plural": data["plural"]})
        elif path == "/_ctl/patch":
            await self._patch_as_other_client(data)
        elif path == "/_ctl/compact":
            self.history.clear()
            self.history_floor = self.resource_version
        elif path == "/_ctl/drop-watches":
            self.unavailable_until = time.monotonic() + float(data.get("unavailable_s") or 0)
            for watch in list(self.watches):
                watch.queue.put_nowait(None)
        elif path == "/_ctl/watch-config":
            if "bookmark_interval" in data:
                self.bookmark_interval = data["bookmark_interval"]
            if data.get("history"):
                self.history_max = int(data["history"])
        elif path == "/_ctl/token":
            self.token = data.get("token")
        elif path == "/_ctl/history":
            stored = self.objects[request.params["resource"], request.params.get("namespace") or None,
                                  request.params["name"]]
            return aiohttp.web.json_response([v.raw if v is not None else None for v in stored.history])
        elif path == "/_ctl/watches":
            return aiohttp.web.json_response(len(self.watches))
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
        self.faults.clear()
        self.conflicts = {"count": 0, "patch": None}
        for key, info in (state.get("resources") or {}).items():
            self.resources[key] = ResourceInfo(**info)
        for item in state.get("objects") or []:
            body = copy.deepcopy(item["body"])
            body.setdefault("metadata", {}).setdefault("resourceVersion", "1")
            self.objects[item["resource"], item.get("namespace"), item["name"]] = body
        self.history.clear()
        self.history_floor = self.resource_version
        for watch in list(self.watches):
            watch.queue.put_nowait(None)

    async def _patch_as_other_client(self, data):
        key = (data["resource"], data.get("namespace") or None, data["name"])
        stored = self.objects[key]
        result = patch_dict(copy.deepcopy(stored.raw), copy.deepcopy(data["patch"]))
        result.setdefault("metadata", {})["resourceVersion"] = self.bump()
        stored.create(result)
        self.record("MODIFIED", key[0], key[1], key[2], stored.raw)

    # --- request handling ---------------------------------------------------------------------
    async def _handle(self, request):
        method = str(getattr(request.method, "value", request.method)).upper()
        if request.url.path.startswith("/_ctl/"):
            return await self._control(request, method)
        watching = request.params.get("watch") in ("true", "1")
        self.request_log.append({"method": method, "path": request.url.path, "time": time.time(),
                                 "watch": watching, "resourceVersion": request.params.get("resourceVersion"),
                                 "fieldSelector": request.params.get("fieldSelector"),
                                 "dryRun": request.params.get("dryRun"),
                                 "contentType": request.headers.get("Content-Type"),
                                 # the scheme only: tests check how we authenticate, never the secret
                                 "auth": (request.headers.get("Authorization") or "").split(" ")[0] or None,
                                 "impersonate": [request.headers.get("Impersonate-User"),
                                                 request.headers.get("Impersonate-Group")]})
        if time.monotonic() < self.unavailable_until:
            raise KubernetesError(status=503, reason="ServiceUnavailable", message="the API server is restarting")
        if self.token is not None and not self._authorized(request.headers.get("Authorization") or ""):
            raise KubernetesError(status=401, reason="Unauthorized", message="Unauthorized")
        plural = request.resource.plural if request.resource is not None else None
        for fault in self.faults:
            if fault["count"] > 0 and fault["method"] == method and fault["plural"] == plural:
                fault["count"] -= 1
                return _fault_response(fault)
        if any(rule["method"] == method and rule["plural"] == plural for rule in self.forbidden):
            raise KubernetesError(status=403, reason="Forbidden",
                                  message='%s "%s" is forbidden: User "system:serviceaccount:test:ansible" cannot %s '
                                          'resource "%s"' % (plural, request.name, method.lower(), plural))
        if request.resource is not None and request.name and method in ("PATCH", "PUT"):
            return await self._write(request, method)
        if request.resource is not None and not request.name and method == "GET" and self._declared(request):
            return await (self._watch(request) if watching else self._list(request))
        if request.resource is not None and method == "POST" and request.params.get("dryRun") == "All":
            return aiohttp.web.json_response(request.data, status=201)  # validated by nobody, stored nowhere
        return await super()._handle(request)

    def _authorized(self, header):
        scheme, dummy, token = header.partition(" ")
        return scheme.lower() == "bearer" and token.strip() == self.token

    def _matching(self, request):
        """[(namespace, name, object)] of the listed resource, narrowed by the fieldSelector
        (metadata.name, spec.nodeName) and the labelSelector (`key=value` terms)."""
        wanted = _name_selector(request.params.get("fieldSelector"))
        node = _selector_terms(request.params.get("fieldSelector")).get("spec.nodeName")
        labels = _selector_terms(request.params.get("labelSelector"))
        found = []
        for (resource, namespace, name), obj in self.objects.items():
            if resource != request.resource or obj.deleted:
                continue
            if request.namespace is not None and namespace != request.namespace:
                continue
            if node is not None and (obj.raw.get("spec") or {}).get("nodeName") != node:
                continue
            have = (obj.raw.get("metadata") or {}).get("labels") or {}
            if (wanted is None or name == wanted) and all(have.get(k) == v for k, v in labels.items()):
                found.append((namespace, name, obj))
        return found

    def _declared(self, request):
        """The ResourceInfo of the listed resource; None (kmock answers 404) when not declared."""
        for key, info in self.resources.items():
            if key == request.resource:
                return info
        return None

    async def _list(self, request):
        kind = self._declared(request).kind
        return aiohttp.web.json_response({
            "apiVersion": request.resource.version if not request.resource.group else "%s/%s" % (
                request.resource.group, request.resource.version),
            "kind": (kind or "") + "List", "metadata": {"resourceVersion": str(self.resource_version)},
            "items": [copy.deepcopy(obj.raw) for dummy, dummy2, obj in self._matching(request)]})

    async def _watch(self, request):
        """A real API server's watch (module docstring); the stream is JSON lines."""
        timeout = float(request.params.get("timeoutSeconds") or DEFAULT_WATCH_TIMEOUT)
        since = request.params.get("resourceVersion")
        bookmarks = request.params.get("allowWatchBookmarks") in ("true", "1")
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request._raw_request)  # pylint: disable=protected-access
        # registering and replaying take no await in between, so no write falls between them
        watch = Watch(request.resource, request.namespace, _name_selector(request.params.get("fieldSelector")))
        if since in (None, "", "0"):
            backlog = [{"type": "ADDED", "object": copy.deepcopy(obj.raw)} for dummy, dummy2, obj in self._matching(request)]
        elif not since.isdigit() or int(since) < self.history_floor or int(since) > self.resource_version:
            backlog = [{"type": "ERROR", "object": {
                "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Expired", "code": 410,
                "message": "too old resource version: %s (%d)" % (since, self.history_floor)}}, None]
        else:
            backlog = [event for version, resource, namespace, name, event in self.history
                       if version > int(since) and watch.selects(resource, namespace, name)]
        self.watches.add(watch)
        for event in backlog:
            watch.queue.put_nowait(event)
        deadline = time.monotonic() + timeout
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                wait = min(left, self.bookmark_interval) if bookmarks and self.bookmark_interval else left
                try:
                    event = await asyncio.wait_for(watch.queue.get(), wait)
                except asyncio.TimeoutError:
                    if left > wait:  # a bookmark: no change, but the current resourceVersion
                        event = {"type": "BOOKMARK", "object": {"kind": request.resource.plural, "metadata": {
                            "resourceVersion": str(self.resource_version)}}}
                    else:
                        continue
                if event is None:
                    break
                await response.write((json.dumps(event) + "\n").encode())
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self.watches.discard(watch)
        try:
            await response.write_eof()
        except ConnectionError:
            pass
        return response

    async def _write(self, request, method):
        key = (request.resource, request.namespace, request.name)
        if key not in self.objects or self.objects[key].deleted:
            raise KubernetesObjectNotFoundError()
        stored = self.objects[key]
        if self.conflicts["count"] > 0:
            # Someone else wrote between our client's read and its write.
            self.conflicts["count"] -= 1
            stored.patch(copy.deepcopy(self.conflicts["patch"] or {}))
            stored.patch({"metadata": {"resourceVersion": self.bump()}})
            self.record("MODIFIED", key[0], key[1], key[2], stored.raw)
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
        elif (request.headers.get("Content-Type") or "").startswith("application/json-patch+json"):
            try:
                result = jsonpatch.apply_patch(copy.deepcopy(stored.raw), data)
            except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as exc:
                raise KubernetesError(status=422, reason="Invalid", message="the server rejected our request due to "
                                      "an error in our request: %s" % exc) from None
        else:
            result = patch_dict(copy.deepcopy(stored.raw), copy.deepcopy(data))
        if request.params.get("dryRun") == "All":
            return aiohttp.web.json_response(result)
        if result == stored.raw:  # a no-op write keeps the resourceVersion, as on a real API server
            return aiohttp.web.json_response(stored.raw)
        result.setdefault("metadata", {})["resourceVersion"] = self.bump()
        stored.create(result)
        self.record("MODIFIED", key[0], key[1], key[2], stored.raw)
        return aiohttp.web.json_response(stored.raw)


def _fault_response(fault):
    reason = {429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable"}.get(fault["status"], "Failure")
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "code": fault["status"],
            "reason": reason, "message": "injected %d (/_ctl/fail)" % fault["status"]}
    headers = {}
    if fault["retry_after"] is not None:
        body["details"] = {"retryAfterSeconds": int(fault["retry_after"])}
        headers["Retry-After"] = str(int(fault["retry_after"]))
    return aiohttp.web.json_response(body, status=fault["status"], headers=headers)


def _selector_terms(selector):
    """{key: value} of the `key=value` (or `==`) terms of a field or label selector."""
    terms = {}
    for term in (selector or "").split(","):
        key, dummy, value = term.partition("=")
        if key.strip():
            terms[key.strip()] = value.lstrip("=").strip()
    return terms


def _name_selector(selector):
    """The name in `metadata.name=X` (the only field selector the double understands), else None."""
    for term in (selector or "").split(","):
        field, dummy, value = term.partition("=")
        if field.strip() == "metadata.name":
            return value.lstrip("=").strip()
    return None


class TlsServer(aiohttp.test_utils.RawTestServer):
    """kmock's server class, serving HTTPS with the context set on the class."""

    context = None

    async def start_server(self, loop=None, **kwargs):
        await super().start_server(loop=loop, ssl=self.context, **kwargs)


async def serve(args):
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    emulator = StrictEmulator()
    emulator.token = args.token
    options = {}
    if args.tls_cert:
        TlsServer.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        TlsServer.context.load_cert_chain(args.tls_cert, args.tls_key)
        options["server_cls"] = TlsServer
    if args.state:
        with open(args.state) as handle:
            emulator._reset(json.load(handle))  # pylint: disable=protected-access
        emulator.resource_version = emulator.history_floor = args.resource_version
    async with emulator, Server(emulator, host="127.0.0.1", port=args.port, **options) as server:
        print("ready %d" % server.port, flush=True)
        await stop.wait()
        for watch in list(emulator.watches):
            watch.queue.put_nowait(None)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=None, help="TCP port on 127.0.0.1 (default: a free one)")
    parser.add_argument("--tls-cert", help="serve HTTPS with this certificate (PEM) ...")
    parser.add_argument("--tls-key", help="... and this key")
    parser.add_argument("--token", help="accept only this Bearer token (401 otherwise)")
    parser.add_argument("--state", help="JSON file: the state /_ctl/reset takes, loaded at start")
    parser.add_argument("--resource-version", type=int, default=999,
                        help="the resourceVersion to start from with --state (a restarted server goes on "
                             "counting; etcd keeps its revision)")
    args = parser.parse_args(argv)
    try:
        asyncio.run(serve(args))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
