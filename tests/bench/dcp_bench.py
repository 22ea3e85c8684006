"""PyTorch's own checkpoints beside train_cfg's: one rank of an MLP of the
same size as examples/configs/mlp100m_ddp.toml (2048 -> 6 x 4096 -> 1000,
96.4 M parameters, SGD with momentum, DDP on CPU gloo), under dtrun, saving
with torch.distributed.checkpoint every CHECKPOINT_EVERY steps: `dcp.save`
(sync) or `dcp.async_save` (torch 2.6; the call returns once the state is
staged in memory). Rank 0 prints, per checkpoint, how long the loop waited,
as train_cfg does:
  checkpoint step N: training waited X ms (dcp.save|dcp.async_save)
async-copy: dcp.async_save of a copy of the state made first (every tensor
cloned). Plain async_save on CPU tensors stages nothing (torch 2.6's
BlockingAsyncStager.stage -> _offload_state_dict_to_cpu -> .to("cpu"), the
same tensors), so its thread writes tensors the loop is changing; its own
copying stager (FileSystemWriter(cache_staged_state_dict=True)) pins memory,
which needs an accelerator ("Cannot access accelerator device when none is
available" on this CPU-only build).
Usage: dcp_bench.py sync|async|async-copy DIR [STEPS] [EVERY]"""
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.utils._pytree import tree_map


def mlp100m_ddp():
    """examples/configs/mlp100m_ddp.toml's model under PyTorch's DDP (96.4 M
    parameters), and its SGD with momentum (0.77 GB of state)."""
    torch.manual_seed(7)
    sizes = [2048] + [4096] * 6
    layers = []
    for a, b in zip(sizes, sizes[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    model = nn.parallel.DistributedDataParallel(nn.Sequential(*layers, nn.Linear(4096, 1000)))
    return model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def main():
    mode, folder = sys.argv[1], sys.argv[2]
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 16
    every = int(sys.argv[4]) if len(sys.argv) > 4 else 8
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model, opt = mlp100m_ddp()
    # async_save's thread runs collectives of its own: on the group the
    # loop's DDP all-reduces use, the two interleave and deadlock (seen:
    # its gather_object against the backward's all-reduce). A group of its
    # own, as PyTorch's documentation says.
    ckpt_group = dist.new_group(backend="gloo")
    pending = None
    for step in range(1, steps + 1):
        x, y = torch.randn(4, 2048), torch.randint(0, 1000, (4,))
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if step % every:
            continue
        start = time.perf_counter()
        if pending is not None:
            pending.result()  # one save at a time, as train_cfg's
        state = {"model": model.state_dict(), "optim": opt.state_dict()}
        where = os.path.join(folder, f"step{step}")
        if mode == "async":
            pending = dcp.async_save(state, checkpoint_id=where, process_group=ckpt_group)
        elif mode == "async-copy":
            copy = tree_map(lambda v: v.clone() if isinstance(v, torch.Tensor) else v, state)
            pending = dcp.async_save(copy, checkpoint_id=where, process_group=ckpt_group)
        else:
            dcp.save(state, checkpoint_id=where, process_group=ckpt_group)
        waited = (time.perf_counter() - start) * 1000
        if rank == 0:
            print(f"checkpoint step {step}: training waited {waited:.1f} ms "
                  f"(dcp.{'save' if mode == 'sync' else 'async_save'}, {mode})", flush=True)
    if pending is not None:
        pending.result()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
