#!/usr/bin/env bash
# cluster-up.sh TAG NODES PORT_BASE
# A private SLURM cluster on this machine for dtrun's tests: munged with its
# own key and socket, one slurmctld and NODES slurmd, all on 127.0.0.1, all
# state under /tmp/TAG. Each slurmd runs in its own UTS + mount namespace so
# that `hostname` is its node name (TAG-h<i>) and /etc/hosts maps every node
# name to 127.0.0.1 (tasks inherit both). Writes /tmp/TAG/env (SLURM_CONF)
# and /tmp/TAG/on-node I CMD..., which runs CMD as if on node I.
set -euo pipefail
tag=${1:?usage: cluster-up.sh TAG NODES PORT_BASE}
nodes=${2:-2}
base=${3:-16800}
[[ $tag =~ ^[a-z0-9]{1,10}$ ]] || { echo "TAG must be [a-z0-9]{1,10}" >&2; exit 2; }
d=/tmp/$tag
conf=$d/slurm.conf
mkdir -p "$d/munge" "$d/ctld" "$d/log" "$d/run"
chmod 755 "$d" "$d/munge"   # munged needs its socket folder searchable

for port in $((base + 17)) $(seq $((base + 18)) $((base + 17 + nodes))); do
  if [[ -n $(ss -Htln "sport = :$port") ]]; then
    echo "cluster-up: port $port is taken; pick another PORT_BASE" >&2
    exit 1
  fi
done

{
  echo "ClusterName=$tag"
  echo "SlurmctldHost=localhost"
  echo "SlurmctldPort=$((base + 17))"
  echo "SlurmUser=root"
  echo "SlurmdUser=root"
  echo "AuthType=auth/munge"
  echo "CredType=cred/munge"
  echo "AuthInfo=socket=$d/munge/munge.sock"
  echo "StateSaveLocation=$d/ctld"
  echo "SlurmdSpoolDir=$d/spool/%n"
  echo "SlurmctldPidFile=$d/run/slurmctld.pid"
  echo "SlurmdPidFile=$d/run/slurmd-%n.pid"
  echo "SlurmctldLogFile=$d/log/slurmctld.log"
  echo "SlurmdLogFile=$d/log/slurmd-%n.log"
  echo "ProctrackType=proctrack/linuxproc"
  echo "TaskPlugin=task/none"
  echo "JobAcctGatherType=jobacct_gather/none"
  echo "AccountingStorageType=accounting_storage/none"
  echo "JobCompType=jobcomp/none"
  echo "MpiDefault=none"
  echo "SchedulerType=sched/builtin"
  echo "SelectType=select/cons_tres"
  echo "SelectTypeParameters=CR_Core"
  echo "ReturnToService=2"
  echo "InactiveLimit=0"
  echo "MinJobAge=10"
  echo "KillWait=5"
  echo "Waittime=0"
  for ((i = 0; i < nodes; i++)); do
    echo "NodeName=$tag-h$i NodeHostname=$tag-h$i NodeAddr=127.0.0.1 Port=$((base + 18 + i)) CPUs=$(nproc) State=UNKNOWN"
    mkdir -p "$d/spool/$tag-h$i"
  done
  echo "PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO"
} >"$conf"
{ echo "127.0.0.1 localhost"; for ((i = 0; i < nodes; i++)); do echo "127.0.0.1 $tag-h$i"; done; } >"$d/hosts"
echo "export SLURM_CONF=$conf" >"$d/env"

cat >"$d/on-node" <<ONNODE
#!/usr/bin/env bash
# on-node I CMD...: CMD with node I's host name and /etc/hosts.
i=\${1:?usage: on-node I CMD...}; shift
export SLURM_CONF=$conf
exec unshare --mount --uts -- sh -c 'mount --bind "\$0" /etc/hosts && hostname "\$1" && shift && exec "\$@"' \\
  "$d/hosts" "$tag-h\$i" "\$@"
ONNODE
chmod 755 "$d/on-node"

head -c 1024 /dev/urandom >"$d/munge/munge.key"
chmod 400 "$d/munge/munge.key"
munged --key-file="$d/munge/munge.key" --socket="$d/munge/munge.sock" \
  --pid-file="$d/munge/munged.pid" --log-file="$d/munge/munged.log" \
  --seed-file="$d/munge/munged.seed"
"$d/on-node" 0 slurmctld -f "$conf" -c
for ((i = 0; i < nodes; i++)); do "$d/on-node" "$i" slurmd -f "$conf" -N "$tag-h$i"; done

for _ in $(seq 300); do
  idle=$(SLURM_CONF=$conf sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l) || idle=0
  (( idle == nodes )) && { echo "cluster $tag: $nodes node(s) idle"; exit 0; }
  sleep 0.2
done
echo "cluster $tag: nodes did not become idle in 60 s" >&2
tail -n 20 "$d"/log/*.log >&2 || true
exit 1
