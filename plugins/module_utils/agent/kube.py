# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A small Kubernetes API client for the node agent, standard library only.

The agent needs a few calls (list/get/watch/patch its own Node, create an Event; for the DRA driver
its node's ResourceSlices and reading ResourceClaims), so it speaks HTTP itself instead of shipping the
`kubernetes` client (docs/design.md, "Node agent"). Credentials:

- in-cluster (a pod): KUBERNETES_SERVICE_HOST/PORT and the service account's `token`, `ca.crt` and
  `namespace` files. The token is projected and rotated by the kubelet, so it is read again for
  every request (a small file read), never cached;
- a kubeconfig (KUBECONFIG; tests and out-of-cluster runs): the current context's server, CA
  (`certificate-authority[-data]`, `insecure-skip-tls-verify`), and a `token`, `tokenFile` or client
  certificate (`client-certificate[-data]`, `client-key[-data]`). JSON, or YAML when PyYAML exists.

Errors: `KubeApiError` (the server answered with a failure Status; `.status` is the HTTP code) and
`KubeUnavailable` (no answer: refused, reset, timed out, TLS failure). Both read as one line.
"""

from __future__ import annotations

import base64
import datetime
import email.utils
import http.client
import json
import os
import ssl
import tempfile
import urllib.parse

from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError
from ansible_collections.accelops.vgpu.plugins.module_utils.kube_errors import KubeApiError, KubeUnavailable

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
RESOURCE_API = "/apis/resource.k8s.io/v1"
MERGE_PATCH = "application/merge-patch+json"
REQUEST_TIMEOUT = 30.0
USER_AGENT = "accelops-vgpu-agent"


class KubeConfigError(EngineError):
    """No usable credentials (a startup problem: the agent exits 2)."""


RETRY_AFTER_CAP = 3600.0  # seconds: a server asking for more is still retried within the hour


def retry_after(headers, body):
    """Seconds from `Retry-After` (delta-seconds or an HTTP-date, RFC 9110 10.2.3), else from a
    Status' details.retryAfterSeconds (apimachinery); None when neither says."""
    value = (headers.get("Retry-After") or "").strip() if headers is not None else ""
    seconds = None
    if value.isdigit():
        seconds = float(value)
    elif value:
        try:
            when = email.utils.parsedate_to_datetime(value)
            seconds = max(0.0, (when - datetime.datetime.now(datetime.timezone.utc)).total_seconds())
        except (TypeError, ValueError, IndexError):
            seconds = None
    if seconds is None:
        try:
            details = (json.loads(body) or {}).get("details") or {}
            found = details.get("retryAfterSeconds")
            seconds = float(found) if isinstance(found, (int, float)) and found > 0 else None
        except (ValueError, AttributeError):
            seconds = None
    return None if seconds is None else min(seconds, RETRY_AFTER_CAP)


def retry_delay(exc, backoff_delay):
    """The delay before retrying after `exc`: our backoff, but never less than the server asked."""
    return max(backoff_delay, getattr(exc, "retry_after", None) or 0.0)


def _read(path):
    with open(path) as handle:
        return handle.read().strip()


class Credentials:
    """Where to connect and how to authenticate; the bearer token is read at every request."""

    def __init__(self, server, ca_file=None, ca_data=None, insecure=False, token=None, token_file=None,
                 cert_file=None, key_file=None, namespace=None):
        parsed = urllib.parse.urlsplit(server)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise KubeConfigError("API server %r is not an http(s) URL" % server)
        self.server, self.scheme = server.rstrip("/"), parsed.scheme
        self.host, self.port = parsed.hostname, parsed.port or (443 if parsed.scheme == "https" else 80)
        self.token, self.token_file, self.namespace = token, token_file, namespace
        self.context = None
        if self.scheme == "https":
            self.context = ssl.create_default_context(cafile=ca_file, cadata=ca_data)
            if insecure:
                self.context.check_hostname = False
                self.context.verify_mode = ssl.CERT_NONE
            if cert_file:
                self.context.load_cert_chain(cert_file, key_file)

    def bearer(self):
        """The token as of now (a rotated file is read again); None when the client uses a certificate."""
        if self.token_file:
            try:
                return _read(self.token_file)
            except OSError as exc:  # mid-rotation or a broken mount: retried like a server that is away
                raise KubeUnavailable("cannot read the token %s: %s" % (self.token_file, exc.strerror)) from None
        return self.token


def in_cluster(sa_dir=SA_DIR, environ=None):
    """Credentials of the pod's service account."""
    environ = os.environ if environ is None else environ
    host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT") or "443"
    if not host:
        raise KubeConfigError("not in a cluster: KUBERNETES_SERVICE_HOST is not set and KUBECONFIG is not given")
    for name in ("token", "ca.crt"):
        if not os.path.isfile(os.path.join(sa_dir, name)):
            raise KubeConfigError("in-cluster config: %s is missing" % os.path.join(sa_dir, name))
    try:
        namespace = _read(os.path.join(sa_dir, "namespace"))
    except OSError:
        namespace = None
    host = "[%s]" % host if ":" in host else host
    try:
        return Credentials("https://%s:%s" % (host, port), ca_file=os.path.join(sa_dir, "ca.crt"),
                           token_file=os.path.join(sa_dir, "token"), namespace=namespace)
    except (ssl.SSLError, OSError) as exc:
        raise KubeConfigError("in-cluster config: cannot load %s: %s" % (os.path.join(sa_dir, "ca.crt"), exc)) from None


def _load_kubeconfig(path):
    try:
        text = _read(path)
    except OSError as exc:
        raise KubeConfigError("cannot read kubeconfig %s: %s" % (path, exc.strerror)) from None
    try:
        return json.loads(text)
    except ValueError:
        try:
            import yaml  # pylint: disable=import-outside-toplevel
        except ImportError:
            raise KubeConfigError("kubeconfig %s is not JSON and PyYAML is not installed" % path) from None
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError:
            raise KubeConfigError("kubeconfig %s is neither JSON nor YAML" % path) from None


def _named(items, name, what, path):
    for item in items or ():
        if isinstance(item, dict) and item.get("name") == name:
            return item.get(what) or {}
    raise KubeConfigError("kubeconfig %s: no %s named %r" % (path, what, name))


def from_kubeconfig(path, scratch_dir=None):
    """Credentials of the current context of a kubeconfig file (`*-data` fields go to private files)."""
    config = _load_kubeconfig(path)
    if not isinstance(config, dict) or not config.get("current-context"):
        raise KubeConfigError("kubeconfig %s has no current-context" % path)
    context = _named(config.get("contexts"), config["current-context"], "context", path)
    cluster = _named(config.get("clusters"), context.get("cluster"), "cluster", path)
    user = _named(config.get("users"), context.get("user"), "user", path) if context.get("user") else {}
    base = os.path.dirname(os.path.abspath(path))

    def file_of(field):
        if user.get(field + "-data") or cluster.get(field + "-data"):
            data = base64.b64decode(user.get(field + "-data") or cluster.get(field + "-data"))
            handle = tempfile.NamedTemporaryFile(prefix="kube-", dir=scratch_dir, delete=False)
            with handle:
                handle.write(data)
            return handle.name
        value = user.get(field) or cluster.get(field)
        return os.path.join(base, value) if value else None

    if not cluster.get("server"):
        raise KubeConfigError("kubeconfig %s: cluster %r has no server" % (path, context.get("cluster")))
    token_file = user.get("tokenFile")
    try:
        return Credentials(cluster["server"], ca_file=file_of("certificate-authority"),
                           insecure=bool(cluster.get("insecure-skip-tls-verify")), token=user.get("token"),
                           token_file=os.path.join(base, token_file) if token_file else None,
                           cert_file=file_of("client-certificate"), key_file=file_of("client-key"),
                           namespace=context.get("namespace"))
    except (ssl.SSLError, OSError) as exc:
        raise KubeConfigError("kubeconfig %s: cannot load its certificates: %s" % (path, exc)) from None


def _status_message(status, body):
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    if isinstance(doc, dict) and doc.get("kind") == "Status":
        return doc.get("message") or doc.get("reason") or "HTTP %d" % status, doc.get("reason")
    return "HTTP %d: %s" % (status, " ".join(body.decode("utf-8", "replace").split())[:200]), None


def _events(conn, response, what):
    """The JSON events of a watch response, one a line, until the server ends the stream; the connection is closed
    when the stream ends or the caller stops reading."""
    try:
        while True:
            try:
                line = response.readline()
            except (OSError, http.client.HTTPException) as exc:
                raise KubeUnavailable("watch of %s broke: %s" % (what, exc or type(exc).__name__)) from None
            if not line:
                return
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except ValueError:
                raise KubeUnavailable("watch of %s: a line that is not JSON" % what) from None
            yield event
    finally:
        conn.close()


class KubeClient:
    """The calls the agent makes. Every method raises KubeApiError or KubeUnavailable."""

    def __init__(self, credentials, timeout=REQUEST_TIMEOUT):
        self.credentials, self.timeout = credentials, timeout

    # --- plumbing -----------------------------------------------------------------------------------
    def _connection(self, timeout):
        creds = self.credentials
        if creds.scheme == "https":
            return http.client.HTTPSConnection(creds.host, creds.port, timeout=timeout, context=creds.context)
        return http.client.HTTPConnection(creds.host, creds.port, timeout=timeout)

    def _open(self, method, path, query=None, body=None, content_type="application/json", timeout=None):
        """(connection, response) with a 2xx status; a 401 re-reads the token and tries once more."""
        url = path + ("?" + urllib.parse.urlencode(query) if query else "")
        data = None if body is None else json.dumps(body).encode("utf-8")
        for attempt in (1, 2):
            headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
            token = self.credentials.bearer()
            if token:
                headers["Authorization"] = "Bearer " + token
            if data is not None:
                headers["Content-Type"] = content_type
            conn = self._connection(timeout or self.timeout)
            try:
                conn.request(method, url, body=data, headers=headers)
                response = conn.getresponse()
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                why = exc or type(exc).__name__
                raise KubeUnavailable("%s %s: no answer from %s: %s" % (method, path, self.credentials.server,
                                                                        why)) from None
            if 200 <= response.status < 300:
                return conn, response
            payload = response.read()
            conn.close()
            if response.status == 401 and attempt == 1:
                continue  # the token rotated between our read and the server's check: read it again
            message, reason = _status_message(response.status, payload)
            wait = retry_after(response.headers, payload) if response.status == 429 or response.status >= 500 else None
            raise KubeApiError("%s %s: %s" % (method, path, message), response.status, reason, wait)
        raise AssertionError("unreachable")

    def request(self, method, path, query=None, body=None, content_type="application/json", timeout=None):
        conn, response = self._open(method, path, query, body, content_type, timeout=timeout)
        try:
            payload = response.read()
        except (OSError, http.client.HTTPException) as exc:
            raise KubeUnavailable("%s %s: answer cut off: %s" % (method, path, exc)) from None
        finally:
            conn.close()
        try:
            return json.loads(payload) if payload else {}
        except ValueError:
            raise KubeApiError("%s %s: the answer is not JSON" % (method, path)) from None

    # --- the agent's calls --------------------------------------------------------------------------
    def get_node(self, name):
        return self.request("GET", "/api/v1/nodes/" + urllib.parse.quote(name, safe=""))

    def list_node(self, name):
        """(node or None, the list's resourceVersion): the starting point of a watch."""
        found = self.request("GET", "/api/v1/nodes", {"fieldSelector": "metadata.name=" + name})
        items = [i for i in found.get("items") or () if (i.get("metadata") or {}).get("name") == name]
        return (items[0] if items else None), (found.get("metadata") or {}).get("resourceVersion")

    def patch_node(self, name, patch):
        return self.request("PATCH", "/api/v1/nodes/" + urllib.parse.quote(name, safe=""), body=patch,
                            content_type=MERGE_PATCH)

    def list_pods(self, namespace, node_name, label_selector):
        """Pods of `namespace` on node `node_name` matching `label_selector` (e.g. `app=x`)."""
        found = self.request("GET", "/api/v1/namespaces/%s/pods" % urllib.parse.quote(namespace, safe=""),
                             {"fieldSelector": "spec.nodeName=" + node_name, "labelSelector": label_selector})
        return found.get("items") or []

    def create_event(self, namespace, event):
        return self.request("POST", "/api/v1/namespaces/%s/events" % urllib.parse.quote(namespace, safe=""),
                            body=event)

    def watch_node(self, name, resource_version, timeout_seconds):
        """Yield the watch's events (dicts) until the server ends the stream; the socket times out
        a little after `timeout_seconds`, so a silent half-open connection cannot hang the agent."""
        query = {"watch": "true", "fieldSelector": "metadata.name=" + name, "allowWatchBookmarks": "true",
                 "timeoutSeconds": str(int(timeout_seconds))}
        if resource_version:
            query["resourceVersion"] = resource_version
        conn, response = self._open("GET", "/api/v1/nodes", query, timeout=timeout_seconds + 30)
        return _events(conn, response, "node %s" % name)

    # --- DRA: ResourceSlices of this node, ResourceClaims ------------------------------------------
    def list_resource_slices(self, node_name, driver):
        """ResourceSlices of `driver` on node `node_name` (field selectors the API server supports for
        them: spec.nodeName, spec.driver)."""
        found = self.request("GET", RESOURCE_API + "/resourceslices",
                             {"fieldSelector": "spec.nodeName=%s,spec.driver=%s" % (node_name, driver)})
        return found.get("items") or []

    def watch_resource_slices(self, node_name, driver, resource_version, timeout_seconds):
        """Yield the events of the ResourceSlices of `driver` on node `node_name` (as list_resource_slices selects
        them) until the server ends the stream; without `resource_version` the stream starts with an ADDED event
        per existing slice."""
        query = {"watch": "true", "fieldSelector": "spec.nodeName=%s,spec.driver=%s" % (node_name, driver),
                 "allowWatchBookmarks": "true", "timeoutSeconds": str(int(timeout_seconds))}
        if resource_version:
            query["resourceVersion"] = resource_version
        conn, response = self._open("GET", RESOURCE_API + "/resourceslices", query, timeout=timeout_seconds + 30)
        return _events(conn, response, "ResourceSlices of node %s" % node_name)

    def create_resource_slice(self, body):
        return self.request("POST", RESOURCE_API + "/resourceslices", body=body)

    def replace_resource_slice(self, body):
        """PUT: the body's metadata.resourceVersion makes a concurrent change a 409."""
        name = urllib.parse.quote(body["metadata"]["name"], safe="")
        return self.request("PUT", RESOURCE_API + "/resourceslices/" + name, body=body)

    def delete_resource_slice(self, name, resource_version=None):
        """DELETE with a resourceVersion precondition (409 when the slice changed since it was listed)."""
        options = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if resource_version:
            options["preconditions"] = {"resourceVersion": resource_version}
        return self.request("DELETE", RESOURCE_API + "/resourceslices/" + urllib.parse.quote(name, safe=""),
                            body=options)

    def list_resource_claims(self):
        """Every ResourceClaim (all namespaces; no field selector serves status.allocation): the DRA driver asks only
        while a device it would withdraw, or the pool earlier releases published, may still be allocated
        (agent_plugin.py)."""
        return self.request("GET", RESOURCE_API + "/resourceclaims").get("items") or []

    def get_resource_claim(self, namespace, name, timeout=None):
        return self.request("GET", "%s/namespaces/%s/resourceclaims/%s" % (
            RESOURCE_API, urllib.parse.quote(namespace, safe=""), urllib.parse.quote(name, safe="")), timeout=timeout)
