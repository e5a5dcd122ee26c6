# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Publishes this node's vGPUs as ResourceSlices through the agent's API client (agent/kube.py).

    publisher = SlicePublisher(api, node_name, node_uid)
    publisher.pool = slices.pool_name(node_name)  # the pool published (default); another pool of the node is deleted
    publisher.publish(devices)            # list, plan (slices.plan), delete / update / create
    publisher.publish(devices, force=False) -> None when the devices are the ones last published

A write that loses a race (409: someone changed a slice since it was listed; a delete carries the
listed resourceVersion as its precondition) starts over from a fresh list, a few times, in
`publish` and `withdraw` alike; a delete of a slice already gone (404) is done. Any other API
error propagates (KubeApiError / KubeUnavailable): the caller retries on its own schedule.
A slice the API server stored without the claim-time fields we sent (claim_time.check_stored) raises
claim_time.FeatureMissing: the server lacks partitionable devices or consumable capacity. One stored without the
device taints we sent (DRADeviceTaints off) sets `taints_dropped` (claim_time.dropped_taints): the caller says so.
"""

from __future__ import annotations

from ansible_collections.accelops.vgpu.plugins.module_utils.kube_errors import KubeApiError
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra import claim_time, slices as slice_plan
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.devices import DRIVER

CONFLICT_RETRIES = 5


class SlicePublisher:
    def __init__(self, api, node_name, node_uid=None, driver=DRIVER):
        self.api, self.node_name, self.node_uid, self.driver = api, node_name, node_uid, driver
        self.pool = slice_plan.pool_name(node_name, driver)
        self.taints_dropped = False  # the API server stored a slice without the device taints we sent
        self.published = None       # the devices of the last successful publish
        self.writes = 0             # API writes made (tests and the benchmark count them)

    def publish(self, devices, force=True):
        """Make the API hold exactly `devices` for this node; returns the executed Plan (None when
        `force` is false and nothing changed since the last publish)."""
        devices = list(devices)
        if not force and self.published == devices:
            return None
        for attempt in range(CONFLICT_RETRIES):
            existing = self.api.list_resource_slices(self.node_name, self.driver)
            plan = slice_plan.plan(self.node_name, devices, existing, self.node_uid, self.driver, self.pool)
            try:
                self._execute(plan)
            except KubeApiError as exc:
                if exc.status != 409 or attempt == CONFLICT_RETRIES - 1:
                    raise
                continue
            self.published = devices
            return plan
        raise AssertionError("unreachable")

    def _execute(self, plan):
        for name, version in plan.deletes:
            self._delete(name, version)
        for body in plan.updates:
            self._stored(body, self.api.replace_resource_slice(body))
        for body in plan.creates:
            self._stored(body, self.api.create_resource_slice(body))

    def _stored(self, body, stored):
        self.writes += 1
        claim_time.check_stored(body, stored)
        self.taints_dropped = self.taints_dropped or claim_time.dropped_taints(body, stored)

    def _delete(self, name, version):
        """Delete a slice as listed (its resourceVersion the precondition: a change since -> 409);
        one already gone (404) is done."""
        try:
            self.api.delete_resource_slice(name, version)
        except KubeApiError as exc:
            if exc.status != 404:
                raise
        self.writes += 1

    def withdraw(self):
        """Delete every slice of this node and driver (the driver stops serving the node); a delete
        that loses a race (409) starts over from a fresh list, as publish does."""
        for attempt in range(CONFLICT_RETRIES):
            try:
                for item in self.api.list_resource_slices(self.node_name, self.driver):
                    self._delete(item["metadata"]["name"], item["metadata"].get("resourceVersion"))
            except KubeApiError as exc:
                if exc.status != 409 or attempt == CONFLICT_RETRIES - 1:
                    raise
                continue
            self.published = None
            return
