"""DRA CEL selectors evaluated the way kube-scheduler does, with a CEL implementation from PyPI (cel-python).

The scheduler's environment (k8s.io/dynamic-resource-allocation cel/compile.go): `device.driver`,
`device.attributes[<domain>].<id>` and `device.capacity[<domain>].<id>`, where a qualified attribute
name `domain/id` splits at the slash and an unqualified one belongs to the driver's domain.

`matches` raises CelError for an expression that does not compile or fails at run time (e.g. a missing
attribute): the structured allocator returns that as an error ("CEL runtime error"), which leaves the
claim unallocated, rather than treating it as false (k8s.io/dynamic-resource-allocation
structured/allocator.go, selectorsMatch).
"""

from __future__ import annotations

import celpy


class CelError(Exception):
    """A selector that does not compile or fails when evaluated."""


def activation(driver, device):
    """The CEL `device` variable for one ResourceSlice device entry of `driver`."""
    attributes, capacity = {}, {}
    for name, value in (device.get("attributes") or {}).items():
        domain, dummy, ident = name.rpartition("/")
        attributes.setdefault(domain or driver, {})[ident] = next(iter(value.values()))
    for name, value in (device.get("capacity") or {}).items():
        domain, dummy, ident = name.rpartition("/")
        capacity.setdefault(domain or driver, {})[ident] = value["value"]
    return celpy.json_to_cel({"device": {"driver": driver, "attributes": attributes, "capacity": capacity}})


def matches(expression, driver, device):
    """Whether the CEL `expression` selects the device; CelError when it cannot be evaluated."""
    env = celpy.Environment()
    try:
        result = env.program(env.compile(expression)).evaluate(activation(driver, device))
    except Exception as exc:   # celpy raises its parse and evaluation errors as various types
        raise CelError("%s: %s" % (expression, " ".join(str(exc).split()))) from None
    if isinstance(result, Exception):   # celpy returns some evaluation errors as values
        raise CelError("%s: %s" % (expression, result))
    if not isinstance(result, celpy.celtypes.BoolType):
        raise CelError("%s: evaluates to %s, not a bool" % (expression, type(result).__name__))
    return bool(result)
