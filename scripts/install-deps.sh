#!/usr/bin/env bash
# Installs the Debian packages dtrun needs that are missing. Run as root on
# Debian bookworm.
# Usage: scripts/install-deps.sh          everything: the build and every test
#        scripts/install-deps.sh --main   only what building dtrun, lib and
#                                         train_cfg and the main job need
set -euo pipefail

# The main job's: the compilers, libtorch, the launcher's libraries, and
# sklearn's digits data set.
main_packages=(
  cmake ninja-build g++ ccache pkg-config
  libtorch-dev libgloo-dev
  libcli11-dev libspdlog-dev libasio-dev nlohmann-json3-dev libtomlplusplus-dev libssl-dev libxxhash-dev
  libhwloc-dev python3-sklearn
)
# The tests' on top: the torch peers, GoogleTest, the fuzzer's clang, the
# services the integration tests start (SLURM, Prometheus, etcd, Jupyter),
# and the tools of the Debian roots and the docs checks.
test_packages=(
  python3-torch python3-yaml python3-venv python3-pip python3-xxhash
  libgtest-dev libgmock-dev libbenchmark-dev
  clang libclang-rt-14-dev clang-format
  tmux jupyter-core jupyter-nbconvert python3-nbclient python3-ipykernel python3-ipython
  python3-matplotlib
  iproute2 procps util-linux python3-fusepy
  help2man dpkg-dev debootstrap universal-ctags
  hwloc
  prometheus prometheus-node-exporter
  etcd-server etcd-client python3-etcd
  slurmctld slurmd slurm-client munge
)
packages=("${main_packages[@]}")
case ${1:-} in
  --main) ;;
  "") packages+=("${test_packages[@]}") ;;
  *) echo "install-deps: unknown argument '$1'; usage: $0 [--main]" >&2; exit 2 ;;
esac

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
