# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""KEP-5304 device metadata: what a container (KubeVirt's virt-launcher) learns about its devices.

Layout and format as k8s.io/dynamic-resource-allocation kubeletplugin/metadata.go and api/metadata
write and document them (docs/design.md "DRA driver"):
- host file `<plugin dir>/dra-device-metadata/<claim namespace>_<claim name>/<request>/metadata.json`:
  a stream of JSON objects, the same DeviceMetadata once per API version, newest first (only
  `metadata.resource.k8s.io/v1alpha1` exists): metadata {name, namespace, uid, generation},
  `podClaimName` for a claim made from a template, `requests: [{name, devices: [{driver, pool, name,
  attributes}]}]`, attributes as in the ResourceSlice;
- a CDI spec `<cdi dir>/<driver>_metadata_<claim uid>_<request>.json`, kind `<driver>/metadata`,
  one device `<claim uid>_<request>` that bind-mounts the file read-only at
  `/var/run/kubernetes.io/dra-device-attributes/resourceclaims/<claim>/<request>/<driver>-metadata.json`
  (`resourceclaimtemplates/<pod claim name>/...` for a claim made from a template); its ID is added
  to the CDI IDs of the request's devices.
KubeVirt >= 1.8.3 reads exactly one device per request from that file, `mdevUUID` before
`resource.kubernetes.io/pciBusID` (kubevirt pkg/dra/utils.go, virt-launcher dra/gpu_hostdev.go).
"""

from __future__ import annotations

import glob
import json
import os
import shutil

from ansible_collections.accelops.vgpu.plugins.module_utils.atomic_file import RENAME, write_file
from ansible_collections.accelops.vgpu.plugins.module_utils.kubelet.dra.cdi import CDI_VERSION

API_VERSIONS = ("metadata.resource.k8s.io/v1alpha1",)   # newest first
SUBDIR = "dra-device-metadata"
CONTAINER_DIR = "/var/run/kubernetes.io/dra-device-attributes"


def claim_dir(plugin_dir, namespace, name):
    return os.path.join(plugin_dir, SUBDIR, "%s_%s" % (namespace, name))


def file_path(plugin_dir, namespace, name, request):
    return os.path.join(claim_dir(plugin_dir, namespace, name), request, "metadata.json")


def container_path(driver, claim_name, request, pod_claim_name=None):
    if pod_claim_name:
        return "%s/resourceclaimtemplates/%s/%s/%s-metadata.json" % (CONTAINER_DIR, pod_claim_name, request, driver)
    return "%s/resourceclaims/%s/%s/%s-metadata.json" % (CONTAINER_DIR, claim_name, request, driver)


def spec_path(cdi_dir, driver, claim_uid, request):
    return os.path.join(cdi_dir, "%s_metadata_%s_%s.json" % (driver, claim_uid, request))


def cdi_id(driver, claim_uid, request):
    return "%s/metadata=%s_%s" % (driver, claim_uid, request)


def document(ref, request, entries, driver, pod_claim_name=None, generation=1):
    """One request's DeviceMetadata objects (one per API version); `entries` = [claims.PreparedDevice]."""
    body = {"metadata": {"name": ref.name, "namespace": ref.namespace, "uid": ref.uid, "generation": generation},
            "requests": [{"name": request, "devices": [
                {"driver": driver, "pool": e.pool, "name": e.device.name, "attributes": e.device.attributes()}
                for e in entries]}]}
    if pod_claim_name:
        body["podClaimName"] = pod_claim_name
    return [dict({"apiVersion": version, "kind": "DeviceMetadata"}, **body) for version in API_VERSIONS]


def write_request(plugin_dir, cdi_dir, driver, ref, request, entries, pod_claim_name=None):
    """Write the metadata file of one (base) request and its CDI spec; returns the CDI ID."""
    host = file_path(plugin_dir, ref.namespace, ref.name, request)
    # the request named in the file is the allocation's (a subrequest keeps its `/sub`), as the helper does
    named = entries[0].request if len({entry.request for entry in entries}) == 1 else request
    write_file(host, "".join(json.dumps(obj, indent=2, sort_keys=True) + "\n"
                             for obj in document(ref, named, entries, driver, pod_claim_name)), sync=RENAME)
    spec = {"cdiVersion": CDI_VERSION, "kind": "%s/metadata" % driver, "devices": [{
        "name": "%s_%s" % (ref.uid, request),
        "containerEdits": {"mounts": [{"hostPath": host, "containerPath": container_path(
            driver, ref.name, request, pod_claim_name), "options": ["ro", "bind"]}]}}]}
    write_file(spec_path(cdi_dir, driver, ref.uid, request), json.dumps(spec, indent=2, sort_keys=True) + "\n",
               sync=RENAME)
    return cdi_id(driver, ref.uid, request)


def remove_claim(plugin_dir, cdi_dir, driver, ref):
    """Remove every metadata file and metadata CDI spec of a claim (none there is fine)."""
    shutil.rmtree(claim_dir(plugin_dir, ref.namespace, ref.name), ignore_errors=True)
    for path in glob.glob(os.path.join(glob.escape(cdi_dir), "%s_metadata_%s_*.json" % (driver, glob.escape(ref.uid)))):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def read_stream(text):
    """The JSON objects of a metadata file, in order (how consumers read it: one decoder, object by object)."""
    decoder, objects, index = json.JSONDecoder(), [], 0
    while True:
        while index < len(text) and text[index].isspace():
            index += 1
        if index >= len(text):
            return objects
        obj, index = decoder.raw_decode(text, index)
        objects.append(obj)
