# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Errors of the kubelet side that plain-data code raises too (standard library only)."""

from __future__ import annotations

from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError


class SocketPathError(EngineError):
    """A socket path the kernel cannot bind."""


class AllocationError(EngineError):
    """An Allocate the plugin refuses (unknown device ID); the message names the resource and the ID."""
