# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Integer amounts written as the API server stores them: resource.Quantity's canonical form.

kube-apiserver keeps every quantity canonical (k8s.io/apimachinery pkg/api/resource/quantity.go,
Quantity.CanonicalizeBytes), so a ResourceSlice written with `24576Mi` comes back as `24Gi`, and a
publisher that compares what it wants with what it lists would rewrite it every time. What we write
is therefore already canonical, for the two suffix families we use:

    binary(25769803776) -> "24Gi"    (BinarySI: the largest power of 1024 that divides it; none: decimal)
    decimal(1500) -> "1500", decimal(3000) -> "3k", decimal(24) -> "24"   (DecimalSI: exponents of 1000)
    mebibytes(24576) -> "24Gi"
"""

from __future__ import annotations

BINARY_SUFFIXES = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
DECIMAL_SUFFIXES = ("", "k", "M", "G", "T", "P", "E")
MEBI = 1024 * 1024


def _integer(amount):
    if isinstance(amount, bool) or not isinstance(amount, int):
        raise TypeError("a quantity here is an integer, not %r" % (amount,))
    return ("-" if amount < 0 else ""), abs(amount)


def decimal(amount):
    """The DecimalSI form of the integer `amount`: trailing zeros move into a suffix in steps of three
    (int64Amount.AsCanonicalBytes: factors of ten removed, the exponent brought down to a multiple of 3)."""
    sign, rest = _integer(amount)
    if rest == 0:
        return "0"
    power = 0
    while rest % 1000 == 0 and power < len(DECIMAL_SUFFIXES) - 1:
        rest //= 1000
        power += 1
    return "%s%d%s" % (sign, rest, DECIMAL_SUFFIXES[power])


def binary(amount):
    """The integer `amount` (bytes) with the largest binary suffix that divides it; one that 1024 does not
    divide has no binary form: a number without a suffix is read back as DecimalSI (10000 -> 10k), so it is
    written so (CanonicalizeBytes writes amounts under 1024 in magnitude as DecimalSI too)."""
    sign, rest = _integer(amount)
    power = 0
    while rest >= 1024 and rest % 1024 == 0 and power < len(BINARY_SUFFIXES) - 1:
        rest //= 1024
        power += 1
    return "%s%d%s" % (sign, rest, BINARY_SUFFIXES[power]) if power else decimal(amount)


def mebibytes(amount):
    """`amount` MiB as the API server stores it (24576 -> 24Gi, 512 -> 512Mi)."""
    return binary(amount * MEBI)
