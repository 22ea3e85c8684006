"""Round trips of a `dtrun --interactive` session (Debian's python3 and torch,
gloo), one JSON line per measurement:
  console   an empty cell from the console's side: send it, wait for every
            rank's result, format what the console prints (`dtrun
            --interactive --no-console` with 1, 2, 4, 8 workers; REPS cells)
  notebook  an empty cell from a Jupyter front end: execute_request to
            execute_reply through a real kernel with `%load_ext dtrun`
            (jupyter_client; NB_REPS cells)
  kernel-only  the same empty cell run in the kernel (%dist_mode off): the
            part of the notebook's round trip that is Jupyter's own
  notebook-overhead  notebook minus kernel-only, the two measured in
            alternating rounds (ROUNDS) of the same notebook: dtrun's share
  pull      %dist_pull of a PULL_MB MB tensor from rank 0 of a 2-rank
            session into the client (best and median of 5)
  nodes     the console's empty cell on a session of two nodes on loopback
            hosts (127.0.0.2 and 127.0.0.3, 2 ranks each, static rendezvous)
Medians and 90th percentiles in ms, after warm-up cells."""
import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("--dtrun", required=True)
p.add_argument("--reps", type=int, default=300)
p.add_argument("--nb-reps", type=int, default=100)
p.add_argument("--sizes", default="1,2,4,8")
p.add_argument("--pull-mb", type=int, default=100)
p.add_argument("--only", default="console,notebook,pull,nodes")
p.add_argument("--rounds", type=int, default=3, help="notebook: alternating rounds")
p.add_argument("--python", default=None, help="the workers' Python (default: dtrun's)")
a = p.parse_args()
PY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "apps", "dtrun", "python")
sys.path.insert(0, PY)
from dtrun.session import Session, format_results  # noqa: E402


def summary(kind, n, times, **extra):
    times.sort()
    print(json.dumps({"kind": kind, "ranks": n, "median_ms": round(statistics.median(times), 3),
                      "p90_ms": round(times[int(len(times) * 0.9)], 3), "cells": len(times),
                      **extra}), flush=True)


def with_session(n, body):
    python = [f"--python={a.python}"] if a.python else []
    proc = subprocess.Popen([a.dtrun, "--interactive", "--no-console", f"--nproc-per-node={n}",
                             "--log-level=error"] + python, stdout=subprocess.PIPE, text=True)
    try:
        fields = proc.stdout.readline().split()
        s = Session(fields[2], int(fields[4]), n)
        s.wait_ready()
        body(s)
        s.shutdown()
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            proc.wait()


def with_two_nodes(body):
    """Two --no-console nodes; the client follows the rounds from node 0's line."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.2", 0))
        port = sock.getsockname()[1]
    common = [a.dtrun, "--interactive", "--no-console", "--nnodes=2", "--nproc-per-node=2",
              "--master-addr=127.0.0.2", f"--master-port={port}", "--log-level=error"]
    procs = [subprocess.Popen(common + [f"--node-rank={i}", f"--local-addr=127.0.0.{2 + i}"],
                              stdout=subprocess.PIPE, text=True) for i in (0, 1)]
    try:
        fields = procs[0].stdout.readline().split()
        s = Session(fields[2], int(fields[4]), int(fields[6]), rdzv_key=fields[-1])
        s.wait_ready()
        body(s)
        s.shutdown()
        for proc in procs:
            proc.wait(timeout=30)
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
                proc.wait()


def console(s, kind="console"):
    ranks = list(range(s.world))
    times = []
    for i in range(a.reps + 20):
        t = time.perf_counter()
        format_results(s.run("", ranks))
        if i >= 20:
            times.append((time.perf_counter() - t) * 1000)
    summary(kind, s.world, times)


def pull(s):
    elements = a.pull_mb * 2**20 // 4
    s.run(f"big = torch.ones({elements})", [0])
    rates = []
    for _ in range(5):
        t = time.perf_counter()
        got = s.pull(["big"], 0)["big"]
        rates.append(a.pull_mb / (time.perf_counter() - t))
        assert got.numel() == elements
        del got
    print(json.dumps({"kind": "pull", "ranks": s.world, "mb": a.pull_mb,
                      "best_mb_s": round(max(rates)), "median_mb_s": round(statistics.median(rates))}),
          flush=True)


def notebook(n):
    import jupyter_client

    env = dict(os.environ, PYTHONPATH=PY, DTRUN=a.dtrun, PATH="/usr/bin:" + os.environ["PATH"],
               PYDEVD_DISABLE_FILE_VALIDATION="1")
    km, kc = jupyter_client.manager.start_new_kernel(kernel_name="python3", env=env)
    quiet = {"timeout": 60, "output_hook": lambda msg: None}

    def cells(count):
        times = []
        for i in range(count + 10):
            t = time.perf_counter()
            reply = kc.execute_interactive("pass", **quiet)
            if i >= 10:
                times.append((time.perf_counter() - t) * 1000)
            assert reply["content"]["status"] == "ok", reply
        return times

    try:
        kc.execute_interactive("%load_ext dtrun", timeout=60)
        python = f" --python {a.python}" if a.python else ""
        kc.execute_interactive(f"%dist_init --num-processes {n}{python}", timeout=300)
        on, off, overheads = [], [], []
        for _ in range(a.rounds):  # the two sides alternate
            kc.execute_interactive("%dist_mode on", **quiet)
            got_on = cells(a.nb_reps)
            # The same empty cell run by the kernel itself: what Jupyter costs.
            kc.execute_interactive("%dist_mode off", **quiet)
            got_off = cells(a.nb_reps)
            on += got_on
            off += got_off
            overheads.append(statistics.median(got_on) - statistics.median(got_off))
        summary("notebook", n, on)
        summary("kernel-only", n, off)
        print(json.dumps({"kind": "notebook-overhead", "ranks": n,
                          "median_ms": round(statistics.median(overheads), 3),
                          "min_ms": round(min(overheads), 3), "max_ms": round(max(overheads), 3),
                          "rounds": a.rounds, "python": a.python or "dtrun's"}), flush=True)
        kc.execute_interactive("%dist_shutdown", **quiet)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


only = a.only.split(",")
for n in [int(x) for x in a.sizes.split(",")]:
    if "console" in only:
        with_session(n, console)
    if "notebook" in only:
        notebook(n)
if "pull" in only:
    with_session(2, pull)
if "nodes" in only:
    with_two_nodes(lambda s: console(s, "console-2-nodes"))
