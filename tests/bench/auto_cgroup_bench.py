"""`--nproc-per-node=auto` under a pod's CPU limit: dtrun vs Debian's
torchrun 1.13 (through torchrun_shim.py), each starting train_cfg (digits,
DDP, CPU gloo) inside the same cgroup v1 cpu cgroup (cgroup v2's cpu.max
where that is mounted) with a quota of --cpus CPUs, the sides alternating.
dtrun's auto reads the quota (and the affinity mask); torchrun's is
os.cpu_count(), the host's cores. Reports how many workers each started,
the training's throughput (samples/s over the run's steps, from
train_cfg's own log line, so the launchers' start-up is left out) and the
wall time of the whole launch.

Usage (as root): auto_cgroup_bench.py --dtrun PATH --train-cfg PATH
                 [--cpus 1] [--reps 3] [--steps 300]
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PY = "/usr/bin/python3"
SHIM = os.path.join(HERE, "torchrun_shim.py")
CONFIG = os.path.normpath(os.path.join(HERE, "..", "..", "examples", "configs",
                                       "digits_ddp.toml"))
CGROUP_V1 = "/sys/fs/cgroup/cpu"


def make_cgroup(cpus):
    period = 100000
    if os.path.isdir(CGROUP_V1):
        path = os.path.join(CGROUP_V1, f"dtrun_bench_{os.getpid()}")
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "cpu.cfs_period_us"), "w") as f:
            f.write(str(period))
        with open(os.path.join(path, "cpu.cfs_quota_us"), "w") as f:
            f.write(str(int(period * cpus)))
        return path
    path = os.path.join("/sys/fs/cgroup", f"dtrun_bench_{os.getpid()}")
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "cpu.max"), "w") as f:
        f.write(f"{int(period * cpus)} {period}")
    return path


def run(cmd, cgroup):
    def enter():
        with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    t0 = time.perf_counter()
    p = subprocess.run(cmd, preexec_fn=enter, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"{cmd[:3]} exited {p.returncode}: {p.stderr[-500:]}")
    workers = re.search(r"training on \S+ \(backend \w+, (\d+) ranks?\)", p.stdout)
    rate = re.findall(r"samples/s (\d+)", p.stdout)
    if not workers or not rate:
        raise RuntimeError(f"no 'training on' or samples/s line in: {p.stdout[-500:]}")
    return int(workers.group(1)), float(rate[-1]), wall


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtrun", required=True)
    ap.add_argument("--train-cfg", required=True)
    ap.add_argument("--cpus", type=float, default=1)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=300)
    a = ap.parse_args()
    cgroup = make_cgroup(a.cpus)
    tmp = tempfile.mkdtemp(prefix="dtrun-auto-bench-")
    sets = ["--set", f"train.steps={a.steps}", "--set", f"train.log_every={a.steps}",
            "--set", "train.eval_every=0"]
    sides = {
        "dtrun": lambda d: [a.dtrun, "--nproc-per-node=auto", a.train_cfg, CONFIG,
                            "--set", f'checkpoint.dir="{d}"', *sets],
        "torchrun 1.13 (shim)": lambda d: [PY, SHIM, "--nproc_per_node=auto", "--no_python",
                                          "--monitor_interval=0.1", a.train_cfg, CONFIG,
                                          "--set", f'checkpoint.dir="{d}"', *sets],
    }
    got = {name: [] for name in sides}
    try:
        for rep in range(a.reps):
            for name, cmd in sides.items():
                d = os.path.join(tmp, f"{rep}-{len(got[name])}-{name.split()[0]}")
                got[name].append(run(cmd(d), cgroup))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            os.rmdir(cgroup)
        except OSError:
            pass
    print(f"cgroup quota {a.cpus:g} CPU(s) on a {os.cpu_count()}-core host; train_cfg digits "
          f"DDP, {a.steps} steps, batch 32 per worker; {a.reps} runs each, alternating")
    print()
    print("| launcher | workers (auto) | samples/s, median [lo-hi] | wall s, median [lo-hi] |")
    print("|---|---|---|---|")
    for name, runs in got.items():
        w = sorted({r[0] for r in runs})
        rates = [r[1] for r in runs]
        walls = [r[2] for r in runs]
        print(f"| {name} | {','.join(map(str, w))} | {statistics.median(rates):.0f} "
              f"[{min(rates):.0f}-{max(rates):.0f}] | {statistics.median(walls):.2f} "
              f"[{min(walls):.2f}-{max(walls):.2f}] |")
    d, t = (statistics.median(r[1] for r in got[k]) for k in sides)
    print()
    print(f"throughput, dtrun / torchrun: {d / t:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
