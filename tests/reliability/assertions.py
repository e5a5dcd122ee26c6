"""Assertions shared by the reliability tests."""

from __future__ import annotations

import pytest


def one_line_naming(message, name):
    """What every failure path owes the user: one non-empty line that names the object."""
    assert message and "\n" not in message and "\r" not in message, "not one line: %r" % message
    assert name in message, "%r does not name %r" % (message, name)


def params(rows):
    """pytest.param per table row, id from the row; a row with a `bug` is a strict xfail naming it."""
    return [pytest.param(row, id=row["id"],
                         marks=[pytest.mark.xfail(strict=True, reason=row["bug"])] if row.get("bug") else [])
            for row in rows]
