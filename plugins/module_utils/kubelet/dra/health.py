# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Device health for the kubelet (KEP-4680, DRAResourceHealth.NodeWatchResources), as plain data.

Every vGPU the node has now is HEALTHY. A vGPU a prepared claim uses that the node no longer has
(its VF lost its type, e.g. a vGPU-manager restart reset it, or the VF or mdev is gone) is
UNHEALTHY with a message naming it and the claim, until the layout is applied again. Each answer
is the complete list, as the service requires (a device missing from it turns Unknown).

    device_health(current, prepared, pool) -> [DeviceHealth(pool, device, healthy, message)]
"""

from __future__ import annotations

from collections import namedtuple

DeviceHealth = namedtuple("DeviceHealth", "pool device healthy message")
MAX_MESSAGE = 1024


def device_health(current, prepared, pool, pools=None):
    """`current`: [DraDevice] read now, published in `pool`; `prepared`: the checkpoint's claims ({uid: entry});
    `pools`: every pool name a claim of this node may name (slices.pools; default: `pool`). A claim allocated from
    another of them (the node's name, the pool of earlier releases) gets its devices' health under that pool: the
    kubelet looks a device up by the pool and name its claim was allocated from."""
    present = {device.name for device in current}
    found = {(pool, device.name): DeviceHealth(pool, device.name, True, "") for device in current}
    for entry in prepared.values():
        for record in entry.get("devices") or ():
            name, where = record["device"], record["pool"]
            if where not in (pools or (pool,)) or (where, name) in found:
                continue
            if name in present:
                found[where, name] = DeviceHealth(where, name, True, "")
                continue
            message = ("vGPU %s (%s) of claim %s/%s is gone from the node: its VF lost its type or the device "
                       "disappeared (a vGPU-manager restart resets types until the layout is applied again)"
                       % (name, record["key"], entry["namespace"], entry["name"]))
            found[where, name] = DeviceHealth(where, name, False, message[:MAX_MESSAGE])
    return [found[name] for name in sorted(found)]
