#!/usr/bin/env bash
# up.sh TAG N NET: N test hosts TAG-h0.. as network namespaces, host i with
# eth0 = NET.(i+1)/24, joined by a bridge in namespace TAG-sw. First of all
# it installs, in the root namespace, an `unreachable` route for NET.0/24, so
# that traffic to the test subnet from outside the namespaces fails locally
# instead of leaving the machine. NET must be 10.A.B.
set -euo pipefail
tag=${1:?usage: up.sh TAG N NET}
n=${2:?}
net=${3:?}
[[ $tag =~ ^[A-Za-z0-9]{1,10}$ ]] || { echo "bad TAG" >&2; exit 2; }
[[ $net =~ ^10\.[0-9]{1,3}\.[0-9]{1,3}$ ]] || { echo "NET must be 10.A.B" >&2; exit 2; }
mkdir -p /run/dtnet-guard
echo "$net" >"/run/dtnet-guard/$tag"
[[ -n $(ip route show exact "$net.0/24") ]] || ip route add unreachable "$net.0/24"

ip netns add "$tag-sw"
ip -n "$tag-sw" link set lo up
ip -n "$tag-sw" link add br0 type bridge
ip -n "$tag-sw" link set br0 up
for ((i = 0; i < n; i++)); do
  h=$tag-h$i
  ip netns add "$h"
  ip -n "$h" link set lo up
  ip -n "$tag-sw" link add "p$i" type veth peer name eth0 netns "$h"
  ip -n "$tag-sw" link set "p$i" master br0 up
  ip -n "$h" addr add "$net.$((i + 1))/24" dev eth0
  ip -n "$h" link set eth0 up
done
for ((i = 0; i < n; i++)); do
  for _ in $(seq 50); do
    ip -n "$tag-h$i" link show eth0 | grep -q 'state UP' && break
    sleep 0.1
  done
done
