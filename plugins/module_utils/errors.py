# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The engine's error base: every error names its object and reads as one line."""

from __future__ import annotations


class EngineError(Exception):
    """Base of all engine errors. str(err) is the one-line message shown to users. `held`: the devices (VF
    addresses, mdev UUIDs) whose holders refused the change, where that is the reason (the node agent asks them
    again until one is free); empty otherwise."""

    held = ()

    def __init__(self, *args, held=()):
        super().__init__(*args)
        self.held = tuple(held)


def shown(value):
    """A user-given name for a message: as is when it prints on one line, else quoted with repr()
    (`'bad\\nkey'`), so the message stays one line and the odd characters stay visible."""
    text = str(value)
    return text if text.isprintable() else repr(text)


def one_line(message):
    """The safety net where an engine error becomes a user message (module fail_json, CLI stderr):
    newlines and other control characters are escaped (`\\n`). Sources quote such input themselves
    (shown(), %r); this only keeps a message one line when one slipped through."""
    return "".join(char if char.isprintable() else char.encode("unicode_escape").decode("ascii")
                   for char in str(message))
