# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The errors of the in-cluster API client (agent/kube.py). They live below every layer: the kubelet plugins
(kubelet/dra) call the agent's client through an injected object and tell a lost race (409) or an API outage
from their own failures without importing the agent above them."""

from __future__ import annotations

from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError


class KubeUnavailable(EngineError):
    """The API server did not answer (refused, reset, timed out, TLS)."""


class KubeApiError(EngineError):
    """The API server answered with an error Status. `retry_after`: seconds the server asked us to
    wait (429/5xx `Retry-After`, or the Status' details.retryAfterSeconds), else None."""

    def __init__(self, message, status=None, reason=None, retry_after=None):
        super().__init__(message)
        self.status, self.reason, self.retry_after = status, reason, retry_after
