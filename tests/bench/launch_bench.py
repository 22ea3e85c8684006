"""dtrun vs Debian's torchrun 1.13 (through torchrun_shim.py), same run.

Measures whole-process wall time for N workers of `true` (--no-python) and of
a Python gloo-barrier worker (also launched from a bare shell loop), and the
time from a worker's failing exit to its restarted successor's start, from
timestamps the workers write. Prints Markdown tables.

Usage: launch_bench.py --dtrun PATH --fake-worker PATH [--reps N]
"""
import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PY = "/usr/bin/python3"
SHIM = os.path.join(HERE, "torchrun_shim.py")
BARRIER = os.path.join(HERE, "barrier_worker.py")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wall(cmd, env=None, shell=False):
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, shell=shell, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    elapsed = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"{cmd} exited {p.returncode}")
    return elapsed


def median_wall(make_cmd, reps, **kw):
    return statistics.median(wall(make_cmd(), **kw) for _ in range(reps))


def torchrun(n, *args, interval="0.1"):
    return [PY, SHIM, f"--nproc_per_node={n}", f"--master_port={free_port()}",
            f"--monitor_interval={interval}", *args]


def bare_loop(n):
    """The same workers from a shell loop: rank 0's process hosts the store."""
    port = free_port()
    return (f"for r in $(seq 0 {n - 1}); do MASTER_ADDR=127.0.0.1 MASTER_PORT={port} "
            f"RANK=$r LOCAL_RANK=$r WORLD_SIZE={n} OMP_NUM_THREADS=1 {PY} {BARRIER} & "
            f"done; wait")


def restart_latency(cmd_prefix, worker, reps):
    """Median ms from rank 0's failing exit to its restarted start."""
    samples = []
    for _ in range(reps):
        with tempfile.TemporaryDirectory() as d:
            subprocess.run(cmd_prefix + [worker, "--stamp-dir", d, "--only-rank", "0",
                                         "--fail-once", d],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            with open(os.path.join(d, "exit_0_0")) as f:
                exited = int(f.read())
            with open(os.path.join(d, "start_0_1")) as f:
                restarted = int(f.read())
            samples.append((restarted - exited) / 1e6)
    return statistics.median(samples)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dtrun", required=True)
    p.add_argument("--fake-worker", required=True)
    p.add_argument("--reps", type=int, default=10)
    a = p.parse_args()
    reps, py_reps = a.reps, max(3, a.reps // 3)
    print("| launch | dtrun | torchrun 1.13 (shim, --monitor_interval=0.1) | torchrun / dtrun |")
    print("|---|---:|---:|---:|")
    for n in (1, 2, 4, 8):
        d = median_wall(lambda: [a.dtrun, f"--nproc-per-node={n}", "--no-python", "true"], reps)
        t = median_wall(lambda: torchrun(n, "--no_python", "true"), reps)
        print(f"| {n} x `true` (--no-python), wall | {d * 1000:.1f} ms | {t * 1000:.1f} ms "
              f"| {t / d:.1f}x |", flush=True)
    t5 = wall(torchrun(8, "--no_python", "true", interval="5"))
    print(f"| 8 x `true`, torchrun's 1.13 default --monitor_interval=5 | | {t5 * 1000:.0f} ms | |")
    print()
    print("| Python gloo barrier workers | dtrun | bare shell loop | torchrun 1.13 (shim, 0.1 s) "
          "| dtrun / bare loop | torchrun / dtrun |")
    print("|---|---:|---:|---:|---:|---:|")
    for n in (1, 2, 4, 8):
        d = median_wall(lambda: [a.dtrun, f"--nproc-per-node={n}", "--python", PY, BARRIER],
                        py_reps)
        b = median_wall(lambda: bare_loop(n), py_reps, shell=True)
        t = median_wall(lambda: torchrun(n, BARRIER), py_reps)
        print(f"| {n} worker(s), wall | {d:.2f} s | {b:.2f} s | {t:.2f} s | "
              f"{d / b:.3f} | {t / d:.2f}x |", flush=True)
    print()
    dr = restart_latency([a.dtrun, "--nproc-per-node=2", "--max-restarts=1"], a.fake_worker,
                         reps)
    tr = restart_latency(torchrun(2, "--no_python", "--max_restarts=1"), a.fake_worker, reps)
    print("| restart: failing exit -> restarted worker's start (median) | dtrun | torchrun 1.13 "
          "(shim, 0.1 s) |")
    print("|---|---:|---:|")
    print(f"| 2 workers, rank 0 fails once | {dr:.1f} ms | {tr:.1f} ms |")


if __name__ == "__main__":
    sys.exit(main())
