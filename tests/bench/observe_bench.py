"""What watching a job costs, measured on real processes:

1. A metrics scrape (GET /metrics, the whole HTTP exchange) of a dtrun node
   whose N workers beat every 50 ms (fake_worker --beat-every-ms), at 8 and
   64 workers a node, the two nodes' scrapes taking turns; and the CPU the
   dtrun process spends over that time (its /proc/PID/stat).
2. train_cfg's throughput (samples/s, from its log lines) under torchrun
   1.13 (through torchrun_shim.py: nothing of dtrun's watches it), under
   dtrun as it comes (status, beats and straggler scores are always on),
   and under dtrun with everything on (--hang-timeout, --metrics-port
   scraped every second, `dtrun --status RUN` every second); the three
   sides alternating, repeated; medians and spread.

Usage: observe_bench.py --dtrun PATH --fake-worker PATH --train-cfg PATH
                        [--repeat N]"""
import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
SHIM = os.path.join(HERE, "torchrun_shim.py")
CONFIG = os.path.join(HERE, "..", "..", "examples", "configs", "digits_ddp.toml")

p = argparse.ArgumentParser()
p.add_argument("--dtrun", required=True)
p.add_argument("--fake-worker", required=True)
p.add_argument("--train-cfg", required=True)
p.add_argument("--repeat", type=int, default=5)
ARGS = p.parse_args()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read()


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def spread(xs, scale=1.0, fmt="{:.2f}"):
    return (fmt.format(statistics.median(xs) * scale) + " (" + fmt.format(min(xs) * scale)
            + "-" + fmt.format(max(xs) * scale) + ")")


def scrapes():
    sizes, jobs, ports = (8, 64), [], {}
    try:
        for n in sizes:
            ports[n] = free_port()
            jobs.append(subprocess.Popen(
                [ARGS.dtrun, "--no-python", f"--nproc-per-node={n}", "--log-level=error",
                 f"--metrics-port={ports[n]}", ARGS.fake_worker, "--beat-every-ms", "50"],
                stdout=subprocess.DEVNULL))
        for n in sizes:  # every rank has a step in the text
            deadline = time.monotonic() + 60
            while True:
                try:
                    if get(f"http://127.0.0.1:{ports[n]}/metrics").count(
                            b"dtrun_worker_step{") >= n:
                        break
                except OSError:
                    pass  # not listening yet
                if time.monotonic() > deadline:
                    sys.exit(f"no steps of {n} workers in /metrics")
                time.sleep(0.2)
        cpu0 = {n: cpu_seconds(j.pid) for n, j in zip(sizes, jobs)}
        t0 = time.monotonic()
        times, size = {n: [] for n in sizes}, {}
        for i in range(100):
            for n in (sizes if i % 2 else sizes[::-1]):  # each goes first half the time
                start = time.perf_counter()
                body = get(f"http://127.0.0.1:{ports[n]}/metrics")
                times[n].append(time.perf_counter() - start)
                size[n] = len(body)
            time.sleep(0.05)
        wall = time.monotonic() - t0
        cpu = {n: (cpu_seconds(j.pid) - cpu0[n]) / wall for n, j in zip(sizes, jobs)}
    finally:
        for j in jobs:
            j.terminate()
            j.wait()
    print("| workers on the node (beating every 50 ms) | GET /metrics, median (min-max) "
          "| text | dtrun's CPU meanwhile (200 scrapes in "
          f"{wall:.0f} s) |")
    print("|---|---|---|---|")
    for n in sizes:
        print(f"| {n} | {spread(times[n], 1000)} ms | {size[n] / 1024:.1f} KiB "
              f"| {cpu[n] * 100:.1f}% of a core |")


def throughput(out):
    """Median samples/s of train_cfg's log lines after the first."""
    rates = [float(line.rsplit(" ", 1)[1]) for line in out.splitlines()
             if line.startswith("step ") and "samples/s" in line]
    return statistics.median(rates[1:])


def watcher(run, port, stop):
    """Scrapes /metrics and asks `dtrun --status RUN` once a second."""
    while not stop.wait(1.0):
        try:
            get(f"http://127.0.0.1:{port}/metrics")
        except OSError:
            pass
        subprocess.run([ARGS.dtrun, "--status", run], capture_output=True)


def train(side, config, tmp):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    run = f"observe{time.monotonic_ns()}"
    if side == "torchrun 1.13":
        cmd = ["/usr/bin/python3", SHIM, "--nproc_per_node=2", "--no_python",
               "--master_port", str(free_port()), ARGS.train_cfg, config]
    else:
        cmd = [ARGS.dtrun, "--nproc-per-node=2", "--log-level=error", f"--rdzv-id={run}",
               ARGS.train_cfg, config]
    stop, thread = threading.Event(), None
    if side == "dtrun, everything on":
        port = free_port()
        cmd[2:2] = ["--hang-timeout=30", f"--metrics-port={port}"]
        env["XDG_RUNTIME_DIR"] = tmp
        thread = threading.Thread(target=watcher, args=(run, port, stop))
        thread.start()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    finally:
        stop.set()
        if thread:
            thread.join()
    if p.returncode != 0:
        sys.exit(f"{side} exited {p.returncode}: {p.stderr[-2000:]}")
    return throughput(p.stdout)


def training():
    sides = ["torchrun 1.13", "dtrun, as it comes", "dtrun, everything on"]
    with tempfile.TemporaryDirectory() as tmp:
        config = os.path.join(tmp, "observe.toml")
        with open(CONFIG) as f:  # the example, longer, logging often, no checkpoints
            text = f.read().split("[checkpoint]")[0]
        with open(config, "w") as f:
            f.write(text.replace("steps = 400", "steps = 3000").replace(
                "log_every = 50", "log_every = 250").replace("eval_every = 100",
                                                             "eval_every = 100000"))
        rates = {s: [] for s in sides}
        for _ in range(ARGS.repeat):
            for s in sides:  # the sides take turns
                rates[s].append(train(s, config, tmp))
    base = statistics.median(rates[sides[0]])
    print("| train_cfg digits DDP, 2 ranks, 3000 steps | samples/s, median (min-max) "
          "| vs torchrun |")
    print("|---|---|---|")
    for s in sides:
        print(f"| {s} | {spread(rates[s], 1, '{:.0f}')} | "
              f"{statistics.median(rates[s]) / base:.3f} |")


scrapes()
print()
training()
