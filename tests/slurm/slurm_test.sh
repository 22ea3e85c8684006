#!/usr/bin/env bash
# A real SLURM cluster on this machine (munged, slurmctld, 2 slurmd), and a
# 2-node x 2-worker dtrun job of Debian Python torch gloo workers through
# srun and through sbatch, and an interactive session of 4 ranks under srun.
# Exit 77 (skip) with the reason when SLURM cannot be installed.
# Usage: slurm_test.sh DTRUN_BINARY
set -euo pipefail
dtrun=$(realpath "${1:?usage: slurm_test.sh DTRUN_BINARY}")
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
for tool in slurmctld slurmd srun sbatch munged unshare; do
  if ! command -v "$tool" >/dev/null; then
    echo "SKIP: $tool is not installed (scripts/install-deps.sh installs slurmctld slurmd slurm-client munge)"
    exit 77
  fi
done
if [[ $EUID -ne 0 ]]; then echo "SKIP: a private SLURM cluster needs root"; exit 77; fi

tag=dts$((RANDOM % 10000))
base=$((17000 + (RANDOM % 200) * 20))
trap '"$repo/tests/slurm/cluster-down.sh" "$tag"' EXIT
"$repo/tests/slurm/cluster-up.sh" "$tag" 2 "$base"
export SLURM_CONF=/tmp/$tag/slurm.conf
export DTRUN_BIN=$dtrun

check() {  # check OUTPUT_FILE WHAT
  local ok=1
  for r in 0 1 2 3; do
    grep -q "rank $r of 4 on $tag-h$((r / 2)) group $((r / 2)): sum=10" "$1" || ok=0
  done
  if (( ok )); then echo "PASS: $2: ranks 0..3 on 2 nodes, all_reduce sum 10"; return 0; fi
  echo "FAIL: $2"; cat "$1"; return 1
}

cd "$repo"
srun -N2 --ntasks-per-node=1 scripts/dtrun-srun --nproc-per-node=2 \
  --python /usr/bin/python3 tests/slurm/rank_allreduce.py >"/tmp/$tag/srun.out" 2>&1
check "/tmp/$tag/srun.out" "srun"

cat >"/tmp/$tag/job.sh" <<JOB
#!/usr/bin/env bash
cd "$repo"
srun --ntasks-per-node=1 scripts/dtrun-srun --nproc-per-node=2 \\
  --python /usr/bin/python3 tests/slurm/rank_allreduce.py
JOB
sbatch --wait -N2 --ntasks-per-node=1 -o "/tmp/$tag/sbatch.out" "/tmp/$tag/job.sh" >/dev/null
check "/tmp/$tag/sbatch.out" "sbatch"

# An interactive session across the two nodes: srun gives stdin to task 0,
# whose dtrun runs the console; node 1's dtrun hosts its workers only.
# An error on one rank leaves the others (and its own state) as they were;
# a cell through the ranks' IPython; %shutdown ends every worker and both
# dtruns (the pids %status printed are gone when srun returns).
printf '%s\n' 'x = torch.ones(1) * rank' 'dist.all_reduce(x)' \
  'print("sum", x.item(), "world", dist.get_world_size())' \
  '%rank 3 raise ValueError("only on rank 3")' 'print("still", rank, x.item())' \
  '!echo shell on $rank' '%status' '%shutdown' |
  srun -N2 --ntasks-per-node=1 --input=0 scripts/dtrun-srun --interactive \
    --nproc-per-node=2 >"/tmp/$tag/interactive.out" 2>&1
ok=1
for r in 0 1 2 3; do
  grep -q "\[rank $r\] sum 6.0 world 4" "/tmp/$tag/interactive.out" || ok=0
  grep -q "\[rank $r\] still $r 6.0" "/tmp/$tag/interactive.out" || ok=0
  grep -q "\[rank $r\] shell on $r" "/tmp/$tag/interactive.out" || ok=0
done
grep -q "\[rank 3\] ValueError: only on rank 3" "/tmp/$tag/interactive.out" || ok=0
grep -q "ValueError" <(grep -v "^\[rank 3\]" "/tmp/$tag/interactive.out") && ok=0
grep -qE "^ +3 +$tag-h1 " "/tmp/$tag/interactive.out" || ok=0
grep -qE "^ +0 +$tag-h0 " "/tmp/$tag/interactive.out" || ok=0
pids=$(awk -v t="$tag" '$2 ~ "^" t "-h[01]$" && $3 ~ /^[0-9]+$/ {print $3}' "/tmp/$tag/interactive.out")
[[ $(wc -w <<<"$pids") -eq 4 ]] || ok=0
left=""
for pid in $pids; do kill -0 "$pid" 2>/dev/null && left+=" $pid"; done
[[ -z $left ]] || ok=0
if (( ok )); then
  echo "PASS: interactive session under srun: 4 ranks on 2 nodes, an error on rank 3 only," \
    "IPython's !cmd on every rank, %status names both hosts, %shutdown left no worker"
else
  echo "FAIL: interactive session under srun (workers left:${left:- none})"
  cat "/tmp/$tag/interactive.out"; exit 1
fi

# SLURM's warning before the end of an allocation (sbatch --signal=USR1@T,
# here sent at once with scancel --signal): with SIGUSR1 in
# --signals-to-handle, every worker on both nodes gets it through
# scripts/dtrun-srun and the job ends as the workers decide (exit 0).
mkdir -p "/tmp/$tag/usr1"
cat >"/tmp/$tag/usr1.sh" <<JOB
#!/usr/bin/env bash
cd "$repo"
srun --ntasks-per-node=1 scripts/dtrun-srun --nproc-per-node=2 \\
  --signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1 \\
  --python /usr/bin/python3 tests/slurm/usr1_worker.py /tmp/$tag/usr1
JOB
job=$(sbatch --parsable -N2 --ntasks-per-node=1 -o "/tmp/$tag/usr1.out" "/tmp/$tag/usr1.sh")
for _ in $(seq 1 600); do
  [[ $(ls "/tmp/$tag/usr1" | grep -c '^ready_') -ge 4 ]] && break
  sleep 0.1
done
scancel --signal=USR1 "$job"
for _ in $(seq 1 300); do
  squeue -h -j "$job" 2>/dev/null | grep -q . || break
  sleep 0.1
done
got=$(ls "/tmp/$tag/usr1" | grep -c '^usr1_' || true)
state=$(sacct -n -X -j "$job" -o State 2>/dev/null | tr -d ' ' || true)
if [[ $got -eq 4 ]] && grep -q "received SIGUSR1; forwarding it to 2 worker(s)" "/tmp/$tag/usr1.out"; then
  echo "PASS: scancel --signal=USR1 reached all 4 workers on 2 nodes through dtrun-srun"
else
  echo "FAIL: SIGUSR1 under SLURM: $got of 4 workers got it (job state '$state')"
  cat "/tmp/$tag/usr1.out"; exit 1
fi
