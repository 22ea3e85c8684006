"""bf16 against float32 on the CPU: train_cfg's DDP and FSDP (train.precision)
beside PyTorch's Python DDP under torch.autocast, the same MLP (784-1024x3-10,
2.9 M parameters), batch 64 per rank, 2 ranks on gloo, one thread each, all
launched by dtrun, the runs alternating. Each figure is samples/s over steps
21-60 (the first 20 warm up), the whole step as the trainer times it.

    python3 tests/bench/precision_bench.py --build build [--rounds 3]

Under dtrun with --worker fp32|bf16 it is PyTorch's side: rank 0 prints
{"samples_per_s": ...}."""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
BATCH, WARMUP, TIMED = 64, 20, 40


def worker(precision):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(
        torch.nn.Linear(784, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
        torch.nn.ReLU(), torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
        torch.nn.Linear(1024, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(BATCH, 784), torch.randint(0, 10, (BATCH,))

    def step():
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()  # train_cfg all-reduces its loss each step

    for _ in range(WARMUP):
        step()
    start = time.perf_counter()
    for _ in range(TIMED):
        step()
    rate = TIMED * BATCH * dist.get_world_size() / (time.perf_counter() - start)
    if dist.get_rank() == 0:
        print(json.dumps({"samples_per_s": rate}), flush=True)
    dist.barrier()
    os._exit(0)  # torch 1.13 on Python 3.11 can hang tearing gloo down


def ours(build, strategy, precision):
    dtrun = os.path.join(build, "apps", "dtrun")
    cmd = [dtrun, "--nproc-per-node=2", "--log-level=error",
           os.path.join(build, "examples", "train_cfg"),
           os.path.join(ROOT, "examples", "configs", "digits_ddp.toml")]
    for s in [f'strategy.type="{strategy}"', 'data.source="synthetic"', "data.features=784",
              "data.classes=10", "data.samples=8192", "model.hidden=[1024, 1024, 1024]",
              f"train.batch_size={BATCH}", f"train.steps={WARMUP + TIMED}",
              f"train.log_every={WARMUP}", "train.eval_every=0", 'checkpoint.dir=""',
              f'train.precision="{precision}"']:
        cmd += ["--set", s]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    rates = [float(r) for r in re.findall(r"samples/s (\d+)", out)]
    # the windows after the first, weighted alike (each is 20 steps)
    return statistics.mean(rates[1:])


def pytorch(build, precision):
    dtrun = os.path.join(build, "apps", "dtrun")
    out = subprocess.run([dtrun, "--nproc-per-node=2", "--log-level=error", "--python",
                          "/usr/bin/python3", os.path.abspath(__file__), "--worker", precision],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])["samples_per_s"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default="build")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--worker", choices=["fp32", "bf16"])
    a = p.parse_args()
    if a.worker:
        worker(a.worker)
        return
    sides = [("ours DDP", lambda pr: ours(a.build, "ddp", pr)),
             ("ours FSDP", lambda pr: ours(a.build, "fsdp", pr)),
             ("PyTorch DDP", lambda pr: pytorch(a.build, pr))]
    rates = {(name, pr): [] for name, _ in sides for pr in ("fp32", "bf16")}
    for r in range(a.rounds):
        for name, run in sides:
            for pr in (("fp32", "bf16") if r % 2 == 0 else ("bf16", "fp32")):
                rates[(name, pr)].append(run(pr))
                print(f"round {r + 1}: {name} {pr}: {rates[(name, pr)][-1]:.0f} samples/s",
                      file=sys.stderr, flush=True)
    print("| side | fp32 samples/s | bf16 samples/s | bf16 / fp32 | vs PyTorch DDP (same precision) |")
    print("|---|---:|---:|---:|---:|")
    med = {k: statistics.median(v) for k, v in rates.items()}
    spread = {k: f"{min(v):.0f}-{max(v):.0f}" for k, v in rates.items()}
    for name, _ in sides:
        f, b = med[(name, "fp32")], med[(name, "bf16")]
        vs = (f"{f / med[('PyTorch DDP', 'fp32')]:.2f} / {b / med[('PyTorch DDP', 'bf16')]:.2f}")
        print(f"| {name} | {f:.0f} ({spread[(name, 'fp32')]}) | {b:.0f} ({spread[(name, 'bf16')]}) "
              f"| {b / f:.1f}x | {vs} |")


if __name__ == "__main__":
    main()
