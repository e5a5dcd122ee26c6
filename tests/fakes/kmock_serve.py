"""A Kubernetes API server double for the cluster-side tests, run as its own process.

    python tests/fakes/kmock_serve.py [--port N]      # prints "ready <port>" once listening

kmock 0.8's KubernetesEmulator (pinned: this subclasses its private API) made as strict as a real
API server where the tests and the product lean on it. What a real server decides about a request
(selectors, patch types, watch events under a selector) lives in tests/fakes/kube_api_rules.py.

Extension points (a new resource, e.g. resource.k8s.io/v1 ResourceSlices/ResourceClaims):
- declare it in the reset state's "resources" (kind, namespaced, verbs, subresources as kmock's
  ResourceInfo; a custom resource may add "selectableFields": [...] as its CRD would);
- its built-in field selectors: kube_api_rules.SELECTABLE_FIELDS; list keys of strategic merge
  patches: kube_api_rules.STRATEGIC_MERGE_KEYS; both cite the Kubernetes source they follow;
- new server behaviour: a method of StrictEmulator dispatched from `_handle` (one per verb).

Semantics (each as a real API server; a request the double cannot model fails loudly, never passes):
- POST (create): apiVersion and namespace must match the URL (400), name or generateName is
  required (422), an existing name -> 409 `AlreadyExists`; uid, creationTimestamp and a new
  resourceVersion are set; `?dryRun=All` runs the same checks and stores nothing (201 both ways);
- quantities (ResourceSlice capacities and counters) are stored canonical, as resource.Quantity
  marshals them (`24576Mi` -> `24Gi`; kube_api_rules.canonicalize); one that does not parse -> 422;
- PATCH: the patch type comes from the Content-Type only: merge (RFC 7386), JSON patch (RFC 6902),
  strategic merge for built-in groups (415 `UnsupportedMediaType` for a custom resource, as a CRD
  answers); server-side apply and anything else -> 415; PUT replaces. A write that changes the
  object bumps metadata.resourceVersion (a no-op changes nothing, sends no event); a stale
  resourceVersion -> 409 `Conflict`; changing the name -> 400; uid/creationTimestamp are kept;
  `?dryRun=All` answers the result and stores nothing;
- DELETE (every resource): DeleteOptions from the body, else from the query (`dryRun`,
  `propagationPolicy`, `orphanDependents`), invalid ones -> 422; 404 when absent; `preconditions`
  (uid, resourceVersion) not met -> 409 `Conflict`, nothing changed; `dryRun: [All]` stores nothing;
  the garbage collector's work for the propagation policy happens at once (dependents by
  ownerReferences deleted, or orphaned; Background waits for an owner's last finalizer); finalizers -> deletionTimestamp (200) and the object goes
  when a write removes the last finalizer; deleting a Namespace deletes its objects (no namespace
  controller: at once); details in StrictEmulator._delete;
- list and watch (`?watch=true`): one global resourceVersion counter bumped by every write, lists
  carrying the current one; `labelSelector` (=, ==, !=, in, notin, exists, !exists) and
  `fieldSelector` (=, ==, !=) on metadata.name/namespace plus the resource's selectable fields;
  any other field -> 400 "field label not supported: <field>"; watches replay from
  `resourceVersion` out of the kept event history (older than the history, or unknown to this
  server, e.g. after a restart -> one ERROR event with a 410 `Expired` Status and the end of the
  stream), and send live events through the same selectors: an object entering the selection
  arrives as ADDED, one leaving it as DELETED (apiserver cacher semantics), `timeoutSeconds` ends
  the stream, `allowWatchBookmarks` gets BOOKMARK events every `bookmark_interval` seconds;
- optional HTTPS (`--tls-cert/--tls-key`, a CA the test made) and Bearer-token checking
  (`--token`; 401 otherwise; the scheme is matched case-insensitively as real servers do);
- a request log (method, path, dryRun, content type, auth scheme, impersonation headers, and for
  lists/watches the watch flag, resourceVersion and selectors, with a time) so tests can prove check
  mode mutates nothing, how the client authenticated and how often it asked. Memory is bounded for
  long runs (benchmarks): the log keeps the last `request_log` entries, each object its last
  `object_versions` versions, the watch history `history` events; deleted objects are forgotten.

Test controls (JSON over HTTP, never logged):
    POST /_ctl/reset     {"resources": {"kubevirt.io/v1/kubevirts": {"kind": ..., "namespaced": true}},
                          "objects": [{"resource": ..., "namespace": ..., "name": ..., "body": {...}}],
                          "disabledFeatures": ["DRAPartitionableDevices"]}  gates off: their fields dropped
    POST /_ctl/conflict  {"count": 1, "patch": {...}}  the next `count` writes (PATCH, PUT, DELETE) lose
                          a race: the stored object first gets `patch` (merge) and a new
                          resourceVersion, then the write's resourceVersion (precondition) -> 409
    POST /_ctl/forbid    {"method": "PATCH", "plural": "kubevirts"}  -> 403 for matching requests
    POST /_ctl/fail      {"method": "GET", "plural": "pods", "count": 1, "status": 429, "retry_after": 2}
                          the next `count` matching requests fail with `status` (a Status body; with
                          `retry_after`, the `Retry-After` header and details.retryAfterSeconds, as the
                          API server's max-in-flight/priority-and-fairness filters answer a 429)
    GET  /_ctl/log       the request log;  POST /_ctl/log/clear (clears the received requests too)
    GET  /_ctl/received  every API request as received: method, path with query string, headers, body
                          (secrets included: for tests that prove where a secret went; bounded as the log)
    GET  /_ctl/objects   every stored object
    GET  /_ctl/object?resource=...&namespace=...&name=...   the stored object
    POST /_ctl/patch     {"resource", "namespace", "name", "patch"}  a merge patch as another client
                          would make it (new resourceVersion, watch event), not logged
    POST /_ctl/compact   forget the event history: watches from an older resourceVersion get 410
    POST /_ctl/drop-watches {"unavailable_s": N}  end every open watch stream; for N seconds
                          answer 503 to API requests (an API server restart)
    POST /_ctl/watch-config {"bookmark_interval": S, "history": N}
    POST /_ctl/limits    {"request_log": N, "object_versions": N}  the memory bounds (defaults below)
    POST /_ctl/token     {"token": "..."}  the token accepted from now on (rotation)
    GET  /_ctl/watches   the number of open watch streams
    GET  /_ctl/history?resource=...&namespace=...&name=...  the kept versions of the object
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import copy
import datetime
import json
import random
import signal
import ssl
import sys
import time
import uuid

import aiohttp.test_utils
import aiohttp.web
from kmock import KubernetesEmulator, ResourceInfo, Server
from kmock._internal import parsing
from kmock._internal.k8s import KubernetesError

import kube_api_rules as rules

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
REQUEST_LOG = 20000     # request log entries kept
OBJECT_VERSIONS = 200   # versions kept per object (/_ctl/history)
DEFAULT_WATCH_TIMEOUT = 1800
NAME_SUFFIX = "bcdfghjklmnpqrstvwxz2456789"   # generateName's alphabet (apiserver names.go)


def _api_error(exc):
    return KubernetesError(status=exc.status, reason=exc.reason, message=exc.message, details=exc.details)


def _now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _resource_name(resource):
    """"group/version/plural" (kube_api_rules' keys) of a parsed request's resource, or of a control's string."""
    if isinstance(resource, str):
        return resource
    return rules.resource_key(resource.group, resource.version, resource.plural)


def _meta(obj):
    return obj.setdefault("metadata", {})


class Watch:
    """One open watch stream: its resource, namespace, selector and queue (None = end the stream)."""

    def __init__(self, resource, namespace, selector):
        self.resource, self.namespace, self.selector = resource, namespace, selector
        self.queue = asyncio.Queue()

    def event(self, resource, namespace, change):
        """The event this watch gets for a stored change (kube_api_rules.watch_event), else None."""
        if resource != self.resource or (self.namespace is not None and namespace != self.namespace):
            return None
        kind, obj, prev = change
        return rules.watch_event(kind, obj, prev, self.selector)


class StrictEmulator(KubernetesEmulator):
    """KubernetesEmulator with a real server's checks and answers (module docstring) and controls."""

    def __attrs_post_init__(self):
        super().__attrs_post_init__()
        self.request_log = collections.deque(maxlen=REQUEST_LOG)
        self.received = collections.deque(maxlen=REQUEST_LOG)
        self.object_versions = OBJECT_VERSIONS
        self.conflicts = {"count": 0, "patch": None}
        self.forbidden = []
        self.faults = []
        self.disabled = set()   # feature gates off (reset state "disabledFeatures"): kube_api_rules.drop_disabled_fields
        self.selectable = {}                 # "group/version/plural" -> a CRD's selectableFields
        self.resource_version = 999
        self.history = collections.deque()   # (resourceVersion, resource, namespace, (kind, obj, prev))
        self.history_floor = self.resource_version
        self.history_max = HISTORY
        self.bookmark_interval = None
        self.watches = set()
        self.unavailable_until = 0.0
        self.token = None

    async def __call__(self, raw_request):
        try:
            return await super().__call__(raw_request)
        finally:
            # kmock keeps every parsed request (bodies included) for its own assertions, which
            # this double never uses: forget them, the bounded request_log is the record
            self._requests.clear()
            for payload in self._payloads:
                payload._requests.clear()  # pylint: disable=protected-access

    def bump(self):
        """The next global resourceVersion (every write takes one, as etcd's revision)."""
        self.resource_version += 1
        return str(self.resource_version)

    def record(self, kind, key, obj, prev=None):
        """A stored change (obj: the new state, prev: the one before): kept in the event history
        and sent to every watch whose selection it touches."""
        change = (kind, copy.deepcopy(obj), copy.deepcopy(prev))
        resource, namespace = key[0], key[1]
        self.history.append((self.resource_version, resource, namespace, change))
        while len(self.history) > self.history_max:
            self.history_floor = self.history.popleft()[0]
        for watch in self.watches:
            event = watch.event(resource, namespace, change)
            if event is not None:
                watch.queue.put_nowait(event)

    def store(self, key, obj):
        """Keep `obj` as the object's new version (its oldest versions beyond the bound go)."""
        if key in self.objects:
            stored = self.objects[key]
            stored.create(obj)  # appends the version (kmock's create on a live object)
            if len(stored.history) > self.object_versions:
                del stored.history[:len(stored.history) - self.object_versions]
        else:
            self.objects[key] = obj

    def stored(self, key):
        """The stored object (a dict) under `key`, or None."""
        try:
            found = self.objects[key]  # `in` does not parse a "group/version/plural" string key
        except KeyError:
            return None
        return None if found.deleted else found.raw

    # --- controls ---------------------------------------------------------------------------
    async def _control(self, request, method):
        path = request.url.path
        data = request.data if isinstance(request.data, dict) else {}
        if path == "/_ctl/log" and method == "GET":
            return aiohttp.web.json_response(list(self.request_log))
        if path == "/_ctl/received":
            return aiohttp.web.json_response(list(self.received))
        if path == "/_ctl/objects":
            return aiohttp.web.json_response([obj.raw for obj in self.objects.values() if not obj.deleted])
        if path == "/_ctl/log/clear":
            self.request_log.clear()
            self.received.clear()
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
            self._patch_as_other_client(data)
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
        elif path == "/_ctl/limits":
            if data.get("request_log"):
                self.request_log = collections.deque(self.request_log, maxlen=int(data["request_log"]))
                self.received = collections.deque(self.received, maxlen=int(data["request_log"]))
            if data.get("object_versions"):
                self.object_versions = int(data["object_versions"])
        elif path == "/_ctl/token":
            self.token = data.get("token")
        elif path == "/_ctl/history":
            stored = self.objects[request.params["resource"], request.params.get("namespace") or None,
                                  request.params["name"]]
            return aiohttp.web.json_response([v.raw if v is not None else None for v in stored.history])
        elif path == "/_ctl/watches":
            return aiohttp.web.json_response(len(self.watches))
        elif path == "/_ctl/object":
            found = self.stored((request.params["resource"], request.params.get("namespace") or None,
                                 request.params["name"]))
            return aiohttp.web.json_response(found, status=200 if found is not None else 404)
        else:
            return aiohttp.web.json_response({"error": "unknown control " + path}, status=400)
        return aiohttp.web.json_response({"ok": True})

    def _reset(self, state):
        self.objects.clear()
        self.resources.clear()
        self.selectable.clear()
        self.request_log.clear()
        self.received.clear()
        self.forbidden.clear()
        self.faults.clear()
        self.conflicts = {"count": 0, "patch": None}
        self.disabled = set(state.get("disabledFeatures") or ())   # gates off: their fields are dropped
        for key, info in (state.get("resources") or {}).items():
            info = dict(info)
            self.selectable[key] = tuple(info.pop("selectableFields", ()))
            self.resources[key] = ResourceInfo(**info)
        for item in state.get("objects") or []:
            body = rules.canonicalize(item["resource"], copy.deepcopy(item["body"]))
            _meta(body).setdefault("resourceVersion", "1")
            self.objects[item["resource"], item.get("namespace"), item["name"]] = body
        self.history.clear()
        self.history_floor = self.resource_version
        for watch in list(self.watches):
            watch.queue.put_nowait(None)

    def _patch_as_other_client(self, data):
        key = (data["resource"], data.get("namespace") or None, data["name"])
        before = self.objects[key].raw
        result = rules.canonicalize(_resource_name(data["resource"]), rules.merge_patch(before, data["patch"]))
        _meta(result)["resourceVersion"] = self.bump()
        self.store(key, result)
        self.record("MODIFIED", key, result, before)

    # --- request handling ---------------------------------------------------------------------
    async def _handle(self, request):
        method = str(getattr(request.method, "value", request.method)).upper()
        if request.url.path.startswith("/_ctl/"):
            return await self._control(request, method)
        watching = request.params.get("watch") in ("true", "1")
        self.request_log.append({"method": method, "path": request.url.path, "time": time.time(),
                                 "watch": watching, "resourceVersion": request.params.get("resourceVersion"),
                                 "fieldSelector": request.params.get("fieldSelector"),
                                 "labelSelector": request.params.get("labelSelector"),
                                 "dryRun": request.params.get("dryRun"),
                                 "contentType": request.headers.get("Content-Type"),
                                 # the scheme only: tests check how we authenticate, never the secret
                                 "auth": (request.headers.get("Authorization") or "").split(" ")[0] or None,
                                 "impersonate": [request.headers.get("Impersonate-User"),
                                                 request.headers.get("Impersonate-Group")]})
        self.received.append({"method": method, "path": request.url.raw_path_qs, "headers": dict(request.headers),
                              "body": request.body.decode("utf-8", "replace")})
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
        if request.resource is None or request.subresource:
            return await super()._handle(request)
        try:
            if request.name and method in ("PATCH", "PUT"):
                return self._write(request, method)
            if request.name and method == "DELETE":
                return self._delete(request)
            if not request.name and method == "POST":
                return self._create(request)
            if not request.name and method == "GET" and self._declared(request):
                selector = self._selector(request)
                return await (self._watch(request, selector) if watching else self._list(request, selector))
        except rules.ApiError as exc:
            raise _api_error(exc) from None
        return await super()._handle(request)

    def _authorized(self, header):
        scheme, dummy, token = header.partition(" ")
        return scheme.lower() == "bearer" and token.strip() == self.token

    def _declared(self, request):
        """The ResourceInfo of the requested resource; None (kmock answers 404) when not declared."""
        for key, info in self.resources.items():
            if key == request.resource:
                return info
        return None

    def _selector(self, request):
        """The request's label and field selectors; 400 for a field the resource cannot select on."""
        res = request.resource
        key = rules.resource_key(res.group, res.version, res.plural)
        supported = rules.METADATA_FIELDS + rules.SELECTABLE_FIELDS.get(key, ()) + self.selectable.get(key, ())
        return rules.Selector(request.params.get("labelSelector"), request.params.get("fieldSelector"), supported)

    def _not_found(self, request):
        res = request.resource
        return rules.ApiError(404, "NotFound", '%s "%s" not found' % (rules.qualified(res.plural, res.group), request.name))

    def _matching(self, request, selector):
        """[object] of the listed resource in the request's namespace that the selector selects."""
        return [obj.raw for (resource, namespace, dummy), obj in self.objects.items()
                if resource == request.resource and not obj.deleted
                and (request.namespace is None or namespace == request.namespace) and selector.matches(obj.raw)]

    async def _list(self, request, selector):
        kind = self._declared(request).kind
        return aiohttp.web.json_response({
            "apiVersion": request.resource.version if not request.resource.group else "%s/%s" % (
                request.resource.group, request.resource.version),
            "kind": (kind or "") + "List", "metadata": {"resourceVersion": str(self.resource_version)},
            "items": [copy.deepcopy(obj) for obj in self._matching(request, selector)]})

    async def _watch(self, request, selector):
        """A real API server's watch (module docstring); the stream is JSON lines."""
        timeout = float(request.params.get("timeoutSeconds") or DEFAULT_WATCH_TIMEOUT)
        since = request.params.get("resourceVersion")
        bookmarks = request.params.get("allowWatchBookmarks") in ("true", "1")
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request._raw_request)  # pylint: disable=protected-access
        # registering and replaying take no await in between, so no write falls between them
        watch = Watch(request.resource, request.namespace, selector)
        if since in (None, "", "0"):
            backlog = [{"type": "ADDED", "object": copy.deepcopy(obj)} for obj in self._matching(request, selector)]
        elif not since.isdigit() or int(since) < self.history_floor or int(since) > self.resource_version:
            backlog = [{"type": "ERROR", "object": {
                "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Expired", "code": 410,
                "message": "too old resource version: %s (%d)" % (since, self.history_floor)}}, None]
        else:
            backlog = [event for version, resource, namespace, change in self.history if version > int(since)
                       for event in [watch.event(resource, namespace, change)] if event is not None]
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

    def _create(self, request):
        """POST: a real server's checks (module docstring), then stored with uid, creationTimestamp and
        a new resourceVersion; with ?dryRun=All the same answer, nothing stored."""
        res, info = request.resource, self._declared(request)
        body = request.data
        if not isinstance(body, dict):
            raise rules.ApiError(400, "BadRequest", "the body of the request is not a JSON object")
        api_version = "%s/%s" % (res.group, res.version) if res.group else res.version
        if body.get("apiVersion", api_version) != api_version:
            raise rules.ApiError(400, "BadRequest", "the API version in the data (%s) does not match the expected API "
                                 "version (%s)" % (body["apiVersion"], api_version))
        obj = rules.drop_disabled_fields(res.plural, copy.deepcopy(body), self.disabled)
        obj["apiVersion"] = api_version
        if info is not None and info.kind:
            obj.setdefault("kind", info.kind)
        meta = _meta(obj)
        if meta.get("namespace") and request.namespace and meta["namespace"] != request.namespace:
            raise rules.ApiError(400, "BadRequest", "the namespace of the provided object does not match the namespace "
                                 "sent on the request")
        if info is not None and info.namespaced and not request.namespace:
            raise rules.ApiError(404, "NotFound", "the server could not find the requested resource")
        if request.namespace:
            meta["namespace"] = request.namespace
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + "".join(random.choice(NAME_SUFFIX) for dummy in range(5))
        if not meta.get("name"):
            raise rules.ApiError(422, "Invalid", '%s "" is invalid: metadata.name: Required value: name or '
                                 'generateName is required' % (obj.get("kind") or res.plural))
        key = (res, request.namespace, meta["name"])
        if self.stored(key) is not None:
            raise rules.ApiError(409, "AlreadyExists", '%s "%s" already exists'
                                 % (rules.qualified(res.plural, res.group), meta["name"]))
        meta.update({"uid": str(uuid.uuid4()), "creationTimestamp": _now()})
        meta.pop("resourceVersion", None)
        rules.canonicalize(_resource_name(res), obj)
        if request.params.get("dryRun") != "All":
            meta["resourceVersion"] = self.bump()
            self.store(key, obj)
            self.record("ADDED", key, obj)
        return aiohttp.web.json_response(obj, status=201)

    def _delete(self, request):
        """DELETE as k8s.io/apiserver answers it (handlers/delete.go, registry/rest/delete.go
        BeforeDelete, the generic registry's Store.Delete), for every resource: the DeleteOptions
        (body, else query) validated (422); 404 when absent; a lost race (/_ctl/conflict) lands;
        the preconditions checked (409 `Conflict`, nothing changed, dry run or not); with dry run
        the object is answered, nothing stored; else the garbage collector's work for the
        propagation policy is done at once (_collect_garbage; Background on an owner that a finalizer
        keeps: when the last finalizer goes), then finalizers defer the removal
        (deletionTimestamp, 200) or the object goes. The answer is the object (200; 202 only with
        orphanDependents=false on an object that stays, as handlers/delete.go). With Foreground or
        Orphan a real server first keeps the owner with the `foregroundDeletion`/`orphan` finalizer
        until the collector is done: the answer shows that state, the watch sees it as MODIFIED, then
        the object goes (DELETED) within the same request."""
        options = rules.delete_options(request.body, request.data, request.url.query)
        key = (request.resource, request.namespace, request.name)
        if self.stored(key) is None:
            raise self._not_found(request)
        self._lose_race(key)
        before = self.stored(key)
        info = self._declared(request)
        kind = (info.kind if info is not None and info.kind else None) or before.get("kind") or request.resource.plural
        rules.check_preconditions(options["preconditions"], before, kind, request.resource.group)
        if options["dryRun"]:
            return aiohttp.web.json_response(before)
        policy = options["propagationPolicy"] or ("Orphan" if options["orphanDependents"] else "Background")
        finalizers = (before.get("metadata") or {}).get("finalizers")
        if not (finalizers and policy == "Background"):
            # Background: the collector keeps the dependents while their owner exists, deletionTimestamp or not
            # (a "solid" owner, garbagecollector.go classifyReferences): they go with its last finalizer (_write)
            self._collect_garbage(before, policy == "Orphan")
        status = 202 if options["orphanDependents"] is False else 200
        if finalizers:
            if before["metadata"].get("deletionTimestamp"):
                return aiohttp.web.json_response(before, status=status)
            return aiohttp.web.json_response(self._mark_deleting(key, before), status=status)
        if policy == "Background":
            return aiohttp.web.json_response(self._remove(key, before))
        pending = self._mark_deleting(key, before, ["foregroundDeletion" if policy == "Foreground" else "orphan"])
        self._remove(key, pending)
        return aiohttp.web.json_response(pending)

    def _mark_deleting(self, key, before, finalizers=None):
        """Store `before` with a deletionTimestamp (and `finalizers`, when given): MODIFIED."""
        after = copy.deepcopy(before)
        after["metadata"].update({"deletionTimestamp": _now(), "resourceVersion": self.bump()})
        if finalizers:
            after["metadata"]["finalizers"] = finalizers
        self.store(key, after)
        self.record("MODIFIED", key, after, before)
        return after

    def _collect_garbage(self, owner, orphan):
        """kube-controller-manager's garbage collector for a deleted `owner`, at once: a dependent
        (metadata.ownerReferences naming its uid) that still has another existing owner, or any
        dependent under the Orphan policy, loses that reference; the others are deleted
        (recursively, their finalizers deferring them as a DELETE would)."""
        uid = (owner.get("metadata") or {}).get("uid")
        if not uid:
            return
        live = {(obj.raw.get("metadata") or {}).get("uid") for obj in self.objects.values() if not obj.deleted}
        for key in list(self.objects):
            before = self.stored(key)
            if before is None:
                continue
            refs = (before.get("metadata") or {}).get("ownerReferences") or []
            if not any(ref.get("uid") == uid for ref in refs):
                continue
            kept = [ref for ref in refs if ref.get("uid") != uid]
            if orphan or any(ref.get("uid") in live for ref in kept):
                after = copy.deepcopy(before)
                after["metadata"]["ownerReferences"] = kept
                if not kept:
                    del after["metadata"]["ownerReferences"]
                after["metadata"]["resourceVersion"] = self.bump()
                self.store(key, after)
                self.record("MODIFIED", key, after, before)
                continue
            self._collect_garbage(before, False)
            if not before["metadata"].get("finalizers"):
                self._remove(key, before)
            elif not before["metadata"].get("deletionTimestamp"):
                self._mark_deleting(key, before)

    def _remove(self, key, before, gone=None):
        """Forget the object (a DELETED event: `gone`, by default `before` with a new resourceVersion);
        for a Namespace, its objects too."""
        if gone is None:
            gone = copy.deepcopy(before)
            _meta(gone)["resourceVersion"] = self.bump()
        del self.objects[key]
        self.record("DELETED", key, gone, before)
        resource = key[0]
        if resource.group == "" and resource.plural == "namespaces":
            for inner in [k for k, obj in self.objects.items() if k[1] == key[2] and not obj.deleted]:
                self._remove(inner, self.objects[inner].raw)
        return gone

    def _lose_race(self, key):
        """/_ctl/conflict: someone else writes the object between our client's read and its write
        (PATCH, PUT, DELETE) while the count lasts."""
        if self.conflicts["count"] > 0:
            self.conflicts["count"] -= 1
            self._patch_as_other_client({"resource": key[0], "namespace": key[1], "name": key[2],
                                         "patch": self.conflicts["patch"] or {}})

    def _write(self, request, method):
        key = (request.resource, request.namespace, request.name)
        if self.stored(key) is None:
            raise self._not_found(request)
        media = rules.patch_type(request.headers.get("Content-Type"), request.resource.group) if method == "PATCH" else None
        self._lose_race(key)
        before = self.stored(key)
        current = before["metadata"].get("resourceVersion")
        if method == "PUT":
            if not isinstance(request.data, dict):
                raise rules.ApiError(400, "BadRequest", "the body of the request is not a JSON object")
            result = rules.drop_disabled_fields(request.resource.plural, copy.deepcopy(request.data), self.disabled)
            wanted = _meta(result).get("resourceVersion")
        else:
            result = rules.apply_patch(media, before, request.data)
            wanted = _meta(result).get("resourceVersion")
            wanted = None if wanted == current else wanted
        rules.canonicalize(_resource_name(request.resource), result)
        if wanted is not None and wanted != current:
            raise rules.ApiError(409, "Conflict", "Operation cannot be fulfilled on %s \"%s\": the object has been "
                                 "modified; please apply your changes to the latest version and try again"
                                 % (rules.qualified(request.resource.plural, request.resource.group), request.name))
        meta = _meta(result)
        if meta.get("name", request.name) != request.name:
            raise rules.ApiError(400, "BadRequest", "the name of the object (%s) does not match the name on the URL "
                                 "(%s)" % (meta["name"], request.name))
        for field in ("name", "namespace", "uid", "creationTimestamp", "deletionTimestamp"):
            if field in before["metadata"]:
                meta[field] = before["metadata"][field]
        meta["resourceVersion"] = current
        if request.params.get("dryRun") == "All" or result == before:
            # a dry run stores nothing; a no-op write keeps the resourceVersion, as on a real API server
            return aiohttp.web.json_response(result)
        meta["resourceVersion"] = self.bump()
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            self._collect_garbage(before, False)   # the owner is gone now: its dependents go (Background)
            return aiohttp.web.json_response(self._remove(key, before, result))
        self.store(key, result)
        self.record("MODIFIED", key, result, before)
        return aiohttp.web.json_response(result)


def _fault_response(fault):
    reason = {429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable"}.get(fault["status"], "Failure")
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "code": fault["status"],
            "reason": reason, "message": "injected %d (/_ctl/fail)" % fault["status"]}
    headers = {}
    if fault["retry_after"] is not None:
        body["details"] = {"retryAfterSeconds": int(fault["retry_after"])}
        headers["Retry-After"] = str(int(fault["retry_after"]))
    return aiohttp.web.json_response(body, status=fault["status"], headers=headers)


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
