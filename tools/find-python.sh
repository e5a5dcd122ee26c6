#!/usr/bin/env bash
# Print the best Python interpreter for the dev venv: >= 3.12 preferred (ansible-core 2.21),
# 3.11 accepted (ansible-core 2.19). pyenv shims that point nowhere are skipped.
set -u
# VGPU_PYTHON=/path/to/python forces a choice (e.g. to test the Python 3.11 / ansible-core 2.19 path)
candidates=(${VGPU_PYTHON:-} python3.13 python3.12)
for root in "${PYENV_ROOT:-$HOME/.pyenv}" /root/.pyenv; do
  for p in "$root"/versions/3.1[23]*/bin/python3; do [ -x "$p" ] && candidates+=("$p"); done
done
candidates+=(python3.11 python3)
for c in "${candidates[@]}"; do
  if "$c" -c 'import sys, venv, ensurepip; sys.exit(0 if sys.version_info >= (3, 11) else 1)' >/dev/null 2>&1; then
    command -v "$c" 2>/dev/null || echo "$c"
    exit 0
  fi
done
echo "no Python >= 3.11 with the venv module found; install python3 (Debian: apt-get install python3 python3-venv)" >&2
exit 1
