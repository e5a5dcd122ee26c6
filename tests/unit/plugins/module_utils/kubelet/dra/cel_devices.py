"""DRA CEL selectors evaluated the way the scheduler does (tests/fakes/dra_cel.py, cel-python), with an
expression that cannot be evaluated counted as "not selected"."""

from ansible_collections.accelops.vgpu.tests.fakes.dra_cel import CelError, matches


def selects(expression, driver, device):
    try:
        return matches(expression, driver, device)
    except CelError:
        return False


def selected(expressions, driver, devices):
    """Names of `devices` (API entries) every expression selects."""
    return sorted(d["name"] for d in devices if all(selects(e, driver, d) for e in expressions))
