#!/usr/bin/env bash
# cluster-down.sh TAG: cancels jobs, stops the cluster's daemons by the pids
# in their pid files (SIGKILL after 5 s), and removes /tmp/TAG.
set -uo pipefail
tag=${1:?usage: cluster-down.sh TAG}
d=/tmp/$tag
[[ -d $d ]] || exit 0
SLURM_CONF=$d/slurm.conf scancel --quiet --full -p main 2>/dev/null || true
pids=()
for f in "$d"/run/*.pid "$d/munge/munged.pid"; do
  [[ -f $f ]] && pids+=("$(cat "$f")")
done
for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
live() {  # a pid that exists and is not a zombie
  local st
  st=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  st=${st##*) }
  [[ ${st%% *} != Z ]]
}
for _ in $(seq 50); do
  any=0
  for p in "${pids[@]}"; do live "$p" && any=1; done
  (( any )) || break
  sleep 0.1
done
for p in "${pids[@]}"; do live "$p" && kill -KILL "$p" 2>/dev/null; done
rm -rf "$d"
