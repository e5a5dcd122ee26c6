#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: vgpu_conformance
short_description: Attest a KubeVirt cluster's vGPUs against KAR-0003 (GPU sharing) and KAR-0004 (virtualized accelerators)
version_added: 0.1.0
description:
  - Runs the conformance checks and returns (and with O(report_dir) writes) a report with one row per
    check, each V(PASS), V(FAIL) or V(UNKNOWN) with one line saying why.
  - C(inventory) every NVIDIA vGPU resource the KubeVirt CR permits (C(pciHostDevices) / C(mediatedDevices)),
    mapped to the nodes that advertise it; a PCI ID or mdev type the collection's GPU catalog does not know is V(UNKNOWN).
  - C(accounting) per node, C(status.allocatable[resource]) equals the node's vGPUs of that resource (from
    O(node_facts) when given for the node, else from the profile labels).
  - C(sharing) per profile, on the node with the most of its vGPUs, as many VMIs as it has, all Running there;
    at least two share a physical GPU when more VMIs run than the node has GPUs with that profile (from
    O(node_facts); KubeVirt does not publish which VF or mdev a VMI got). Without node facts V(UNKNOWN).
  - C(over-allocation) one VMI more must stay Pending with an C(Unschedulable) condition for O(pending_timeout).
  - C(health.ready) each VMI Ready; C(health.guest) O(guest_command) exits 0 in each guest (V(UNKNOWN) without one).
  - C(consistency) resource naming, request form and labels next to MIG and time-sliced GPUs;
    C(consistency.dra) DRA C(DeviceClass)es for GPUs when C(resource.k8s.io/v1) is served (never V(FAIL)).
  - C(sharing.dra) and C(over-allocation.dra) the same two checks through DRA, when the collection's DRA driver
    C(vgpu.accelops.io) publishes C(ResourceSlice)s and the C(DeviceClass) O(dra_device_class) exists; per profile,
    on the node publishing the most devices of it, one C(ResourceClaim) (C(resource.k8s.io/v1), CEL selector on
    the C(profile) attribute) and one VMI (C(spec.resourceClaims), C(gpus[].claimName/requestName)) per device,
    all Running with distinct devices of the profile, two on one physical GPU (C(status.allocation), attribute
    C(parentGPU)); then one claim and VMI more, which must stay unallocated and unscheduled for O(pending_timeout).
    A claim-time device (profile chosen at claim time, C(claimTime) attribute) counts its C(instances) capacity,
    that many claims each with its own instance (C(shareID)), before the one more.
    V(UNKNOWN) with the reason when DRA is not served or the driver publishes nothing.
  - Everything (VMIs, C(ResourceClaim)s) is created in O(namespace), which the run creates (labelled
    C(accelops.io/vgpu-conformance)) and deletes at the end, also after an error and on SIGINT, SIGTERM or SIGHUP.
    A namespace that exists is refused.
  - Check FAILs do not fail the module (see RV(summary)); errors do, as one line, after the cleanup.
author:
  - accelops.vgpu contributors (@accelops)
extends_documentation_fragment:
  - accelops.vgpu.k8s_auth
attributes:
  check_mode:
    support: full
    description: Reads only; creates nothing, writes no report file, returns RV(would_create) and the read-only checks.
  diff_mode:
    support: full
    description: The objects the run creates (and deletes again), as C(after).
options:
  state:
    description:
      - V(present) runs the checks.
      - V(absent) deletes what a killed run left in O(namespace) (only when the namespace carries our label).
    type: str
    choices: [present, absent]
    default: present
  namespace:
    description: Namespace the run creates for its VMIs; it must not exist.
    type: str
    default: vgpu-conformance
  kubevirt_name:
    description: Name of the KubeVirt CR; unset for the only one.
    type: str
  kubevirt_namespace:
    description: Namespace of the KubeVirt CR; unset to search all.
    type: str
  profiles:
    description: vGPU profiles to test (for example V(L40S-24Q)); empty for all the cluster has. An unknown one is an error.
    type: list
    elements: str
    default: []
  profile_label_prefix:
    description: Prefix of the per-profile node labels (C(<prefix><profile>=<count>)), as set by M(accelops.vgpu.node_labels).
    type: str
    default: accelops.io/vgpu.profile.
  node_facts:
    description:
      - The nodes' own view, by Kubernetes node name; either the C(vgpu) fact of M(accelops.vgpu.vgpu_facts)
        or C({gpus= vgpu_profiles_gpus}) (the C(gpus) result of M(accelops.vgpu.vgpu_profile)).
      - Used for accounting and to know how many physical GPUs carry a profile (the sharing proof).
    type: dict
    default: {}
  dra_device_class:
    description:
      - The C(DeviceClass) the test C(ResourceClaim)s request (C(sharing.dra), C(over-allocation.dra)); its selectors
        must select the devices of the DRA driver C(vgpu.accelops.io).
      - The default is the class of every vGPU the C(vgpu_node_agent) role creates with C(vgpu_node_agent_dra).
    type: str
    default: vgpu.accelops.io
  container_disk_image:
    description: Container disk of the test VMIs. Must boot with a vGPU attached; for O(guest_command) it needs the guest driver.
    type: str
    default: quay.io/containerdisks/fedora:41
  vmi_memory:
    description: Memory request of each test VMI.
    type: str
    default: 1Gi
  cloud_init_user_data:
    description: cloud-init user data of the test VMIs (for example an SSH key for O(guest_runner)).
    type: str
  guest_command:
    description: Command run in each Ready guest through O(guest_runner), for example V(nvidia-smi); must exit 0.
    type: str
  guest_runner:
    description:
      - Command line that runs O(guest_command) in a guest, with C({namespace}), C({vmi}) and C({command}) replaced.
      - Default C(virtctl ssh --namespace {namespace} --command {command} vmi/{vmi}); add C(--username) and
        C(--identity-file) as your image needs, or call a guest-agent tool of your own.
    type: list
    elements: str
  guest_command_timeout:
    description: Seconds one O(guest_command) may take.
    type: float
    default: 120
  running_timeout:
    description: Seconds the VMIs of a profile get to reach Running (image pull and boot included).
    type: float
    default: 600
  ready_timeout:
    description: Seconds the Running VMIs then get to become Ready.
    type: float
    default: 300
  pending_timeout:
    description:
      - Seconds the VMI beyond capacity is watched, from the moment KubeVirt gives it a phase (at most
        O(running_timeout) after its creation); it must stay Pending and be marked Unschedulable.
    type: float
    default: 60
  cleanup_timeout:
    description: Seconds to wait for deleted VMIs, C(ResourceClaim)s and the namespace to be gone.
    type: float
    default: 300
  poll_interval:
    description: Seconds between two reads while waiting.
    type: float
    default: 2
  report_dir:
    description: Existing directory for the report files (JSON, Markdown, JUnit XML); unset writes none.
    type: path
  report_name:
    description: Base name of the report files (C(<name>.json), C(<name>.md), C(<name>.junit.xml)).
    type: str
    default: vgpu-conformance
"""

EXAMPLES = r"""
- name: Attest the cluster and keep the report for CI
  accelops.vgpu.vgpu_conformance:
    kubeconfig: /etc/kubernetes/admin.conf
    report_dir: /var/tmp/conformance
    guest_command: nvidia-smi
    guest_runner: [virtctl, ssh, --namespace, "{namespace}", --username, fedora, --identity-file, /root/.ssh/id_ed25519,
                   --command, "{command}", "vmi/{vmi}"]
  register: conformance
  delegate_to: localhost

- name: Fail the play when a check failed
  ansible.builtin.assert:
    that: conformance.summary.fail == 0
    fail_msg: "{{ conformance.failed_checks | join('; ') }}"
"""

RETURN = r"""
summary:
  description: Number of rows per status.
  returned: when state is present
  type: dict
  sample: {pass: 9, fail: 0, unknown: 2, total: 11}
summary_line:
  description: The summary in words.
  returned: when state is present
  type: str
  sample: 13 PASS, 0 FAIL, 2 UNKNOWN of 15 checks
lines:
  description: "One line per check: status, check, subject, the reason."
  returned: when state is present
  type: list
  elements: str
  sample: ["PASS    sharing L40S-24Q@gpu-a: 4 VMI(s) requesting nvidia.com/NVIDIA_L40S-24Q Running on gpu-a ..."]
report:
  description: The whole report (the JSON file's content); C(checks) has one row per check.
  returned: when state is present
  type: dict
  contains:
    checks:
      description: Rows with C(check), C(requirement), C(subject), C(status), C(reason), C(details).
      type: list
      elements: dict
report_files:
  description: Paths of the files written (keys C(json), C(markdown), C(junit)); empty without O(report_dir) and in check mode.
  returned: when state is present
  type: dict
failed_checks:
  description: One line per FAIL row.
  returned: when state is present
  type: list
  elements: str
would_create:
  description: What a real run creates (check mode).
  returned: when state is present
  type: list
  elements: str
would_delete:
  description: What O(state=absent) deletes (check mode).
  returned: when state is absent and the namespace exists
  type: list
  elements: str
cleanup:
  description: C(deleted) (what the run deleted again) and C(left) (what it could not delete; the module fails then).
  returned: always
  type: dict
"""

import copy

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.accelops.vgpu.plugins.module_utils.cluster.conformance.run import run_module_engine
from ansible_collections.accelops.vgpu.plugins.module_utils.cluster.k8s_args import AUTH_ARG_SPEC
from ansible_collections.accelops.vgpu.plugins.module_utils.cluster.k8s_client import run_cluster_module


def argspec():
    spec = copy.deepcopy(AUTH_ARG_SPEC)
    spec.update(
        state={"type": "str", "choices": ["present", "absent"], "default": "present"},
        namespace={"type": "str", "default": "vgpu-conformance"},
        kubevirt_name={"type": "str"},
        kubevirt_namespace={"type": "str"},
        profiles={"type": "list", "elements": "str", "default": []},
        profile_label_prefix={"type": "str", "default": "accelops.io/vgpu.profile."},
        node_facts={"type": "dict", "default": {}},
        dra_device_class={"type": "str", "default": "vgpu.accelops.io"},
        container_disk_image={"type": "str", "default": "quay.io/containerdisks/fedora:41"},
        vmi_memory={"type": "str", "default": "1Gi"},
        cloud_init_user_data={"type": "str"},
        guest_command={"type": "str"},
        guest_runner={"type": "list", "elements": "str"},
        guest_command_timeout={"type": "float", "default": 120},
        running_timeout={"type": "float", "default": 600},
        ready_timeout={"type": "float", "default": 300},
        pending_timeout={"type": "float", "default": 60},
        cleanup_timeout={"type": "float", "default": 300},
        poll_interval={"type": "float", "default": 2},
        report_dir={"type": "path"},
        report_name={"type": "str", "default": "vgpu-conformance"},
    )
    return spec


def main():
    module = AnsibleModule(argument_spec=argspec(), supports_check_mode=True)
    run_cluster_module(module, run_module_engine, missing_required_lib("kubernetes"))


if __name__ == "__main__":
    main()
