#!/usr/bin/env bash
# Two dtrun nodes in network namespaces (--nnodes=1:2, c10d rendezvous on
# h0). h1's link goes down while the job runs and stays down: h0 must
# declare h1 dead, run a new round alone and finish; h1 must be fenced (its
# workers stopped), wait for the store until the join timeout, then give up
# and exit non-zero. (partition_test.py brings the link back.)
# Usage: link_down_test.sh DTRUN FAKE_WORKER. Exit 77 (skip) without root/ip.
set -euo pipefail
dtrun=$(realpath "${1:?usage: link_down_test.sh DTRUN FAKE_WORKER}")
fake=$(realpath "${2:?}")
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
[[ $EUID -eq 0 ]] || { echo "SKIP: network namespaces need root"; exit 77; }
command -v ip >/dev/null || { echo "SKIP: iproute2 is not installed"; exit 77; }

tag=dtl$((RANDOM % 10000))
net=10.201.$((RANDOM % 250))
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  "$here/down.sh" "$tag"
  rm -rf "$work"
}
trap cleanup EXIT
"$here/up.sh" "$tag" 2 "$net"

conf=keep_alive_interval=0.2,keep_alive_max_attempt=3,last_call_timeout=1,join_timeout=8
node() {  # node I: a dtrun inside TAG-hI
  ip netns exec "$tag-h$1" "$dtrun" --nnodes=1:2 --nproc-per-node=2 --rdzv-backend=c10d \
    --rdzv-endpoint="$net.1:29400" --rdzv-id=linkdown --rdzv-conf="$conf" \
    --local-addr="$net.$(($1 + 1))" "$fake" --pid-dir "$work" --sleep-ms 4000 \
    >"$work/node$1.log" 2>&1
}
node 0 & pids+=($!)
sleep 0.3
node 1 & pids+=($!)
for _ in $(seq 200); do
  [[ $(ls "$work"/pid_* 2>/dev/null | wc -l) -ge 4 ]] && break
  sleep 0.05
done
[[ -f $work/pid_3_0 ]] || { echo "FAIL: the 2-node round never started"; cat "$work"/node*.log; exit 1; }

down_at=$(date +%s.%N)
ip -n "$tag-h1" link set eth0 down
rc0=0; wait "${pids[0]}" || rc0=$?
rc1=0; wait "${pids[1]}" || rc1=$?
pids=()
echo "h0 exit $rc0, h1 exit $rc1"
grep -q "fenced: workers stopped" "$work/node1.log" || { echo "FAIL: h1 was not fenced"; cat "$work/node1.log"; exit 1; }
grep -q "declared dead" "$work/node0.log" || { echo "FAIL: h0 did not declare h1 dead"; cat "$work/node0.log"; exit 1; }
[[ $rc0 -eq 0 ]] || { echo "FAIL: h0 did not finish"; cat "$work/node0.log"; exit 1; }
[[ $rc1 -ne 0 ]] || { echo "FAIL: h1 claims success without its link"; exit 1; }
[[ -f $work/pid_0_1 && ! -f $work/pid_2_1 ]] || { echo "FAIL: no 1-node round"; ls "$work"; exit 1; }
echo "PASS: h1's link went down at $down_at; h0 declared it dead, ran alone and finished"
