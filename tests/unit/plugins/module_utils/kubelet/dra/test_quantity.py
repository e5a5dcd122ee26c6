"""Quantities as the API server stores them (kubelet/dra/quantity.py), and the API double's canonicalizer
(tests/fakes/kube_api_rules.canonical_quantity) checked against the same cases from apimachinery's
pkg/api/resource/quantity_test.go and against each other."""

from __future__ import annotations

import random

import pytest

from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import devices, quantity
from ansible_collections.accelops.vgpu.tests.fakes import kube_api_rules

# (written, stored) as kube-apiserver answers them
STORED = [("24576Mi", "24Gi"), ("1024Mi", "1Gi"), ("512Mi", "512Mi"), ("0.5Gi", "512Mi"), ("1.5Gi", "1536Mi"),
          ("1Ki", "1Ki"), ("1.5Ki", "1536"), ("1023", "1023"), ("1024", "1024"), ("1000", "1k"), ("1500", "1500"),
          ("30000", "30k"), ("0.1", "100m"), ("1000m", "1"), ("1e3", "1e3"), ("1.5e3", "1500"), ("1E", "1E"),
          ("0", "0"), ("-1024Mi", "-1Gi"), ("0.0000000001", "1n"), ("48Gi", "48Gi")]


@pytest.mark.parametrize("written, stored", STORED)
def test_the_api_double_stores_quantities_as_kube_apiserver(written, stored):
    assert kube_api_rules.canonical_quantity(written) == stored


@pytest.mark.parametrize("amount, stored", [(25769803776, "24Gi"), (536870912, "512Mi"), (1536, "1536"),
                                            (1024, "1Ki"), (1000, "1k"), (1023, "1023"), (0, "0"), (-2048, "-2Ki"), (10000, "10k"),
                                            (2 ** 60, "1Ei")])
def test_binary_amounts_are_written_canonical(amount, stored):
    assert quantity.binary(amount) == stored


@pytest.mark.parametrize("amount, stored", [(1500, "1500"), (3000, "3k"), (30000, "30k"), (24, "24"), (0, "0"),
                                            (10 ** 18, "1E"), (-5000000, "-5M")])
def test_decimal_amounts_are_written_canonical(amount, stored):
    assert quantity.decimal(amount) == stored


def test_what_we_write_comes_back_unchanged():
    rng = random.Random(31)
    amounts = [rng.choice([1, 3, 1000, 1024, 1536]) * rng.choice([1, 10, 1000, 1024, 1024 ** 2, 1024 ** 3])
               for dummy in range(500)] + [rng.randrange(-10 ** 12, 10 ** 12) for dummy in range(500)]
    for amount in amounts:
        for written in (quantity.binary(amount), quantity.decimal(amount)):
            assert kube_api_rules.canonical_quantity(written) == written, amount
    for mib in range(1, 200):    # every profile size: framebuffer in MiB
        assert kube_api_rules.canonical_quantity("%dMi" % mib) == quantity.mebibytes(mib)


def test_a_device_publishes_its_framebuffer_canonical():
    device = devices.DraDevice(name="l40s-24q-0000-41-00-4", framework="vendor-vfio", address="0000:41:00.4",
                               parent_gpu="0000:41:00.0", profile="L40S-24Q", type_name="NVIDIA L40S-24Q",
                               type_id=1155, framebuffer_mib=24576)
    assert device.to_api()["capacity"] == {"framebuffer": {"value": "24Gi"}}


def test_the_double_refuses_what_is_no_quantity():
    for text in ("", "24 Gi", "1.2.3", "Gi", "1Zi", 24):
        with pytest.raises(ValueError):
            kube_api_rules.canonical_quantity(text)
