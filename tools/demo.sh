#!/usr/bin/env bash
# make demo: bring up the simulated GPU node and run playbooks/site.yml against it.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -f playbooks/site.yml ] || [ ! -x .venv/bin/gpusim ]; then
  echo "make demo: playbooks/site.yml or the gpusim simulator is not there yet" >&2
  exit 1
fi
exec .venv/bin/python tools/demo.py "$@"
