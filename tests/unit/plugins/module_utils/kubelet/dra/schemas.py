"""The real Kubernetes JSON schemas (PyPI kubernetes-validate) for the versions the DRA driver targets."""

import kubernetes_validate

VERSIONS = ("1.35.0", "1.36.0", "1.37.0")


def assert_valid(obj):
    """Strict validation (unknown fields are errors) against every targeted Kubernetes version."""
    for version in VERSIONS:
        kubernetes_validate.validate(obj, version, strict=True)
