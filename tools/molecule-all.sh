#!/usr/bin/env bash
# Run every Molecule scenario (molecule/<name>/molecule.yml on top of molecule/config.yml) with
# `molecule --base-config molecule/config.yml test -s NAME`; exit non-zero if any fails.
# Whatever happens, no node container (label owner=vgpu-molecule), simulated tree
# (.build/molecule/*/*/sys), API emulator (.build/molecule/*/kmock.pid) or test kubelet
# (.build/molecule/*/kubelet.json) outlives the run.
#   usage: tools/molecule-all.sh [SCENARIO...]
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
export PATH="$ROOT/.venv/bin:$PATH"
export CONTAINERS_CONF="${CONTAINERS_CONF:-$ROOT/tests/containers.conf}"
export ANSIBLE_CONFIG="$ROOT/ansible.cfg"
export ANSIBLE_COLLECTIONS_PATH="$ROOT/.build/collections"
# top-level molecule/ in a collection: say so, instead of Molecule's migration warning
export MOLECULE_GLOB="molecule/*/molecule.yml"
export ANSIBLE_HOME="${ANSIBLE_HOME:-$ROOT/.build/ansible-home}"
export PYTEST_ADDOPTS="${PYTEST_ADDOPTS:-} -p no:cacheprovider"

cleanup() {
  local ids
  ids=$(podman ps -aq --filter label=owner=vgpu-molecule)
  [ -n "$ids" ] && podman rm -f -t 0 $ids >/dev/null
  for tree in .build/molecule/*/*/sys; do
    [ -d "$tree" ] || continue
    if mountpoint -q "$tree"; then .venv/bin/gpusim down "$tree" || fusermount3 -u "$tree"; fi
  done
  # the cluster scenario's API emulator
  for pid_file in .build/molecule/*/kmock.pid; do
    [ -f "$pid_file" ] && .venv/bin/python molecule/cluster/api_server.py stop "$(dirname "$pid_file")"
  done
  # the agent scenario's test kubelet
  for state in .build/molecule/*/kubelet.json; do
    [ -f "$state" ] && .venv/bin/python molecule/agent/kubelet.py stop "$(dirname "$state")"
  done
  # Molecule's per-scenario state (instance config, inventory) of an interrupted run
  rm -rf "$ANSIBLE_HOME"/tmp/molecule.*
}
trap cleanup EXIT INT TERM

if [ $# -gt 0 ]; then
  scenarios=("$@")
else
  scenarios=()
  for f in molecule/*/molecule.yml; do scenarios+=("$(basename "$(dirname "$f")")"); done
fi

cleanup
rc=0
declare -a summary
for s in "${scenarios[@]}"; do
  start=$SECONDS
  echo "=== molecule scenario: $s ==="
  if molecule --base-config molecule/config.yml test -s "$s"; then status=PASS; else status=FAIL; rc=1; fi
  cleanup
  summary+=("$status $s ($((SECONDS - start)) s)")
done
echo "=== molecule summary ==="
printf '%s\n' "${summary[@]}"
exit $rc
