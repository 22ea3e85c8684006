"""Rendezvous cost as the node count grows, with real dtrun agents: N agents
(--nnodes=N --rdzv-backend=c10d, one worker of /bin/true each) at a
standalone dtstore on 127.0.0.1. Prints, per N, the seconds from the last
agent's start to every agent's exit, from the first agent's start to every
agent's exit, and the CPU time of an agent and its worker (user + system,
from the children's rusage), each the median and range of --reps runs.

Usage: rdzv_scale_bench.py --dtrun PATH [--dtstore PATH] [--nodes 8,64,128,256,512]
                           [--reps 3] [--label NAME]
"""
import argparse
import os
import resource
import statistics
import subprocess
import sys
import time


def start_store(path):
    p = subprocess.Popen([path, "--host", "127.0.0.1", "--port", "0", "--log-level", "error"],
                         stdout=subprocess.PIPE, text=True)
    port = int(p.stdout.readline().strip().rsplit(":", 1)[1])
    return p, port


def one_run(a, n, rep):
    store, port = start_store(a.dtstore)
    agents = []
    try:
        cmd = [a.dtrun, f"--nnodes={n}", "--nproc-per-node=1", "--rdzv-backend=c10d",
               f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id=scale{n}_{rep}",
               "--rdzv-conf=is_host=0,join_timeout=300", "--log-level=error", "/bin/true"]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        first_start = time.monotonic()
        for _ in range(n):
            agents.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                           stderr=subprocess.DEVNULL))
        last_start = time.monotonic()
        for p in agents:
            p.wait(timeout=600)
        end = time.monotonic()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        bad = [p.returncode for p in agents if p.returncode != 0]
        if bad:
            raise RuntimeError(f"N={n}: {len(bad)} agent(s) failed, exit codes {sorted(set(bad))}")
        return end - last_start, end - first_start, cpu / n * 1000
    finally:
        for p in agents:
            if p.poll() is None:
                p.kill()
                p.wait()
        store.terminate()
        store.wait()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dtrun", required=True)
    p.add_argument("--dtstore")
    p.add_argument("--nodes", default="8,64,128,256,512")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--label", default="dtrun")
    a = p.parse_args()
    a.dtstore = a.dtstore or os.path.join(os.path.dirname(a.dtrun), "dtstore")
    # Each agent holds a few descriptors here (pipes) and one in dtstore.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    print(f"| N agents | {a.label}: last start -> all exited | first start -> all exited "
          f"| CPU per agent and its worker |")
    print("|---:|---:|---:|---:|")
    for n in (int(x) for x in a.nodes.split(",")):
        runs = [one_run(a, n, r) for r in range(a.reps)]
        cells = []
        for i, unit in ((0, "s"), (1, "s"), (2, "ms")):
            v = [r[i] for r in runs]
            digits = 2 if unit == "s" else 1
            cells.append(f"{statistics.median(v):.{digits}f} {unit} "
                         f"({min(v):.{digits}f}-{max(v):.{digits}f})")
        print(f"| {n} | " + " | ".join(cells) + " |", flush=True)
    print(f"\nmedian (min-max) of {a.reps} runs each")


if __name__ == "__main__":
    sys.exit(main())
