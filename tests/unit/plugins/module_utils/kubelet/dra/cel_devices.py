"""DRA CEL selectors evaluated the way the scheduler does, with a CEL implementation from PyPI (cel-python).

The scheduler's environment (k8s.io/dynamic-resource-allocation cel/compile.go): `device.driver`,
`device.attributes[<domain>].<id>` and `device.capacity[<domain>].<id>`, where a qualified attribute
name `domain/id` splits at the slash and an unqualified one belongs to the driver's domain.
"""

import celpy


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


def selects(expression, driver, device):
    env = celpy.Environment()
    result = env.program(env.compile(expression)).evaluate(activation(driver, device))
    if isinstance(result, Exception):   # a missing attribute is an error, which the scheduler counts as "no"
        return False
    return bool(result)


def selected(expressions, driver, devices):
    """Names of `devices` (API entries) every expression selects."""
    return sorted(d["name"] for d in devices if all(selects(e, driver, d) for e in expressions))
