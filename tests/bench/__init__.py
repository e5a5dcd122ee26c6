"""`make bench`: what accelops.vgpu costs on gpusim, side by side with the floor (issue 8).

Parts (each a module here): P1 `converge` (engine vs bare sysfs writes), P2 and P4 `playbooks`
(no-op node playbook vs a one-task playbook; per-host cost as the fleet grows), P3 `vf_enable`
(parallel SR-IOV enable vs the VF-enable latency). `python -m tests.bench --help` for the options.
"""

import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COLLECTIONS = os.path.join(REPO, ".build", "collections")
# The engine is imported as ansible_collections.accelops.vgpu (what `make setup` links), as pytest does.
if COLLECTIONS not in sys.path:
    sys.path.insert(0, COLLECTIONS)
