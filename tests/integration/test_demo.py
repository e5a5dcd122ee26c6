"""`make demo`, the README's first command, runs end to end and shows what it promises.

The demo is a user's first contact and touches every layer (gpusim, the playbooks, the API double, the
agent with its device plugin, the test kubelet, the conformance playbook, the GitOps relabel); a stricter
double or a changed seed breaks it without any other test noticing, so it runs here as `tools/demo.sh`
(what `make demo` calls) and its output is checked for the parts the README describes.
"""

import os
import re
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_make_demo_programs_the_node_attests_it_and_follows_a_relabel():
    proc = subprocess.run([os.path.join(REPO, "tools", "demo.sh")], cwd=REPO, capture_output=True, text=True,
                          timeout=900, check=False)
    out = proc.stdout
    assert proc.returncode == 0, (out + proc.stderr)[-4000:]
    assert "playbooks/site.yml succeeded" in out
    assert re.search(r"nvidia\.com/NVIDIA_L40S-24Q\s+4 on demo-node", out), out[-4000:]
    # the conformance playbook ran against the demo cluster: rc 0 and no FAIL row
    assert "playbooks/conformance.yml   (rc 0)" in out
    summary = re.search(r"\*\*(\d+) PASS, (\d+) FAIL, (\d+) UNKNOWN\*\*", out)
    assert summary and int(summary.group(1)) > 0 and summary.group(2) == "0", out[-4000:]
    # the GitOps path: the agent converged the relabel and the kubelet's resources followed it
    assert "nvidia.com/vgpu.config.state: success -> pending -> success" in out
    after = re.search(r"status\.allocatable \(written by the test kubelet\): (.*)", out.split("GitOps")[-1])
    assert after and "nvidia.com/NVIDIA_L40S-8Q=12" in after.group(1), out[-4000:]
    # torn down: nothing of the simulated node stays mounted
    with open("/proc/mounts", encoding="utf-8") as mounts:
        assert os.path.join(REPO, ".build", "demo") not in mounts.read()
