"""What a checkpoint costs the training loop, on a model whose checkpoint
costs something: examples/configs/mlp100m_{ddp,fsdp}.toml (96.4 M
parameters, SGD momentum: 0.77 GB of state), 2 ranks, CPU gloo, under dtrun.
Per side, the loop's wait at the first checkpoint (step 8; nothing else in
flight), the run's wall time (16 steps, checkpoints at 8 and 16) and its
peak RSS (the largest worker's, from getrusage of a wrapper) and the most
shared memory its checkpoint copies held (/dev/shm/dtrun-*-ckpt-*, sampled
every 20 ms). Sides: train_cfg sync, async and memory for DDP and FSDP
(memory: the step-8 copy to shared memory only, step 16's to disk too), and, with --torch2-python, PyTorch 2.6's
own dcp.save and dcp.async_save on the same model (tests/bench/dcp_bench.py,
DDP; async_save as it comes, which copies nothing on CPU, and of a clone of
the state, which is what a consistent snapshot costs there). The sides take
turns, repeated; medians and spread.

Usage: checkpoint_bench.py --dtrun PATH --train-cfg PATH [--repeat N]
                           [--torch2-python PATH --torch2-shim DIR]"""
import argparse
import glob
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = os.path.join(HERE, "..", "..", "examples", "configs")
WAITED = re.compile(r"checkpoint step 8: training waited ([\d.]+) ms")

p = argparse.ArgumentParser()
p.add_argument("--dtrun", required=True)
p.add_argument("--train-cfg", required=True)
p.add_argument("--repeat", type=int, default=3)
p.add_argument("--torch2-python")
p.add_argument("--torch2-shim")
ARGS = p.parse_args()

# Runs a command and prints, as the last line, the peak RSS (KiB) of its
# largest descendant: RUSAGE_CHILDREN's ru_maxrss is the largest of any
# process waited for below it.
WRAP = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
        "print('maxrss_kib', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); "
        "sys.exit(r.returncode)")


def shm_bytes():
    total = 0
    for path in glob.glob("/dev/shm/dtrun-*-ckpt-*"):
        try:
            total += os.stat(path).st_size
        except FileNotFoundError:
            pass
    return total


def run(cmd, env=None):
    start = time.monotonic()
    p = subprocess.Popen(["/usr/bin/python3", "-c", WRAP, *cmd], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    peak = [0]
    stop = threading.Event()

    def sample():
        while not stop.wait(0.02):
            peak[0] = max(peak[0], shm_bytes())
    sampler = threading.Thread(target=sample)
    sampler.start()
    out, err = p.communicate(timeout=900)
    stop.set()
    sampler.join()
    wall = time.monotonic() - start
    if p.returncode != 0:
        sys.exit(f"{cmd} exited {p.returncode}: {err[-2000:]}")
    waited = float(WAITED.search(out).group(1))
    rss = int(out.rsplit("maxrss_kib", 1)[1].split()[0]) / 1024
    return waited, wall, rss, peak[0] / 2**20


def sides(tmp):
    out = {}
    for strategy in ("ddp", "fsdp"):
        for mode in ("sync", "async", "memory"):
            folder = os.path.join(tmp, f"{strategy}-{mode}")
            out[f"train_cfg {strategy.upper()}, {mode}"] = (
                [ARGS.dtrun, "--nproc-per-node=2", "--log-level=error", ARGS.train_cfg,
                 os.path.join(CONFIGS, f"mlp100m_{strategy}.toml"),
                 "--set", f'checkpoint.dir="{folder}"', "--set", f'checkpoint.mode="{mode}"',
                 "--set", "train.steps=16", "--set", "checkpoint.every=8",
                 "--set", "train.log_every=8",
                 *(["--set", "checkpoint.persist_every=2"] if mode == "memory" else [])],
                None, folder)
    if ARGS.torch2_python:
        env = dict(os.environ, PYTHONPATH=ARGS.torch2_shim, OMP_NUM_THREADS="1")
        for mode, name in (("sync", "dcp.save"), ("async", "dcp.async_save (no copy)"),
                           ("async-copy", "dcp.async_save of a clone")):
            folder = os.path.join(tmp, f"dcp-{mode}")
            out[f"PyTorch 2.6 DDP, {name}"] = (
                [ARGS.dtrun, "--nproc-per-node=2", "--log-level=error",
                 "--python", ARGS.torch2_python, os.path.join(HERE, "dcp_bench.py"), mode,
                 folder, "16", "8"], env, folder)
    return out


def main():
    with tempfile.TemporaryDirectory(dir=os.environ.get("DTRUN_BENCH_TMP", "/tmp")) as tmp:
        table = sides(tmp)
        got = {name: [] for name in table}
        for _ in range(ARGS.repeat):
            for name, (cmd, env, folder) in table.items():  # the sides take turns
                shutil.rmtree(folder, ignore_errors=True)
                got[name].append(run(cmd, env))
                shutil.rmtree(folder, ignore_errors=True)
    print("| side (2 ranks, 96.4 M parameters) | loop's wait at a checkpoint, median (min-max) "
          "| vs its sync | run of 16 steps, 2 checkpoints | peak RSS of a worker "
          "| copies in /dev/shm, most at once |")
    print("|---|---|---|---|---|---|")
    base = {}
    for name, runs in got.items():
        waited = [r[0] for r in runs]
        med = statistics.median(waited)
        kind = name.rsplit(",", 1)[0]
        if name.endswith(", sync") or name.endswith("dcp.save"):
            base[kind] = med
        ratio = f"{med / base[kind]:.3f}" if kind in base else "-"
        walls = [r[1] for r in runs]
        print(f"| {name} | {med:.0f} ms ({min(waited):.0f}-{max(waited):.0f}) | {ratio} "
              f"| {statistics.median(walls):.1f} s ({min(walls):.1f}-{max(walls):.1f}) "
              f"| {max(r[2] for r in runs):.0f} MiB | {max(r[3] for r in runs):.0f} MiB |")
    print(json.dumps({k: v for k, v in got.items()}), file=sys.stderr)


main()
