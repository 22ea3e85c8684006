"""A checkpoint's save and load against a memcpy of the same bytes, and
against PyTorch's torch.distributed.checkpoint on the same state.

The state: examples/configs/mlp100m_ddp.toml's parameters and SGD
momentum (96.4 M parameters each, 0.77 GB of float32), as 28 tensors.
Sides, taking turns, each repeated:
  - ours (tests/bench/payload_bench.cc, one round per call): the raw
    format with XXH3 (the default) and the format before it (torch's
    archive, SHA-256); save to a folder on disk (fsync) and to a /dev/shm
    segment (memory mode), load from that segment and from the file into
    tensors already touched, and from the segment into fresh ones;
  - dcp (tests/bench/payload_bench.py --dcp, in the torch 2.6 root):
    dcp.save to the same disk and to a /dev/shm folder, dcp.load from
    each into tensors already touched (dcp loads in place), single
    process, no process group;
  - memcpy: one memcpy of all the bytes into touched memory, in the same
    call as ours.
Prints one table: medians (min-max) and each against memcpy and dcp.

Usage: payload_bench.py --bench PATH --torch2-python PATH [--dir D] [--rounds N]
       payload_bench.py --dcp DIR SHMDIR   (the dcp side, one round; JSON)"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def dcp_side(folder, shm_folder):
    import torch
    import torch.distributed.checkpoint as dcp
    torch.manual_seed(1)
    sizes = [2048] + [4096] * 6 + [1000]
    state = {}
    for i in range(len(sizes) - 1):
        for kind in ("model", "optim"):
            state[f"{kind}.{i}.weight"] = torch.randn(sizes[i + 1], sizes[i])
            state[f"{kind}.{i}.bias"] = torch.randn(sizes[i + 1])
    into = {k: torch.zeros_like(v) for k, v in state.items()}
    out = {}
    for name, where in (("disk", folder), ("shm", shm_folder)):
        shutil.rmtree(where, ignore_errors=True)
        t = time.perf_counter()
        dcp.save(state, checkpoint_id=where)
        out[f"save_{name}"] = time.perf_counter() - t
        t = time.perf_counter()
        dcp.load(into, checkpoint_id=where)
        out[f"load_{name}"] = time.perf_counter() - t
        assert all(torch.equal(into[k], state[k]) for k in state)
        shutil.rmtree(where, ignore_errors=True)
    print(json.dumps(out))


def fmt(xs):
    return f"{statistics.median(xs):.3f} s ({min(xs):.3f}-{max(xs):.3f})"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bench")
    p.add_argument("--torch2-python")
    p.add_argument("--dir", default="/var/tmp")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--dcp", nargs=2)
    a = p.parse_args()
    if a.dcp:
        dcp_side(*a.dcp)
        return
    env = dict(os.environ, OMP_NUM_THREADS="1")
    ours = {"raw": [], "torch": []}
    dcp = []
    with tempfile.TemporaryDirectory(dir=a.dir, prefix="payload-bench-") as tmp, \
            tempfile.TemporaryDirectory(dir="/dev/shm", prefix="payload-bench-") as shm:
        for _ in range(a.rounds):
            run = subprocess.run([a.bench, "--dir", tmp, "--rounds", "1"], env=env,
                                 check=True, capture_output=True, text=True)
            for line in run.stdout.splitlines():
                row = json.loads(line)
                ours[row["format"]].append(row)
            if a.torch2_python:
                # the root sees /tmp and the checkout; the disk folder is
                # the bench's build folder, on the same disk as --dir here
                folder = os.path.join(os.path.dirname(os.path.abspath(a.bench)),
                                      "dcp-payload")
                run = subprocess.run([a.torch2_python, os.path.abspath(__file__), "--dcp",
                                      folder, os.path.join(shm, "dcp")],
                                     env=env, check=True, capture_output=True, text=True)
                dcp.append(json.loads(run.stdout.strip().splitlines()[-1]))
    memcpy = [r["memcpy"] for r in ours["raw"] + ours["torch"]]
    m = statistics.median(memcpy)
    print(f"memcpy of {ours['raw'][0]['bytes'] / 1e9:.2f} GB into touched memory: {fmt(memcpy)}")
    print()
    print("| what (0.77 GB, 28 tensors) | ours, raw + XXH3 | ours, torch archive + SHA-256 (before) "
          "| dcp (torch 2.6) | raw vs memcpy | raw vs dcp |")
    print("|---|---|---|---|---|---|")
    rows = [("save to disk (fsync)", "save_disk", "save_disk"),
            ("save to /dev/shm", "save_shm", "save_shm"),
            ("load from /dev/shm into touched tensors", "load_shm", "load_shm"),
            ("load from /dev/shm into fresh tensors", "load_shm_fresh", None),
            ("load from a file in the page cache into touched tensors", "load_disk", "load_disk")]
    for label, key, dkey in rows:
        raw = [r[key] for r in ours["raw"]]
        old = [r[key] for r in ours["torch"]]
        d = [r[dkey] for r in dcp] if dkey and dcp else []
        vs_m = m / statistics.median(raw) if key.startswith("load") else None
        print(f"| {label} | {fmt(raw)} | {fmt(old) if old else '-'} | {fmt(d) if d else '-'} | "
              f"{f'{vs_m:.2f}x' if vs_m else '-'} | "
              f"{f'{statistics.median(d) / statistics.median(raw):.2f}x faster' if d else '-'} |")


main()
