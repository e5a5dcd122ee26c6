# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    # The options of the cluster modules that write objects (kubevirt_hostdevices, gpu_operator_policy,
    # node_labels): how check mode computes its result and how 409 conflicts are retried.
    DOCUMENTATION = r"""
attributes:
  check_mode:
    support: full
    description: Server-side dry run (O(dry_run=server)) or a local computation (O(dry_run=client)); no write is stored.
  diff_mode:
    support: full
    description: Before and after of the fields (or list entries, or labels) the module manages, nothing else.
options:
  dry_run:
    description:
      - How check mode computes its result.
      - V(server) sends the write with C(dryRun=All), so admission and validation run and nothing
        is stored (every supported Kubernetes version has server-side dry run).
      - V(client) computes the result locally and sends no write at all.
    type: str
    choices: [server, client]
    default: server
  conflict_retries:
    description:
      - How many times to read, merge and write again when the object changed between read and
        write (HTTP 409 on the resourceVersion guard).
    type: int
    default: 5
"""
