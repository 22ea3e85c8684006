"""PyTorch 2.x's FSDP2 (fully_shard) on the model, batch and optimizer of
fsdp_bench.cc: MLP 784-1024-1024-1024-10, batch 32 per rank, SGD with
momentum, gloo on CPU, one thread per rank, each Linear its own unit (as our
FSDP's default units) and the root. Run under dtrun with the root's
interpreter (scripts/torch2-python). Rank 0 prints one JSON line like
fsdp_bench's: median step time, bytes held between steps per rank
(parameter, gradient and momentum shards), peak RSS (max over ranks).

Usage: fsdp2_bench.py [fsdp|fsdp-noprefetch] [WIDTH] [BATCH]
  fsdp:            fully_shard's defaults (reshard after forward, its
                   implicit prefetch of the next unit in backward)
  fsdp-noprefetch: backward prefetch turned off (set_modules_to_backward_prefetch([]))
"""
import json
import resource
import statistics
import sys
import time

import torch
import torch.distributed as dist

try:
    from torch.distributed.fsdp import fully_shard
except ImportError:  # 2.4-2.5 keep it under _composable
    from torch.distributed._composable.fsdp import fully_shard


def mlp(width):
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(784, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
        torch.nn.ReLU(), torch.nn.Linear(width, width), torch.nn.ReLU(),
        torch.nn.Linear(width, 10))


def local_bytes(t):
    if t is None:
        return 0
    t = t.to_local() if hasattr(t, "to_local") else t
    return t.numel() * t.element_size()


def all_max(v):
    t = torch.tensor([float(v)], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "fsdp"
    width = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
    batch = int(sys.argv[3]) if len(sys.argv) > 3 else 32
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    mesh = torch.distributed.device_mesh.init_device_mesh("cpu", (dist.get_world_size(),))
    model = mlp(width)
    params = sum(p.numel() for p in model.parameters())
    units = [m for m in model if isinstance(m, torch.nn.Linear)]
    for m in units:
        fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if mode == "fsdp-noprefetch":
        for m in units:
            m.set_modules_to_backward_prefetch([])
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(batch, 784), torch.randint(0, 10, (batch,))

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    try:
        for _ in range(3):
            step()
    except Exception as e:  # report what 2.x cannot run here, in the output's format
        if dist.get_rank() == 0:
            print(json.dumps({"impl": f"torch {torch.__version__} FSDP2 {mode}",
                              "ranks": dist.get_world_size(),
                              "error": f"{type(e).__name__}: {e}"}), flush=True)
        sys.exit(1)
    times = []
    for _ in range(15):
        t = time.perf_counter()
        step()
        times.append((time.perf_counter() - t) * 1000)
    held = sum(local_bytes(p) + local_bytes(p.grad) for p in model.parameters())
    held += sum(local_bytes(s.get("momentum_buffer")) for s in opt.state.values())
    step_ms = all_max(statistics.median(times))
    held = all_max(held)
    rss = all_max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    if dist.get_rank() == 0:
        print(json.dumps({"impl": f"torch {torch.__version__} FSDP2 {mode}",
                          "ranks": dist.get_world_size(), "params": params,
                          "step_ms": round(step_ms, 2), "held_mb": round(held / 1e6, 2),
                          "peak_rss_mb": round(rss)}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
