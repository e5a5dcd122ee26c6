# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The engine's error base: every error names its object and reads as one line."""

from __future__ import annotations


class EngineError(Exception):
    """Base of all engine errors. str(err) is the one-line message shown to users."""
