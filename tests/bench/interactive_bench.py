"""Round trip of an empty cell in a `dtrun --interactive` session, from the
console's side: send the cell, wait for every rank's result, format what
the console shows. Starts `dtrun --interactive --no-console` with 1, 2, 4
and 8 workers (Debian's python3 and torch, gloo) and prints one JSON line
per size: median and 90th percentile over REPS cells."""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("--dtrun", required=True)
p.add_argument("--reps", type=int, default=300)
p.add_argument("--sizes", default="1,2,4,8")
a = p.parse_args()
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "apps", "dtrun", "python"))
from dtrun.session import Session, format_results  # noqa: E402

for n in [int(x) for x in a.sizes.split(",")]:
    proc = subprocess.Popen([a.dtrun, "--interactive", "--no-console", f"--nproc-per-node={n}",
                             "--log-level=error"], stdout=subprocess.PIPE, text=True)
    try:
        fields = proc.stdout.readline().split()
        s = Session(fields[2], int(fields[4]), n)
        s.wait_ready()
        ranks = list(range(n))
        times = []
        for i in range(a.reps + 20):
            t = time.perf_counter()
            format_results(s.run("", ranks))
            if i >= 20:
                times.append((time.perf_counter() - t) * 1000)
        times.sort()
        print(json.dumps({"ranks": n, "median_ms": round(statistics.median(times), 3),
                          "p90_ms": round(times[int(len(times) * 0.9)], 3),
                          "cells": a.reps}), flush=True)
        s.shutdown()
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            proc.wait()
