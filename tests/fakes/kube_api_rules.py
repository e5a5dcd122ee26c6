"""What a real Kubernetes API server decides about a request, as plain functions the API server
double (kmock_serve.py) applies: which field selectors a resource supports, how label and field
selectors match, which patch a Content-Type means and how it applies, and what a watch with a
selector sees of a change. Stdlib and `jsonpatch` only (kmock's dependency), no server state.

Extension points (a new resource the double must serve strictly):
- SELECTABLE_FIELDS: the field selectors of a built-in resource beyond metadata.name/namespace
  (from the resource's `*ToSelectableFields` in kubernetes/pkg/registry/...); a custom resource
  declares its own with `"selectableFields": [...]` in the double's reset state (the CRD's
  `spec.versions[].selectableFields`, Kubernetes 1.31+); anything else gets 400 like a real server.
- STRATEGIC_MERGE_KEYS: the `patchMergeKey` of list fields a strategic merge patch merges by key
  (from the Go types' `patchStrategy:"merge" patchMergeKey:...` tags); other lists are replaced.
- is_builtin(): built-in groups take strategic merge patches, custom resources answer 415.
- delete_options() / check_preconditions(): a DELETE's DeleteOptions as the real server reads and
  checks them (generic: every resource).
"""

from __future__ import annotations

import copy
import fractions
import json
import re
import time

import jsonpatch

METADATA_FIELDS = ("metadata.name", "metadata.namespace")

# "group/version/plural" (core: "v1/plural") -> field selectors beyond METADATA_FIELDS.
SELECTABLE_FIELDS = {
    # pkg/registry/core/pod/strategy.go ToSelectableFields
    "v1/pods": ("spec.nodeName", "spec.restartPolicy", "spec.schedulerName", "spec.serviceAccountName",
                "spec.hostNetwork", "status.phase", "status.podIP", "status.podIPs", "status.nominatedNodeName"),
    # pkg/registry/core/node/strategy.go NodeToSelectableFields
    "v1/nodes": ("spec.unschedulable",),
    # pkg/registry/core/namespace/strategy.go NamespaceToSelectableFields
    "v1/namespaces": ("status.phase",),
    # pkg/registry/core/event/strategy.go ToSelectableFields
    "v1/events": ("involvedObject.kind", "involvedObject.namespace", "involvedObject.name",
                  "involvedObject.uid", "involvedObject.apiVersion", "involvedObject.resourceVersion",
                  "involvedObject.fieldPath", "reason", "reportingComponent", "source", "type"),
    # pkg/registry/core/secret/strategy.go SelectableFields
    "v1/secrets": ("type",),
    # pkg/registry/resource/resourceslice/strategy.go toSelectableFields
    "resource.k8s.io/v1/resourceslices": ("spec.nodeName", "spec.driver"),
}

# list field name -> patchMergeKey (k8s.io/api/core/v1/types.go, apps/v1, meta/v1 tags). Keyed by
# the field's name, not its path: right for every object the tests write; add a path if one differs.
STRATEGIC_MERGE_KEYS = {
    "containers": "name", "initContainers": "name", "ephemeralContainers": "name", "env": "name",
    "volumes": "name", "volumeMounts": "mountPath", "volumeDevices": "devicePath", "ports": "containerPort",
    "imagePullSecrets": "name", "conditions": "type", "ownerReferences": "uid", "taints": "key",
    "hostAliases": "ip", "topologySpreadConstraints": "topologyKey",
}
# lists of scalars with patchStrategy "merge": the patch's items are added to the stored ones
STRATEGIC_MERGE_SETS = ("finalizers",)

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"


class ApiError(Exception):
    """A request the real server refuses: HTTP status, Status reason, message, Status details."""

    def __init__(self, status, reason, message, details=None):
        super().__init__(message)
        self.status, self.reason, self.message, self.details = status, reason, message, details


def resource_key(group, version, plural):
    return "%s/%s/%s" % (group, version, plural) if group else "%s/%s" % (version, plural)


def is_builtin(group):
    """Core, unqualified (apps, batch) and *.k8s.io groups are compiled in; others are CRDs."""
    return group == "" or "." not in group or group.endswith(".k8s.io")


def qualified(plural, group):
    """`plural.group` (core: `plural`), as the real server names a resource in its messages."""
    return "%s.%s" % (plural, group) if group else plural


# --- selectors ----------------------------------------------------------------------------------
_LABEL_SET = re.compile(r"^\s*([^\s!=,()]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")
_LABEL_EXISTS = re.compile(r"^\s*(!?)\s*([^\s!=,()]+)\s*$")
_EQUALITY = re.compile(r"^\s*([^\s!=,()]+)\s*(==|!=|=)\s*([^\s!=,()]*)\s*$")


def _split_terms(selector):
    """Comma-separated terms, commas inside `in (a,b)` kept."""
    terms, depth, current = [], 0, ""
    for char in selector:
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += char
    terms.append(current)
    return [term for term in terms if term.strip()]


def label_selector(selector):
    """A predicate over a labels dict for a label selector (k8s.io/apimachinery/pkg/labels):
    `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k`, `!k`. 400 on anything else."""
    checks = [_label_requirement(term) for term in _split_terms(selector or "")]
    return lambda labels: all(check(labels or {}) for check in checks)


def _label_requirement(term):
    """A predicate over a labels dict for one requirement of a label selector."""
    found = _LABEL_SET.match(term)
    if found:
        key, values = found.group(1), {v.strip() for v in found.group(3).split(",")}
        if found.group(2) == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    found = _EQUALITY.match(term)
    if found:
        key, op, value = found.groups()
        if op == "!=":
            return lambda labels: labels.get(key) != value
        return lambda labels: key in labels and labels[key] == value
    found = _LABEL_EXISTS.match(term)
    if found:
        negate, key = found.groups()
        if negate:
            return lambda labels: key not in labels
        return lambda labels: key in labels
    raise ApiError(400, "BadRequest", "unable to parse requirement: %r" % term.strip())


def field_terms(selector, supported):
    """[(field, op, value)] of a field selector (`=`, `==`, `!=` only, as the real server);
    400 "field label not supported" for a field outside `supported`."""
    terms = []
    for term in _split_terms(selector or ""):
        found = _EQUALITY.match(term)
        if not found:
            raise ApiError(400, "BadRequest", "invalid selector: '%s'; can't understand '%s'" % (selector, term))
        field, op, value = found.groups()
        if field not in supported:
            raise ApiError(400, "BadRequest", "field label not supported: %s" % field)
        terms.append((field, op, value))
    return terms


def field_value(obj, field):
    """The string a field selector compares with: missing -> "", booleans lower-case."""
    value = obj
    for part in field.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):   # status.podIPs: the first one, as the pod strategy does
        value = value[0].get("ip") if value and isinstance(value[0], dict) else None
    return "" if value is None else str(value)


class Selector:
    """A list/watch request's label and field selectors, checked against the resource."""

    def __init__(self, labels, fields, supported):
        self.labels = label_selector(labels)
        self.fields = field_terms(fields, supported)

    def name(self):
        """The name a `metadata.name=X` term pins, else None."""
        for field, op, value in self.fields:
            if field == "metadata.name" and op != "!=":
                return value
        return None

    def matches(self, obj):
        if obj is None:
            return False
        meta = obj.get("metadata") or {}
        if not self.labels(meta.get("labels") or {}):
            return False
        return all((field_value(obj, field) == value) == (op != "!=") for field, op, value in self.fields)


def watch_event(kind, obj, prev, selector):
    """What a watch with `selector` is sent for a stored change (k8s.io/apiserver cacher
    cache_watcher.go convertToWatchEvent): an object entering the selection is ADDED, one leaving it
    DELETED (its previous content, the new resourceVersion), one staying MODIFIED; else nothing."""
    now = kind != "DELETED" and selector.matches(obj)
    before = prev is not None and selector.matches(prev)
    if now and not before:
        return {"type": "ADDED", "object": copy.deepcopy(obj)}
    if now:
        return {"type": kind, "object": copy.deepcopy(obj)}
    if before:
        gone = copy.deepcopy(prev)
        gone.setdefault("metadata", {})["resourceVersion"] = (obj.get("metadata") or {}).get("resourceVersion")
        return {"type": "DELETED", "object": gone}
    return None


# --- patches ------------------------------------------------------------------------------------
def patch_type(content_type, group):
    """The patch a PATCH's Content-Type names (k8s.io/apiserver handlers/patch.go); 415 otherwise,
    and for a strategic merge patch on a custom resource, as the real server."""
    media = (content_type or "").split(";")[0].strip().lower()
    accepted = [JSON_PATCH, MERGE_PATCH, APPLY_PATCH]
    if is_builtin(group):
        accepted.insert(2, STRATEGIC_MERGE_PATCH)
    if media not in accepted:
        raise ApiError(415, "UnsupportedMediaType", "the body of the request was in an unknown format - "
                       "accepted media types include: " + ", ".join(accepted))
    if media == APPLY_PATCH:
        raise ApiError(415, "UnsupportedMediaType", "server-side apply is not implemented by the API server "
                       "double (tests/fakes/kmock_serve.py)")
    return media


def apply_patch(media, stored, patch):
    """The object `stored` becomes under `patch` of type `media`; 400/422 for a malformed patch."""
    if media == JSON_PATCH:
        if not isinstance(patch, list):
            raise ApiError(400, "BadRequest", "json: cannot unmarshal object into Go value of type jsonpatch.Patch")
        try:
            return jsonpatch.apply_patch(copy.deepcopy(stored), patch)
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
            raise ApiError(422, "Invalid", "the server rejected our request due to an error in our request: %s" % exc)
    if not isinstance(patch, dict):
        raise ApiError(400, "BadRequest", "json: cannot unmarshal array into Go value of type map[string]interface {}")
    if media == MERGE_PATCH:
        return merge_patch(stored, patch)
    return strategic_merge_patch(stored, patch)


def merge_patch(target, patch):
    """RFC 7386 JSON merge patch: objects merge, null deletes, everything else (lists too) replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target, patch, field=None):
    """A strategic merge patch (k8s.io/apimachinery/pkg/util/strategicpatch): as a merge patch,
    except that lists in STRATEGIC_MERGE_KEYS merge item by item on their key and lists in
    STRATEGIC_MERGE_SETS gain the patch's items. `$patch`/`$retainKeys` directives: 400 (not modelled)."""
    if isinstance(patch, list):
        if field in STRATEGIC_MERGE_SETS and isinstance(target, list):
            return copy.deepcopy(target) + [item for item in patch if item not in target]
        key = STRATEGIC_MERGE_KEYS.get(field)
        if key is None or not isinstance(target, list):
            return copy.deepcopy(patch)
        result = copy.deepcopy(target)
        for item in patch:
            index = next((i for i, have in enumerate(result)
                          if isinstance(have, dict) and isinstance(item, dict) and have.get(key) == item.get(key)), None)
            if index is None:
                result.append(copy.deepcopy(item))
            else:
                result[index] = strategic_merge_patch(result[index], item)
        return result
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for name, value in patch.items():
        if name.startswith("$"):
            raise ApiError(400, "BadRequest", "the strategic merge patch directive %s is not modelled by the API "
                           "server double (tests/fakes/kube_api_rules.py)" % name)
        if value is None:
            result.pop(name, None)
        else:
            result[name] = strategic_merge_patch(result.get(name), value, name)
    return result


# --- DELETE -------------------------------------------------------------------------------------
PROPAGATION_POLICIES = ("Foreground", "Background", "Orphan")


def _invalid_delete_options(field, detail):
    """422 as errors.NewInvalid(GroupKind{meta.k8s.io, DeleteOptions}, "", errs) words it."""
    return ApiError(422, "Invalid", 'DeleteOptions.meta.k8s.io "" is invalid: %s: %s' % (field, detail))


def delete_options(body, data, query):
    """The DeleteOptions of a DELETE (k8s.io/apiserver endpoints/handlers/delete.go DeleteResource):
    from the body when there is one (the query is then ignored, as there), else from the query
    (`dryRun`, `propagationPolicy`, `orphanDependents`, `gracePeriodSeconds`); validated as
    apimachinery's meta/v1/validation ValidateDeleteOptions does (422). `query`: a multidict.
    Returns {"dryRun": bool, "propagationPolicy": str or None, "orphanDependents": bool or None,
    "preconditions": {"uid"?, "resourceVersion"?}}."""
    if body:
        if not isinstance(data, dict):
            raise ApiError(400, "BadRequest", "the body of the request is not a JSON object")
        if data.get("kind", "DeleteOptions") != "DeleteOptions":
            raise ApiError(400, "BadRequest", "decoded object cannot be converted to DeleteOptions (kind %s)"
                           % data["kind"])
        options = dict(data)
    else:
        options = {"dryRun": query.getall("dryRun", [])}
        for name in ("propagationPolicy", "orphanDependents", "gracePeriodSeconds"):
            if name in query:
                options[name] = query[name]
        if "orphanDependents" in options:
            options["orphanDependents"] = options["orphanDependents"] in ("true", "1")
    dry_run = options.get("dryRun") or []
    preconditions = options.get("preconditions") or {}
    if not isinstance(dry_run, list) or not isinstance(preconditions, dict):
        raise ApiError(400, "BadRequest", "DeleteOptions: dryRun must be a list and preconditions an object")
    policy, orphan = options.get("propagationPolicy"), options.get("orphanDependents")
    if orphan is not None and policy is not None:
        raise _invalid_delete_options("propagationPolicy", 'Invalid value: "%s": orphanDependents and '
                                      'deletionPropagation cannot be both set' % policy)
    if policy is not None and policy not in PROPAGATION_POLICIES:
        raise _invalid_delete_options("propagationPolicy", 'Unsupported value: "%s": supported values: "Foreground", '
                                      '"Background", "Orphan", "nil"' % policy)
    if any(value != "All" for value in dry_run):
        raise _invalid_delete_options("dryRun", 'Unsupported value: []string{%s}: supported values: "All"'
                                      % ", ".join(json.dumps(value) for value in dry_run))
    return {"dryRun": bool(dry_run), "propagationPolicy": policy, "orphanDependents": orphan,
            "preconditions": {k: v for k, v in preconditions.items() if k in ("uid", "resourceVersion") and v is not None}}


def check_preconditions(preconditions, obj, kind, group):
    """409 `Conflict` when the stored `obj` does not meet a DELETE's preconditions, worded as
    k8s.io/apiserver registry/rest/delete.go BeforeDelete does (the check the generic registry's
    Store.Delete makes on the object it just read; UID first, then resourceVersion). The storage
    layer's own check (etcd3 store.go, "Precondition failed: ...") only fires when a write falls
    between that read and the delete, which this single-threaded double cannot interleave."""
    meta = obj.get("metadata") or {}
    name = meta.get("name")
    checks = (("uid", "UID", "The object might have been deleted and then recreated"),
              ("resourceVersion", "ResourceVersion", "The object might have been modified"))
    for field, label, hint in checks:
        if field in preconditions and preconditions[field] != meta.get(field, ""):
            message = "the %s in the precondition (%s) does not match the %s in record (%s). %s" % (
                label, preconditions[field], label, meta.get(field, ""), hint)
            raise ApiError(409, "Conflict", 'Operation cannot be fulfilled on %s "%s": %s' % (
                qualified(kind, group), name, message), {"name": name, "group": group, "kind": kind})


# --- quantities ---------------------------------------------------------------------------------
# k8s.io/apimachinery pkg/api/resource/quantity.go: ParseQuantity reads <sign><number><suffix> (a binary suffix
# Ki..Ei, a decimal one n u m "" k M G T P E, or an exponent e<n>/E<n>), keeps the suffix family as the Format
# and rounds anything finer than 10^-9 up (away from zero); the object is stored with its quantities as
# Quantity.MarshalJSON writes them, CanonicalizeBytes: BinarySI for an integer of magnitude >= 1024 (the largest
# binary suffix dividing it), DecimalSI or DecimalExponent otherwise, the mantissa's factors of ten moved into an
# exponent that is a multiple of 3 (int64Amount.AsCanonicalBytes).
_QUANTITY = re.compile(r"^([+-]?)([0-9]+\.?[0-9]*|\.[0-9]+)(?:(Ki|Mi|Gi|Ti|Pi|Ei)|([numkMGTPE]?)|[eE]([+-]?[0-9]+))$")
_BIN_POWER = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DEC_EXPONENT = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_DEC_SUFFIX = {exponent: suffix for suffix, exponent in _DEC_EXPONENT.items()}
_BIN_SUFFIX = {power: suffix for suffix, power in _BIN_POWER.items()}


def canonical_quantity(text):
    """`text` as kube-apiserver stores it ("24576Mi" -> "24Gi", "0.5" -> "500m", "1000" -> "1k"); ValueError
    for what ParseQuantity refuses."""
    match = _QUANTITY.match(text) if isinstance(text, str) else None
    if not match:
        raise ValueError("quantities must match the regular expression "
                         "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")
    sign, number, binary, decimal, exponent = match.groups()
    value = fractions.Fraction(number)
    if binary:
        value, form = value * 1024 ** _BIN_POWER[binary], "BinarySI"
    elif exponent is not None:
        value, form = value * fractions.Fraction(10) ** int(exponent), "DecimalExponent"
    else:
        value, form = value * fractions.Fraction(10) ** _DEC_EXPONENT[decimal], "DecimalSI"
    nanos = -((-value * 10 ** 9) // 1)          # rounded up to a whole number of 10^-9
    if nanos == 0:
        return "0"
    sign = "-" if sign == "-" else ""
    if form == "BinarySI" and nanos % 10 ** 9 == 0 and nanos >= 1024 * 10 ** 9:
        whole, power = nanos // 10 ** 9, 0
        while whole % 1024 == 0 and whole >= 1024:
            whole, power = whole // 1024, power + 1
        return "%s%d%s" % (sign, whole, _BIN_SUFFIX.get(power, ""))
    mantissa, power = nanos, -9
    while mantissa % 10 == 0 and mantissa >= 10:
        mantissa, power = mantissa // 10, power + 1
    mantissa, power = mantissa * 10 ** (power % 3), power - power % 3
    if form == "DecimalExponent":
        return "%s%d%s" % (sign, mantissa, "e%d" % power if power else "")
    return "%s%d%s" % (sign, mantissa, _DEC_SUFFIX[power])


def _quantity_fields(resource, obj):
    """[(container, key)] of every quantity in a stored `obj` of `resource` ("group/version/plural"): ResourceSlice
    (k8s.io/api resource/v1 types.go) device capacity values and request policies, counter values."""
    if not resource.endswith("resource.k8s.io/v1/resourceslices") or not isinstance(obj, dict):
        return []
    spec = obj.get("spec") or {}
    found = []

    def counters(entry):
        for counter in ((entry or {}).get("counters") or {}).values():
            if isinstance(counter, dict) and "value" in counter:
                found.append((counter, "value"))

    for counter_set in spec.get("sharedCounters") or ():
        counters(counter_set)
    for device in spec.get("devices") or ():
        for capacity in ((device or {}).get("capacity") or {}).values():
            if not isinstance(capacity, dict):
                continue
            if "value" in capacity:
                found.append((capacity, "value"))
            policy = capacity.get("requestPolicy") or {}
            if "default" in policy:
                found.append((policy, "default"))
            values = policy.get("validValues") or []
            found += [(values, index) for index in range(len(values))]
            found += [(policy["validRange"], key) for key in ("min", "max", "step")
                      if key in (policy.get("validRange") or {})]
        for consumption in (device or {}).get("consumesCounters") or ():
            counters(consumption)
    return found


def canonicalize(resource, obj):
    """`obj` (changed in place, and returned) with its quantities as the API server stores them; 422 `Invalid`
    for one that does not parse, as validation answers."""
    for container, key in _quantity_fields(resource, obj):
        try:
            container[key] = canonical_quantity(container[key])
        except ValueError as exc:
            raise ApiError(422, "Invalid", "%s: Invalid value: %s: %s" % (key, json.dumps(container[key]), exc)) \
                from None
    if str(resource).endswith("resourceslices") and isinstance(obj, dict):
        # a device taint written without timeAdded gets the time of the write (resource/v1 DeviceTaint.TimeAdded)
        for device in (obj.get("spec") or {}).get("devices") or ():
            for taint in device.get("taints") or ():
                taint.setdefault("timeAdded", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    return obj


# Feature gates an API server of the test may run with off (the reset state's "disabledFeatures"). A disabled
# field is dropped from a written object, not refused: k8s.io/kubernetes pkg/registry/resource/resourceslice/
# strategy.go dropDisabledFields (dropDisabledDRAPartitionableDevicesFields: spec.sharedCounters and
# devices[].consumesCounters; dropDisabledDRAConsumableCapacityFields: devices[].allowMultipleAllocations and
# capacity[].requestPolicy; dropDisabledDRADeviceTaintsFields: devices[].taints), which is what an API server older
# than the fields or with the gates off answers.
DRA_GATED_FIELDS = ("DRAPartitionableDevices", "DRAConsumableCapacity", "DRADeviceTaints")


def drop_disabled_fields(plural, obj, disabled):
    """`obj` (a ResourceSlice being created or replaced) without the fields of the `disabled` gates."""
    if plural != "resourceslices" or not disabled or not isinstance(obj, dict):
        return obj
    spec = obj.get("spec") or {}
    if "DRAPartitionableDevices" in disabled:
        spec.pop("sharedCounters", None)
    for device in spec.get("devices") or ():
        if "DRAPartitionableDevices" in disabled:
            device.pop("consumesCounters", None)
        if "DRADeviceTaints" in disabled:
            device.pop("taints", None)
        if "DRAConsumableCapacity" in disabled:
            device.pop("allowMultipleAllocations", None)
            for capacity in (device.get("capacity") or {}).values():
                capacity.pop("requestPolicy", None)
    return obj
