# Copyright: accelops.vgpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Start or stop the Kubernetes API emulator for the cluster scenario, seeded like `make demo`'s.

    python api_server.py start STATE_DIR NODE_NAME    # prints the URL; STATE_DIR/kubeconfig
    python api_server.py stop STATE_DIR
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))

import demo  # noqa: E402  pylint: disable=wrong-import-position


def main(argv):
    if argv[0] == "start":
        print(demo.start_api_server(argv[1], argv[2]))
    else:
        demo.stop_api_server(argv[1])


if __name__ == "__main__":
    main(sys.argv[1:])
