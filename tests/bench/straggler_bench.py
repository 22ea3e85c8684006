"""Straggler detection's false alarms and its reach, under the real dtrun
with train_cfg (2 ranks, steps of ~20 ms compute, as
tests/lib/straggler_test.py: 300 undisturbed, 400 with a slow rank, since
the rule asks for persistence over 40 steps and 5 s), while another suite
runs beside it.

Alternates an undisturbed run and one whose rank 1 computes 1.5x as long
([fault] slow_rank), RUNS of each, with LOAD (a shell command, run again
whenever it ends) keeping the cores busy the whole time. Prints one
Markdown table: runs, runs with a rank named (a false alarm in the
undisturbed runs, a detection in the slow ones), and the run time.

Usage: straggler_bench.py --dtrun B --train-cfg B [--runs 50] [--load CMD]
"""
import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG = os.path.join(HERE, "..", "..", "examples", "configs", "digits_ddp.toml")
SHORT = ["model.hidden=[256, 256]", "train.batch_size=256",
         "train.eval_every=0"]


def train(args, tmp, name, extra):
    cmd = [args.dtrun, "--nproc-per-node=2", args.train_cfg, CONFIG, "--set",
           f'checkpoint.dir="{os.path.join(tmp, name)}"']
    for s in SHORT + extra:
        cmd += ["--set", s]
    start = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    took = time.monotonic() - start
    if p.returncode != 0:
        sys.exit(f"straggler_bench: run {name} failed:\n{p.stderr}")
    return re.findall(r"straggler: rank (\d+) computes", p.stderr), took


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtrun", required=True)
    ap.add_argument("--train-cfg", required=True)
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--load", default="")
    args = ap.parse_args()
    load = None
    if args.load:
        load = subprocess.Popen(["sh", "-c", f"while :; do {args.load}; done"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
    named = {"undisturbed": 0, "rank 1 at 1.5x": 0}
    wrong = 0
    took = {k: [] for k in named}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for run in range(args.runs):
                for kind, extra in (("undisturbed", ["train.steps=300"]),
                                    ("rank 1 at 1.5x", ["train.steps=400",
                                                        "fault.slow_rank=1",
                                                        "fault.slow_factor=1.5"])):
                    who, t = train(args, tmp, f"{run}{kind[0]}", extra)
                    took[kind].append(t)
                    if who:
                        named[kind] += 1
                        wrong += kind != "undisturbed" and who[0] != "1"
    finally:
        if load:
            os.killpg(load.pid, signal.SIGKILL)
            load.wait()
    print(f"load beside: {args.load or 'none'}; {os.cpu_count()} cores")
    print("| runs | kind | a rank named | run time s, median [lo-hi] |")
    print("|---:|---|---:|---|")
    for kind, n in named.items():
        t = took[kind]
        print(f"| {args.runs} | {kind} | {n} | {statistics.median(t):.2f} "
              f"[{min(t):.2f}-{max(t):.2f}] |")
    if wrong:
        print(f"({wrong} slow runs named a rank other than 1)")


if __name__ == "__main__":
    main()
