# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The client-free half of the cluster I/O: write plans, one-line API errors, read-modify-write.

Kept apart from k8s_client.py, which imports the `kubernetes` client (a third of a second): the
KubeVirt and GPU Operator planners import only this, so the `vgpu_cluster_plan` filter (loaded in
every Ansible worker that resolves one of this collection's filters) and the unit tests never pay
for the client.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError


@dataclass
class WritePlan:
    """What a run would write: `patch` (None = nothing), one line per change, diff before/after."""

    patch: dict | None
    changes: list = field(default_factory=list)
    before: dict = field(default_factory=dict)
    after: dict = field(default_factory=dict)

    @property
    def changed(self):
        return self.patch is not None


class K8sError(EngineError):
    """A failed API interaction, as one line naming the object."""

    def __init__(self, message, status=None):
        super().__init__(message)
        self.status = status


class ConflictError(K8sError):
    """409: the object changed since we read it."""


def read_modify_write(read, plan, write, retries):
    """Read, plan, write; on 409 (someone wrote in between) read and plan again, `retries` times.

    read() -> obj; plan(obj) -> result with `.patch` (None = nothing to do); write(obj, patch).
    Returns (obj as read last, plan result, attempts).
    """
    attempt = 0
    while True:
        attempt += 1
        current = read()
        result = plan(current)
        if result.patch is None:
            return current, result, attempt
        try:
            write(current, result.patch)
            return current, result, attempt
        except ConflictError as exc:
            if attempt > retries:
                raise K8sError("%s (gave up after %d attempts)" % (exc, attempt), status=409) from None
