#!/usr/bin/env bash
# Installs the Debian packages dtrun needs that are missing. Run as root on
# Debian bookworm. Usage: scripts/install-deps.sh
set -euo pipefail

packages=(
  cmake ninja-build g++ ccache pkg-config
  libtorch-dev python3-torch libgloo-dev
  libcli11-dev libspdlog-dev libasio-dev nlohmann-json3-dev libtomlplusplus-dev libssl-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  clang libclang-rt-14-dev clang-format
  python3-sklearn python3-yaml
  tmux jupyter-core jupyter-nbconvert python3-nbclient python3-ipykernel python3-ipython
  python3-matplotlib
  iproute2 procps util-linux
  help2man dpkg-dev debootstrap universal-ctags
  libhwloc-dev hwloc
  prometheus
  etcd-server etcd-client python3-etcd
  slurmctld slurmd slurm-client munge
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
if [[ $(id -u) -ne 0 ]]; then
  echo "install-deps: must run as root to install packages (try: sudo $0)" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
