# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Ansible side shared by the node modules: argspec of the node roots, engine objects, results.

The only module_utils file that knows about AnsibleModule (it takes one as an argument; it does not
import Ansible). A node module then reads:

    module = AnsibleModule(argument_spec=node_argspec(devices=dict(...)), supports_check_mode=True)
    node = NodeContext(module)
    with engine_errors(module) as result, node.apply_lock(timeout):
        plan = engine.plan(node.sysfs, node.runner, ..., held=node.held)
        result["pfs"] = plan.as_list()          # also returned when the apply fails
        if not module.check_mode:
            ...apply...
    exit_with_diff(module, plan.changed, plan.diff(), **result)
"""

from __future__ import annotations

import contextlib
import copy

from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw import pci
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders import claim_holders, inuse, kubelet_holders, roots
from ansible_collections.accelops.vgpu.plugins.module_utils.errors import EngineError, one_line
from ansible_collections.accelops.vgpu.plugins.module_utils.node.holders.node_lock import node_lock
from ansible_collections.accelops.vgpu.plugins.module_utils.runner import FunctionRunner
from ansible_collections.accelops.vgpu.plugins.module_utils.node.hw.sysfs import Sysfs

# Matches the doc fragment accelops.vgpu.node_roots.
NODE_ROOTS_ARGSPEC = dict(
    sysfs_root=dict(type="path", default="/sys"),
    dev_root=dict(type="path", default="/dev"),
    proc_root=dict(type="path", default="/proc"),
    kubelet_dir=dict(type="path", default=None),
)


def node_argspec(**options):
    """The node roots plus a module's own options (a fresh copy each call)."""
    spec = copy.deepcopy(NODE_ROOTS_ARGSPEC)
    spec.update(options)
    return spec


class NodeContext:
    """Engine objects for a module's node: Sysfs, a runner on module.run_command, held devices."""

    def __init__(self, module):
        """Fails the module (one line) when a node root is missing or unusable (roots.check_roots,
        roots.check_kubelet_dir)."""
        params = module.params
        try:
            roots.check_roots(params["sysfs_root"], params["dev_root"], params["proc_root"])
            self.kubelet_dir = roots.check_kubelet_dir(params.get("kubelet_dir"))
        except EngineError as err:
            module.fail_json(msg=one_line(err))
        self.sysfs = Sysfs(params["sysfs_root"])
        self.runner = FunctionRunner(module.run_command)
        self.dev_root = params["dev_root"]
        self.proc_root = params["proc_root"]
        self.check_mode = module.check_mode

    def held(self):
        """{address or mdev uuid: [holder]} of devices VMs hold (one /proc scan per call) and of those
        pods hold through the kubelet's plugins under the kubelet directory (node/holders/kubelet_holders.py)."""
        return self.holders().held()

    def holders(self):
        """An inuse.Holders for this run (what sriov_vfs re-checks right before VFs are removed)."""
        return inuse.Holders(self.sysfs, self.dev_root, self.proc_root,
                             kubelet_holders.holder_sources(self.kubelet_dir))

    def held_whole(self):
        """The GPUs DRA claims hold whole (claim_holders.held_whole): held, not reserved, whatever their driver."""
        return claim_holders.held_whole_of(self.kubelet_dir)

    def apply_lock(self, timeout):
        """The node's apply lock, waited for up to `timeout` s; nothing to lock in check mode."""
        if self.check_mode:
            return contextlib.nullcontext()
        return node_lock(self.sysfs.root, timeout)


@contextlib.contextmanager
def engine_errors(module):
    """Yield a result dict; an EngineError becomes fail_json(msg=<its one line>, **result) (one_line:
    the safety net against a control character that slipped into a message), plus the error's own
    `result` fields when it has them (what a stopped apply did and did not do)."""
    result = {}
    try:
        yield result
    except EngineError as err:
        result.update(getattr(err, "result", None) or {})
        module.fail_json(msg=one_line(err), **result)


def addresses(items, option):
    """A list option of PCI addresses, normalised (`41:00.0` -> `0000:41:00.0`); a bad one is an EngineError."""
    found = []
    for item in items or ():
        try:
            found.append(pci.parse_address(item))
        except pci.PciAddressError as err:
            raise EngineError("%s: %s" % (option, err)) from None
    return tuple(found)


def exit_with_diff(module, changed, diff, **result):
    """exit_json with `diff` attached only in diff mode."""
    if module._diff:  # pylint: disable=protected-access
        result["diff"] = diff
    module.exit_json(changed=changed, **result)
