"""nanoGPT's own train.py beside train_cfg's GPT: same data, same config,
same machine, 2 ranks on CPU gloo.

The CPU line of nanoGPT's README (config/train_shakespeare_char.py with 4
layers, 4 heads, 128 wide, 64 tokens, batch 12, no dropout) on the
tiny-shakespeare text: nanoGPT's train.py (the fetched source, patched only
mechanically for CPU ranks: a rank's device is the CPU, DDP without
device_ids, and the seed read from NANOGPT_SEED) under torchrun 1.13
(through torchrun_shim.py), and train_cfg (examples/configs/
shakespeare_char_cpu.toml) under dtrun, alternating, with the same BLAS and
one thread per rank. nanoGPT's gradient_accumulation_steps=2 is 1 per rank
on 2 ranks, so both step 2 x 12 windows of 64 tokens per iteration.

Prints the validation loss at each evaluation (mean and spread over the
seeds) and the median ms per iteration (evaluation iterations left out).
"nanoGPT+malloc" is nanoGPT given, through GLIBC_TUNABLES, the malloc
settings train_cfg makes for itself (lib/trainer.cc, KeepFreedMemory).
  python3 tests/bench/gpt_bench.py --text input.txt --nanogpt DIR
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
ROOT = os.path.dirname(os.path.dirname(HERE))
SHIM = os.path.join(HERE, "torchrun_shim.py")
PY = "/usr/bin/python3"  # Debian's, with torch 1.13

PATCHES = [  # (what, into): the CPU patch, each applied exactly once
    ("    device = f'cuda:{ddp_local_rank}'\n    torch.cuda.set_device(device)\n",
     "    device = 'cpu'\n"),
    ("model = DDP(model, device_ids=[ddp_local_rank])",
     "model = DDP(model)"),
    ("torch.manual_seed(1337 + seed_offset)",
     "torch.manual_seed(int(os.environ.get('NANOGPT_SEED', '1337')) + seed_offset)"),
]


def prepare_nanogpt(src, text, work):
    tree = os.path.join(work, "nanogpt")
    shutil.copytree(src, tree, ignore=shutil.ignore_patterns(".git"))
    path = os.path.join(tree, "train.py")
    code = open(path).read()
    for what, into in PATCHES:
        if code.count(what) != 1:
            sys.exit(f"gpt_bench: nanoGPT's train.py changed: {what!r} not found once")
        code = code.replace(what, into)
    open(path, "w").write(code)
    data = os.path.join(tree, "data", "shakespeare_char")
    shutil.copy(text, os.path.join(data, "input.txt"))
    subprocess.run([PY, "prepare.py"], cwd=data, check=True,
                   stdout=subprocess.DEVNULL)
    return tree


def env_for(blas):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    if blas:
        env["LD_LIBRARY_PATH"] = blas
    return env


# What train_cfg sets with mallopt (lib/trainer.cc, KeepFreedMemory), given
# to nanoGPT through glibc's tunables: the side "nanoGPT+malloc".
TUNABLES = "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=1073741824"


def run_nanogpt(tree, args, seed, out, tunables=False):
    cmd = [PY, SHIM, "--standalone", "--nproc_per_node=2", "train.py",
           "config/train_shakespeare_char.py", "--device=cpu", "--compile=False",
           f"--eval_iters={args.eval_iters}", "--log_interval=1", "--block_size=64",
           "--batch_size=12", "--n_layer=4", "--n_head=4", "--n_embd=128",
           f"--max_iters={args.iters}", f"--lr_decay_iters={args.iters}",
           "--dropout=0.0", "--backend=gloo", "--dtype=float32",
           "--gradient_accumulation_steps=2", f"--out_dir={out}"]
    env = env_for(args.blas)
    env["NANOGPT_SEED"] = str(seed)
    if tunables:
        env["GLIBC_TUNABLES"] = TUNABLES
    p = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"gpt_bench: nanoGPT failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    val = {int(m.group(1)): float(m.group(2)) for m in re.finditer(
        r"step (\d+): train loss [\d.]+, val loss ([\d.]+)", p.stdout)}
    times = [float(m.group(2)) for m in re.finditer(
        r"iter (\d+): loss [\d.]+, time ([\d.]+)ms", p.stdout)
        if int(m.group(1)) % 250 != 0 and int(m.group(1)) > 10]
    return val, statistics.median(times)


def run_ours(args, seed, strategy, ckpt):
    dtrun = os.path.join(args.build, "apps", "dtrun")
    cfg = os.path.join(ROOT, "examples", "configs", "shakespeare_char_cpu.toml")
    cmd = [dtrun, "--nproc-per-node=2", "--log-level=error",
           os.path.join(args.build, "examples", "train_cfg"), cfg,
           "--set", f"data.path=\"{os.path.abspath(args.text)}\"",
           "--set", f"train.seed={seed}", "--set", f"train.steps={args.iters}",
           "--set", f"schedule.decay_steps={args.iters}",
           "--set", f"train.eval_iters={args.eval_iters}",
           "--set", "train.log_every=10", "--set", f"strategy.type=\"{strategy}\"",
           "--set", f"checkpoint.dir=\"{ckpt}\"", "--set", f"checkpoint.every={args.iters}"]
    p = subprocess.run(cmd, env=env_for(args.blas), capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"gpt_bench: train_cfg failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    val = {int(m.group(1)): float(m.group(2)) for m in re.finditer(
        r"step (\d+) val_loss ([\d.]+)", p.stdout)}
    rates = [float(m.group(2)) for m in re.finditer(
        r"step (\d+) loss [\d.]+ lr [\d.]+ samples/s (\d+)", p.stdout)]
    ms = [2 * 12 / r * 1000 for r in rates[1:] if r > 0]
    return val, statistics.median(ms)


def spread(xs):
    return f"{statistics.mean(xs):.4f} ({min(xs):.4f}-{max(xs):.4f})"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--text", required=True, help="tiny-shakespeare input.txt")
    ap.add_argument("--nanogpt", required=True, help="nanoGPT's source tree")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--eval-iters", type=int, default=20)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1337, 1338, 1339])
    ap.add_argument("--strategies", nargs="+", default=["ddp", "fsdp"])
    ap.add_argument("--no-malloc-side", action="store_true",
                    help="leave out nanoGPT+malloc (nanoGPT given our malloc settings)")
    ap.add_argument("--blas", default="/usr/lib/x86_64-linux-gnu/openblas-pthread",
                    help="a folder with libblas.so.3 for both sides ('' : the system's)")
    args = ap.parse_args()
    if args.blas and not os.path.exists(os.path.join(args.blas, "libblas.so.3")):
        sys.exit(f"gpt_bench: no libblas.so.3 in {args.blas} (install libopenblas0-pthread, or --blas '')")
    work = tempfile.mkdtemp(prefix="gpt-bench-")
    try:
        tree = prepare_nanogpt(args.nanogpt, args.text, work)
        nano = ["nanoGPT"] + ([] if args.no_malloc_side else ["nanoGPT+malloc"])
        curves = {s: [] for s in nano + args.strategies}
        ms = {s: [] for s in curves}
        for seed in args.seeds:
            for side in curves:  # alternating, seed by seed
                t0 = time.time()
                if side.startswith("nanoGPT"):
                    val, m = run_nanogpt(tree, args, seed, os.path.join(work, f"out{seed}"),
                                         tunables=side.endswith("malloc"))
                else:
                    val, m = run_ours(args, seed, side, os.path.join(work, f"ck-{side}-{seed}"))
                curves[side].append(val)
                ms[side].append(m)
                print(f"seed {seed} {side}: val_loss at {args.iters} {val.get(args.iters)}, "
                      f"{m:.1f} ms/iter ({time.time() - t0:.0f} s)", flush=True)
        steps = sorted(set.intersection(*[set(v) for c in curves.values() for v in c]))
        print("\n| iteration | " + " | ".join(f"{s}: val loss" for s in curves) + " |")
        print("|---|" + "---|" * len(curves))
        for st in steps:
            print(f"| {st} | " + " | ".join(spread([v[st] for v in curves[s]]) for s in curves) + " |")
        print("\n| side | ms/iteration (median of seeds' medians) | / nanoGPT |")
        print("|---|---|---|")
        base = statistics.median(ms["nanoGPT"])
        for s in curves:
            m = statistics.median(ms[s])
            print(f"| {s} | {m:.1f} ({min(ms[s]):.1f}-{max(ms[s]):.1f}) | {m / base:.2f} |")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
