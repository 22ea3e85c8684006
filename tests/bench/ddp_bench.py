"""PyTorch's Python DDP (gloo) on the same MLP and batch as ddp_bench.cc,
launched by dtrun: Debian's torch 1.13 (--python /usr/bin/python3) or torch
2.6 in the root of scripts/torch2.sh (--python scripts/torch2-python, with
dtrun's torch shim on PYTHONPATH). Rank 0 prints the same JSON line."""
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(784, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
        torch.nn.ReLU(), torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
        torch.nn.Linear(1024, 10))


def median_ms(warmup, reps, fn):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def main():
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    x, y = torch.randn(64, 784), torch.randint(0, 10, (64,))
    model = DDP(mlp())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    local = mlp()
    local_opt = torch.optim.SGD(local.parameters(), lr=0.01)

    def compute():
        local_opt.zero_grad()
        torch.nn.functional.cross_entropy(local(x), y).backward()
        local_opt.step()

    flat = torch.zeros(sum(p.numel() for p in local.parameters()))
    s = median_ms(5, 30, step)
    c = median_ms(5, 30, compute)
    a = median_ms(3, 20, lambda: dist.all_reduce(flat))
    hidden = min(1.0, max(0.0, (c + a - s) / a))
    if dist.get_rank() == 0:
        print(json.dumps({"impl": f"PyTorch {torch.__version__} Python DDP",
                          "step_ms": round(s, 2), "compute_ms": round(c, 2),
                          "allreduce_ms": round(a, 2), "hidden": round(hidden, 3)}), flush=True)
    dist.barrier()
    # torch 1.13 on Python 3.11 can deadlock tearing down DDP's process group
    # at interpreter exit (a gloo thread waits for the GIL the joiner holds).
    os._exit(0)


if __name__ == "__main__":
    main()
