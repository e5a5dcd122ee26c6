# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Argument specs shared by the cluster-side modules (no Ansible import: plain dicts).

The auth options copy kubernetes.core's AUTH_ARG_SPEC (plugins/module_utils/args_common.py) name
for name, so `module_defaults` and K8S_AUTH_* environment variables written for kubernetes.core
work unchanged. Environment variables are read when the client is built (k8s_client.py), as
kubernetes.core does, not through argspec fallbacks.
"""

from __future__ import annotations

import copy

PROXY_HEADERS_SPEC = {
    "proxy_basic_auth": {"type": "str", "no_log": True},
    "basic_auth": {"type": "str", "no_log": True},
    "user_agent": {"type": "str"},
}

AUTH_ARG_SPEC = {
    "kubeconfig": {"type": "raw"},
    "context": {"type": "str"},
    "host": {"type": "str"},
    "api_key": {"type": "str", "no_log": True},
    "username": {"type": "str"},
    "password": {"type": "str", "no_log": True},
    "validate_certs": {"type": "bool", "aliases": ["verify_ssl"]},
    "ca_cert": {"type": "path", "aliases": ["ssl_ca_cert"]},
    "client_cert": {"type": "path", "aliases": ["cert_file"]},
    "client_key": {"type": "path", "aliases": ["key_file"], "no_log": False},
    "proxy": {"type": "str"},
    "no_proxy": {"type": "str"},
    "proxy_headers": {"type": "dict", "options": PROXY_HEADERS_SPEC},
    "persist_config": {"type": "bool"},
    "impersonate_user": {"type": "str"},
    "impersonate_groups": {"type": "list", "elements": "str"},
}

# Check mode: `server` sends the write with dryRun=All (admission and validation run, nothing is
# stored); `client` computes the result locally and sends no write at all.
CHECK_MODE_ARG_SPEC = {
    "dry_run": {"type": "str", "choices": ["server", "client"], "default": "server"},
    "conflict_retries": {"type": "int", "default": 5},
}


def cluster_argspec(**own):
    """Auth + check-mode options plus the module's own options (deep copies, safe to mutate)."""
    spec = copy.deepcopy(AUTH_ARG_SPEC)
    spec.update(copy.deepcopy(CHECK_MODE_ARG_SPEC))
    spec.update(copy.deepcopy(own))
    return spec
