# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Start or stop the test kubelet (tests/fakes/kubelet_double.py) for the agent scenario.

    python kubelet.py start STATE_DIR NODE_NAME    # prints the kubelet directory; STATE_DIR/kubelet.json
    python kubelet.py stop STATE_DIR

The kubelet directory is a short /tmp path (unix socket paths are at most 107 bytes); the agent container
gets its device-plugins/ mounted. The kubelet mirrors the agent's ListAndWatch lists into the emulator's Node
status (STATE_DIR/kubeconfig names the emulator).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

DOUBLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "fakes", "kubelet_double.py")


def start(state_dir, node):
    with open(os.path.join(state_dir, "kubeconfig"), encoding="utf-8") as handle:
        server = json.load(handle)["clusters"][0]["cluster"]["server"]
    root = tempfile.mkdtemp(prefix="molkl.", dir="/tmp")
    log = os.path.join(state_dir, "kubelet.log")
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.Popen([sys.executable, DOUBLE, "--root", root, "--api", server, "--node", node,
                                 "--grace", "5"], stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with open(log, encoding="utf-8") as handle:
            if handle.read().startswith("ready "):
                break
        if proc.poll() is not None:
            raise SystemExit("the test kubelet exited: see %s" % log)
        time.sleep(0.1)
    else:
        raise SystemExit("the test kubelet did not start within 30 s: see %s" % log)
    with open(os.path.join(state_dir, "kubelet.json"), "w", encoding="utf-8") as handle:
        json.dump({"pid": proc.pid, "root": root}, handle)
    print(root)


def stop(state_dir):
    path = os.path.join(state_dir, "kubelet.json")
    try:
        with open(path, encoding="utf-8") as handle:
            started = json.load(handle)
    except (OSError, ValueError):
        return
    try:
        os.kill(started["pid"], signal.SIGTERM)
    except ProcessLookupError:
        pass
    for dummy in range(100):
        try:
            os.kill(started["pid"], 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    shutil.rmtree(started["root"], ignore_errors=True)
    os.unlink(path)


if __name__ == "__main__":
    if sys.argv[1] == "start":
        start(sys.argv[2], sys.argv[3])
    else:
        stop(sys.argv[2])
