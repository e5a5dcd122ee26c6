# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""kubernetes.core-compatible auth options -> the official `kubernetes` client, plus the I/O the
cluster modules share: one-line API errors, dry runs (read-modify-write with 409 retries and write
plans are in k8s_write.py, which needs no client).

No Ansible import: `run_cluster_module` drives a duck-typed AnsibleModule.
"""

from __future__ import annotations

import json
import os
import traceback

from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError, one_line
# the client-free half, re-exported: callers of k8s_client keep one import
from ansible_collections.accelops.vgpu.plugins.module_utils.cluster.k8s_write import (  # noqa: F401  pylint: disable=unused-import
    ConflictError, K8sError, WritePlan, read_modify_write)

try:
    import kubernetes
    from kubernetes.client.rest import ApiException
    from kubernetes.config.config_exception import ConfigException
    import urllib3
    import yaml
except ImportError:
    HAS_KUBERNETES = False
    KUBERNETES_IMPORT_ERROR = traceback.format_exc()
    ApiException = ConfigException = type("_Unavailable", (Exception,), {})
else:
    HAS_KUBERNETES = True
    KUBERNETES_IMPORT_ERROR = None

ENV_PREFIX = "K8S_AUTH_"
# option -> the Configuration attribute kubernetes.core sets (also read as K8S_AUTH_<ATTRIBUTE>)
_CLIENT_NAMES = {"validate_certs": "verify_ssl", "ca_cert": "ssl_ca_cert",
                 "client_cert": "cert_file", "client_key": "key_file"}
_BOOL_OPTIONS = ("validate_certs", "persist_config")
_SECRET_KEY_HINTS = ("token", "password", "key-data", "secret", "certificate-data")
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
REQUEST_TIMEOUT = 30


def _env_bool(text):
    return str(text).strip().lower() in ("1", "true", "yes", "on", "y", "t")


def auth_from_params(params, environ=None):
    """The auth options, each filled from K8S_AUTH_<OPTION> (or K8S_AUTH_<CLIENT NAME>) when unset."""
    environ = os.environ if environ is None else environ
    auth = {}
    for option in ("kubeconfig", "context", "host", "api_key", "username", "password", "validate_certs",
                   "ca_cert", "client_cert", "client_key", "proxy", "no_proxy", "persist_config",
                   "impersonate_user", "impersonate_groups"):
        value = params.get(option)
        if value is None:
            for name in (option, _CLIENT_NAMES.get(option)):
                if name and (ENV_PREFIX + name.upper()) in environ:
                    value = environ[ENV_PREFIX + name.upper()]
                    break
            if value is not None and option in _BOOL_OPTIONS:
                value = _env_bool(value)
            if value is not None and option == "impersonate_groups":
                value = [g.strip() for g in value.split(",") if g.strip()]
        auth[option] = value
    headers = dict(params.get("proxy_headers") or {})
    for name in ("proxy_basic_auth", "basic_auth", "user_agent"):
        env = ENV_PREFIX + "PROXY_HEADERS_" + name.upper()
        if headers.get(name) is None and env in environ:
            headers[name] = environ[env]
    auth["proxy_headers"] = {k: v for k, v in headers.items() if v is not None}
    return auth


def kubeconfig_secrets(kubeconfig):
    """Secret strings of a dict kubeconfig (tokens, passwords, key data), to add to no_log values."""
    found = []

    def walk(node, sensitive=False):
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, sensitive or any(h in str(key).lower() for h in _SECRET_KEY_HINTS))
        elif isinstance(node, list):
            for value in node:
                walk(value, sensitive)
        elif sensitive and isinstance(node, str) and node:
            found.append(node)
    if isinstance(kubeconfig, dict):
        walk(kubeconfig.get("users") or [])
    return found


def _describe_kubeconfig(kubeconfig):
    if kubeconfig is None:
        return "default kubeconfig (no kubeconfig, host or in-cluster service account given)"
    return "kubeconfig (dict)" if isinstance(kubeconfig, dict) else "kubeconfig %s" % kubeconfig


_SECTIONS = (("clusters", "cluster"), ("contexts", "context"), ("users", "user"))


def _read_kubeconfig(path):
    """The parsed kubeconfig file; a K8sError naming it when it cannot be read or is not YAML."""
    try:
        with open(os.path.expanduser(path), encoding="utf-8") as handle:
            return yaml.safe_load(handle)
    except OSError as exc:
        raise K8sError("kubeconfig %s: cannot read: %s" % (path, exc.strerror or type(exc).__name__)) from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        # Only the problem and its position: the YAML error's snippet could quote a token or key.
        mark = getattr(exc, "problem_mark", None)
        where = " at line %d, column %d" % (mark.line + 1, mark.column + 1) if mark is not None else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise K8sError("kubeconfig %s: not valid YAML%s: %s" % (path, where, " ".join(str(problem).split())))


def kubeconfig_problem(doc, context=None):
    """Why a parsed kubeconfig is unusable, in a few words, or None: the malformed shapes on which the
    kubernetes client raises AttributeError/TypeError/KeyError instead of a ConfigException. Names only
    keys and entry names, never values (they may be secrets)."""
    if not isinstance(doc, dict):
        return "not a kubeconfig mapping (top level is %s)" % type(doc).__name__
    named = {}
    for key, inner in _SECTIONS:
        entries = doc.get(key)
        if entries is None:
            entries = []
        if not isinstance(entries, list):
            return "%s is %s, not a list" % (key, type(entries).__name__)
        for index, entry in enumerate(entries):
            if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                return "%s[%d] is not a mapping with a name" % (key, index)
            if not isinstance(entry.get(inner), dict):
                return "%s[%d] (%r) has no %s mapping" % (key, index, entry["name"], inner)
        named[key] = dict((entry["name"], entry[inner]) for entry in entries)
    name = context or doc.get("current-context")
    if not name:
        return "no context to use (current-context is not set and no context option was given)"
    if not isinstance(name, str) or name not in named["contexts"]:
        return "context %r is not one of its contexts (%s)" % (name, ", ".join(map(repr, named["contexts"])) or "none")
    cluster = named["contexts"][name].get("cluster")
    if not isinstance(cluster, str) or cluster not in named["clusters"]:
        return "context %r names cluster %r, which is not one of its clusters" % (name, cluster)
    user = named["contexts"][name].get("user")
    if user is not None and not isinstance(user, str):
        return "context %r: user is %s, not a name" % (name, type(user).__name__)
    return None


def _first_line(exc):
    text = str(exc).strip()
    return " ".join(text.splitlines()[0].split()) if text else type(exc).__name__


def build_configuration(auth):
    """A kubernetes.client.Configuration from the auth options, as kubernetes.core builds it.

    A given kubeconfig (dict or one file) is checked here first, in one place, so that every malformed
    shape becomes one K8sError line naming it instead of an exception from inside the client.
    """
    config = kubernetes.client.Configuration()
    kubeconfig, context = auth.get("kubeconfig"), auth.get("context")
    explicit = auth.get("host") or auth.get("api_key") or auth.get("username")
    described = _describe_kubeconfig(kubeconfig)
    try:
        if isinstance(kubeconfig, dict):
            problem = kubeconfig_problem(kubeconfig, context)
            if problem:
                raise K8sError("%s: %s" % (described, problem))
            kubernetes.config.load_kube_config_from_dict(
                config_dict=kubeconfig, context=context, client_configuration=config,
                persist_config=bool(auth.get("persist_config")))
        elif kubeconfig:
            path = str(kubeconfig)
            if ":" not in path:  # a KUBECONFIG-style list of files is merged by the client itself
                if not os.path.exists(os.path.expanduser(path)):
                    raise K8sError("kubeconfig %s: file not found" % path)
                problem = kubeconfig_problem(_read_kubeconfig(path), context)
                if problem:
                    raise K8sError("%s: %s" % (described, problem))
            kubernetes.config.load_kube_config(config_file=os.path.expanduser(path), context=context,
                                               client_configuration=config,
                                               persist_config=bool(auth.get("persist_config")))
        elif not explicit:
            try:
                kubernetes.config.load_incluster_config(client_configuration=config)
            except ConfigException:
                kubernetes.config.load_kube_config(context=context, client_configuration=config)
    except K8sError:
        raise
    except (ConfigException, ValueError, TypeError, KeyError, AttributeError, OSError, yaml.YAMLError) as exc:
        # Merged or default kubeconfigs are not pre-checked: whatever the client raises is one line.
        raise K8sError("%s: cannot load: %s" % (described, _first_line(exc))) from None
    for option, attribute in (("host", "host"), ("username", "username"), ("password", "password"),
                              ("validate_certs", "verify_ssl"), ("ca_cert", "ssl_ca_cert"),
                              ("client_cert", "cert_file"), ("client_key", "key_file"),
                              ("proxy", "proxy"), ("no_proxy", "no_proxy")):
        if auth.get(option) is not None:
            setattr(config, attribute, auth[option])
    if auth.get("api_key"):
        config.api_key = {"authorization": "Bearer %s" % auth["api_key"]}
    elif auth.get("username") and auth.get("password"):
        # The generated client only sends api_key["authorization"]; build the Basic header the
        # way kubernetes.config does for basic-auth kubeconfig users.
        basic = urllib3.util.make_headers(basic_auth="%s:%s" % (auth["username"], auth["password"]))
        config.api_key = {"authorization": basic["authorization"]}
    if auth.get("proxy_headers"):
        config.proxy_headers = urllib3.util.make_headers(**auth["proxy_headers"])
    return config


def new_api_client(auth):
    client = kubernetes.client.ApiClient(build_configuration(auth))
    if auth.get("impersonate_user"):
        client.set_default_header("Impersonate-User", auth["impersonate_user"])
    groups = auth.get("impersonate_groups") or []
    if len(groups) > 1:
        # The API server wants one Impersonate-Group header per group; ApiClient sends one value
        # per header name, and a comma-joined value would name a single, wrong group.
        raise K8sError("impersonate_groups %s: the kubernetes Python client can send only one group" % groups)
    if groups:
        client.set_default_header("Impersonate-Group", groups[0])
    return client


def _status_message(exc):
    try:
        body = json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        body = {}
    text = body.get("message") or exc.reason or ""
    return " ".join(str(text).split())[:300]


def api_error(exc, what):
    """One line for an API failure about `what` (e.g. 'KubeVirt kubevirt/kubevirt')."""
    if isinstance(exc, ApiException):
        status = exc.status
        cls = ConflictError if status == 409 else K8sError
        reason = {401: "unauthorized", 403: "forbidden", 404: "not found", 409: "conflict",
                  422: "invalid"}.get(status, "API error")
        return cls("%s: %s (HTTP %s): %s" % (what, reason, status, _status_message(exc)), status=status)
    text = " ".join(str(exc).split())[:300]
    return K8sError("%s: cannot reach the Kubernetes API: %s" % (what, text))


class KubeApi:
    """The few calls the cluster modules make; every failure becomes K8sError naming the object.

    Objects go in and out as plain dicts (custom objects already are; core objects are converted).
    `requests` counts calls and `writes` lists (method, what, dry_run) for callers and tests.
    """

    def __init__(self, api_client):
        self.client = api_client
        self.custom = kubernetes.client.CustomObjectsApi(api_client)
        self.core = kubernetes.client.CoreV1Api(api_client)
        self.apps = kubernetes.client.AppsV1Api(api_client)
        self.writes = []

    def _call(self, what, fn, *args, **kwargs):
        try:
            return fn(*args, _request_timeout=REQUEST_TIMEOUT, **kwargs)
        except ApiException as exc:
            raise api_error(exc, what) from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise api_error(exc, what) from None

    def _dict(self, obj):
        return obj if isinstance(obj, dict) else self.client.sanitize_for_serialization(obj)

    # custom objects -------------------------------------------------------------------------
    def list_custom(self, what, group, version, plural):
        return self._call(what, self.custom.list_cluster_custom_object, group, version, plural)["items"]

    def get_custom(self, what, group, version, plural, name, namespace=None):
        if namespace:
            return self._call(what, self.custom.get_namespaced_custom_object, group, version, namespace, plural, name)
        return self._call(what, self.custom.get_cluster_custom_object, group, version, plural, name)

    def patch_custom(self, what, group, version, plural, name, body, namespace=None, dry_run=False):
        kwargs = {"_content_type": MERGE_PATCH}
        if dry_run:
            kwargs["dry_run"] = "All"
        self.writes.append(("PATCH", what, dry_run))
        if namespace:
            return self._call(what, self.custom.patch_namespaced_custom_object,
                              group, version, namespace, plural, name, body, **kwargs)
        return self._call(what, self.custom.patch_cluster_custom_object, group, version, plural, name, body, **kwargs)

    # core / apps ----------------------------------------------------------------------------
    def get_node(self, name):
        return self._dict(self._call("Node %s" % name, self.core.read_node, name))

    def patch_node(self, name, body, dry_run=False):
        self.writes.append(("PATCH", "Node %s" % name, dry_run))
        kwargs = {"dry_run": "All"} if dry_run else {}
        return self._dict(self._call("Node %s" % name, self.core.patch_node, name, body,
                                     _content_type=MERGE_PATCH, **kwargs))

    def _raw(self, what, fn, *args, **kwargs):
        """The response as the server sent it (JSON, not the client's typed model): a field this client
        version does not know is kept, so a read-modify-write cannot drop it."""
        response = self._call(what, fn, *args, _preload_content=False, **kwargs)
        try:
            return json.loads(response.data)
        except ValueError as exc:
            raise K8sError("%s: the API server's answer is no JSON: %s" % (what, exc)) from None

    def get_deployment(self, name, namespace):
        return self._raw("Deployment %s/%s" % (namespace, name), self.apps.read_namespaced_deployment, name, namespace)

    def patch_deployment(self, name, namespace, body, dry_run=False):
        """`body`: a merge patch (dict) or a JSON patch (list of ops; a failed `test`, HTTP 422, means the
        object changed since it was read: ConflictError, so read_modify_write reads again)."""
        what = "Deployment %s/%s" % (namespace, name)
        self.writes.append(("PATCH", what, dry_run))
        kwargs = {"dry_run": "All"} if dry_run else {}
        json_patch = isinstance(body, list)
        try:
            return self._raw(what, self.apps.patch_namespaced_deployment, name, namespace, body,
                             _content_type=JSON_PATCH if json_patch else MERGE_PATCH, **kwargs)
        except K8sError as exc:
            if json_patch and exc.status == 422:
                raise ConflictError("%s (a JSON patch test failed: it changed since it was read)" % exc,
                                    status=409) from None
            raise


def run_cluster_module(module, engine, missing_lib_message):
    """Shared main() of the cluster modules.

    module: an AnsibleModule (duck-typed). engine(api, params, check_mode) -> result dict with
    `changed`, optional `diff` (dropped unless diff mode) and `warnings`.
    """
    if not HAS_KUBERNETES:
        module.fail_json(msg=missing_lib_message, exception=KUBERNETES_IMPORT_ERROR)
    params = module.params
    for secret in kubeconfig_secrets(params.get("kubeconfig")):
        module.no_log_values.add(secret)
    try:
        api = KubeApi(new_api_client(auth_from_params(params)))
        result = engine(api, params, module.check_mode)
    except EngineError as exc:
        module.fail_json(msg=one_line(exc))
    for warning in result.pop("warnings", []):
        module.warn(warning)
    if not module._diff:  # pylint: disable=protected-access
        result.pop("diff", None)
    module.exit_json(**result)
