#!/usr/bin/env bash
# down.sh TAG: kills every process inside TAG's namespaces (by pid), deletes
# them, and removes the root-namespace guard route once no other TAG on the
# same NET needs it.
set -uo pipefail
tag=${1:?usage: down.sh TAG}
for ns in $(ip netns list | awk '{print $1}' | grep -E "^$tag-(h[0-9]+|sw)$"); do
  for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
  ip netns del "$ns" 2>/dev/null
done
guard=/run/dtnet-guard/$tag
if [[ -f $guard ]]; then
  net=$(cat "$guard")
  rm -f "$guard"
  if ! grep -qx "$net" /run/dtnet-guard/* 2>/dev/null; then
    ip route del unreachable "$net.0/24" 2>/dev/null
  fi
fi
exit 0
