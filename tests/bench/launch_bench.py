"""dtrun vs Debian's torchrun 1.13 (through torchrun_shim.py) and, with
--torch2, torchrun 2.6 in the trixie root made by scripts/torch2.sh (through
dtrun's torch shim, apps/dtrun/python/dtrun_torch_shim), in one run, the sides alternating.

Measures whole-process wall time for N workers of `true` (--no-python) and of
a Python gloo-barrier worker (also launched from a bare shell loop; with
--torch2 also with torch 2.6 workers, started by dtrun through the root's
interpreter wrapper), and the time from a worker's failing exit to its
restarted successor's start, from timestamps the workers write. Prints
Markdown tables: each cell is the median, with the range in brackets.

Usage: launch_bench.py --dtrun PATH --fake-worker PATH [--reps N]
                       [--torch2 scripts/torch2.sh [--torch2-python PATH]]
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
SHIM2 = os.path.normpath(os.path.join(HERE, "..", "..", "apps", "dtrun", "python", "dtrun_torch_shim"))
BARRIER = os.path.join(HERE, "barrier_worker.py")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wall(cmd, env=None, shell=False):
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, shell=shell, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE)
    elapsed = time.perf_counter() - t0
    if p.returncode != 0:
        tail = p.stderr.decode(errors="replace").strip().splitlines()[-3:]
        raise RuntimeError(f"{cmd} exited {p.returncode}: {' | '.join(tail)}")
    return elapsed


def alternating(sides, reps):
    """sides: [(make_cmd, kwargs)]. One run of each side in turn, reps times;
    returns each side's samples in seconds."""
    samples = [[] for _ in sides]
    for _ in range(reps):
        for i, (make_cmd, kw) in enumerate(sides):
            samples[i].append(wall(make_cmd(), **kw))
    return samples


def cell(samples, scale, unit, digits):
    m = statistics.median(samples) * scale
    lo, hi = min(samples) * scale, max(samples) * scale
    return f"{m:.{digits}f} {unit} [{lo:.{digits}f}-{hi:.{digits}f}]"


def ratio(num, den, digits=2):
    return f"{statistics.median(num) / statistics.median(den):.{digits}f}x"


class Launchers:
    def __init__(self, a):
        self.a = a
        self.torch2 = a.torch2
        self.torch2_python = a.torch2_python or os.path.join(
            os.path.dirname(os.path.abspath(a.torch2 or ".")), "torch2-python")
        # dtrun's 2.6 workers and torchrun 2.6 get the same libuv shim.
        self.env2 = dict(os.environ, PYTHONPATH=SHIM2)

    def dtrun(self, n, *args):
        return [self.a.dtrun, f"--nproc-per-node={n}", *args]

    def torchrun(self, n, *args, interval="0.1"):
        return [PY, SHIM, f"--nproc_per_node={n}", f"--master_port={free_port()}",
                f"--monitor_interval={interval}", *args]

    def torchrun2(self, n, *args):
        """torchrun 2.6 inside the root (its default --monitor_interval is 0.1)."""
        return [self.torch2, "run", "env", f"PYTHONPATH={SHIM2}", "/usr/bin/torchrun",
                f"--nproc_per_node={n}", f"--master_port={free_port()}", *args]

    def bare_loop(self, n, prefix=""):
        """The same workers from a shell loop: rank 0's process hosts the store."""
        port = free_port()
        return (f"for r in $(seq 0 {n - 1}); do MASTER_ADDR=127.0.0.1 MASTER_PORT={port} "
                f"RANK=$r LOCAL_RANK=$r WORLD_SIZE={n} OMP_NUM_THREADS=1 {prefix}{PY} "
                f"{BARRIER} & done; wait")

    def bare_loop2(self, n):
        # Rank 0 hosts the store itself (no agent store): USE_LIBUV=0 is how
        # env:// asks 2.6 for the non-libuv store.
        return self.bare_loop(n, prefix=f"{self.torch2} run env USE_LIBUV=0 ")


def true_table(L, reps):
    two = L.torch2 is not None
    head = "| launch | dtrun | torchrun 1.13 (shim, --monitor_interval=0.1) |"
    sep = "|---|---:|---:|"
    if two:
        head += " torchrun 2.6 (root, libuv shim) |"
        sep += "---:|"
    head += " torchrun 1.13 / dtrun |" + (" torchrun 2.6 / dtrun |" if two else "")
    sep += "---:|" + ("---:|" if two else "")
    print(head)
    print(sep)
    for n in (1, 2, 4, 8):
        sides = [(lambda: L.dtrun(n, "--no-python", "true"), {}),
                 (lambda: L.torchrun(n, "--no_python", "true"), {})]
        if two:
            sides.append((lambda: L.torchrun2(n, "--no_python", "true"), {}))
        s = alternating(sides, reps)
        row = f"| {n} x `true` (--no-python), wall | " + " | ".join(
            cell(x, 1000, "ms", 1) for x in s)
        row += f" | {ratio(s[1], s[0], 1)}" + (f" | {ratio(s[2], s[0], 1)}" if two else "")
        print(row + " |", flush=True)
    t5 = wall(L.torchrun(8, "--no_python", "true", interval="5"))
    print(f"| 8 x `true`, torchrun's 1.13 default --monitor_interval=5 | | {t5 * 1000:.0f} ms |"
          + (" |" if two else "") + " |" + (" |" if two else ""))


def python_table(L, reps):
    two = L.torch2 is not None
    cols = ["dtrun", "bare shell loop", "torchrun 1.13 (shim, 0.1 s)"]
    if two:
        cols += ["dtrun, 2.6 workers", "bare loop, 2.6", "torchrun 2.6 (root, shim)"]
    cols += ["dtrun / bare loop", "torchrun 1.13 / dtrun"]
    if two:
        cols += ["dtrun / bare loop (2.6)", "torchrun 2.6 / dtrun (2.6)"]
    print("| Python gloo barrier workers | " + " | ".join(cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for n in (1, 2, 4, 8):
        sides = [(lambda: L.dtrun(n, "--python", PY, BARRIER), {}),
                 (lambda: L.bare_loop(n), {"shell": True}),
                 (lambda: L.torchrun(n, BARRIER), {})]
        if two:
            sides += [(lambda: L.dtrun(n, "--python", L.torch2_python, BARRIER), {"env": L.env2}),
                      (lambda: L.bare_loop2(n), {"shell": True}),
                      (lambda: L.torchrun2(n, BARRIER), {})]
        s = alternating(sides, reps)
        row = f"| {n} worker(s), wall | " + " | ".join(cell(x, 1, "s", 2) for x in s)
        row += f" | {ratio(s[0], s[1], 3)} | {ratio(s[2], s[0])}"
        if two:
            row += f" | {ratio(s[3], s[4], 3)} | {ratio(s[5], s[3])}"
        print(row + " |", flush=True)


def restart_latency(cmd_prefix, worker, reps):
    """Each rep's ms from rank 0's failing exit to its restarted start."""
    samples = []
    for _ in range(reps):
        with tempfile.TemporaryDirectory() as d:
            p = subprocess.run(cmd_prefix + [worker, "--stamp-dir", d, "--only-rank", "0",
                                             "--fail-once", d],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            if p.returncode != 0:
                raise RuntimeError(f"{cmd_prefix} exited {p.returncode}: "
                                   f"{p.stderr.decode(errors='replace')[-300:]}")
            with open(os.path.join(d, "exit_0_0")) as f:
                exited = int(f.read())
            with open(os.path.join(d, "start_0_1")) as f:
                restarted = int(f.read())
            samples.append((restarted - exited) / 1e9)
    return samples


def restart_table(L, reps):
    two = L.torch2 is not None
    sides = [L.dtrun(2, "--max-restarts=1"), L.torchrun(2, "--no_python", "--max_restarts=1")]
    head = ("| restart: failing exit -> restarted worker's start (median) | dtrun "
            "| torchrun 1.13 (shim, 0.1 s) |")
    if two:
        sides.append(L.torchrun2(2, "--no_python", "--max_restarts=1"))
        head += " torchrun 2.6 (root, shim) |"
    samples = [[] for _ in sides]
    for _ in range(reps):
        for i, prefix in enumerate(sides):
            samples[i] += restart_latency(prefix, L.a.fake_worker, 1)
    print(head)
    print("|---|---:|---:|" + ("---:|" if two else ""))
    print("| 2 workers, rank 0 fails once | " + " | ".join(
        cell(x, 1000, "ms", 1) for x in samples) + " |")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dtrun", required=True)
    p.add_argument("--fake-worker", required=True)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--py-reps", type=int, default=0, help="default: max(3, reps / 3)")
    p.add_argument("--torch2", help="scripts/torch2.sh: also measure torchrun 2.6 in its root")
    p.add_argument("--torch2-python", help="interpreter wrapper running the root's python3 "
                   "(default: torch2-python beside --torch2)")
    p.add_argument("--tables", default="true,python,restart")
    a = p.parse_args()
    L = Launchers(a)
    tables = a.tables.split(",")
    if "true" in tables:
        true_table(L, a.reps)
        print()
    if "python" in tables:
        python_table(L, a.py_reps or max(3, a.reps // 3))
        print()
    if "restart" in tables:
        restart_table(L, a.reps)


if __name__ == "__main__":
    sys.exit(main())
