#!/usr/bin/env bash
# Run ansible-test (sanity, units) offline-friendly:
# - ansible-test insists on running from .../ansible_collections/<ns>/<name> inside a git work tree,
#   so the tracked and new (non-ignored) files are mirrored into .build/ansible-test/ and indexed there;
# - its per-test venvs bootstrap pip from the internet; a get-pip shim backed by pip's own PyPI
#   wheel (see shared test-environment notes) is placed where ansible-test looks first.
set -euo pipefail
cd "$(dirname "$0")/.."
top=$PWD
venv_py=$top/.venv/bin/python
pyver=$("$venv_py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
# the pip version ansible-test bootstraps into its venvs (get_venv_packages' default_packages)
pip_ver=$("$venv_py" - <<'PY'
import inspect, re
import ansible_test._internal.python_requirements as r
m = re.search(r"pip=['\"]([0-9.]+)['\"]", inspect.getsource(r.get_venv_packages))
print(m.group(1) if m else "")
PY
)
[ -n "$pip_ver" ] || { echo "tools/ansible-test.sh: cannot tell which pip ansible-test bootstraps" >&2; exit 1; }
export HOME=$top/.cache/ansible-test-home
wheels=$top/.cache/wheels
mkdir -p "$HOME/.ansible/test/cache" "$wheels"
[ -e "$wheels/pip-$pip_ver-py3-none-any.whl" ] || "$top/.venv/bin/pip" download -q --no-deps -d "$wheels" "pip==$pip_ver"
cat > "$HOME/.ansible/test/cache/get_pip_${pip_ver//./_}.py" <<PY
import runpy, sys
WHEELS = "$wheels"
sys.path.insert(0, WHEELS + "/pip-$pip_ver-py3-none-any.whl")
args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
sys.argv = ["pip", "install", "--find-links", WHEELS] + args
runpy.run_module("pip", run_name="__main__", alter_sys=True)
PY
# a private mirror per run, so concurrent runs (several engineers, CI stages) never clobber each other
run_dir=$(mkdir -p "$top/.build/ansible-test" && mktemp -d "$top/.build/ansible-test/run.XXXXXX")
trap 'rm -rf "$run_dir"' EXIT
dest=$run_dir/ansible_collections/accelops/vgpu
mkdir -p "$dest"
git ls-files -z --cached --others --exclude-standard \
  | tar --null -T - --ignore-failed-read -cf - 2>/dev/null | tar -C "$dest" -xf -
cd "$dest"
git init -q . && git add -A >/dev/null
"$top/.venv/bin/ansible-test" "$@" --python "$pyver" --local --color no
