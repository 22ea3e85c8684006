"""PyTorch's own restart, for restart_bench.py: the model of
examples/configs/mlp100m_ddp.toml (2048 -> 6 x 4096 -> 1000, 96.4 M
parameters, SGD with momentum) under DDP on CPU gloo, checkpointed with
torch.distributed.checkpoint (dcp.save, sync) every EVERY steps into
FOLDER/step<N>, resumed with dcp.load from the newest one whose metadata
was written. On the first attempt rank 1 SIGKILLs itself after step KILL.
Prints, as train_cfg does:
  resumed from <folder> at step N (... read in X ms)
  step N loss L
KILL 0 kills none. Rank 0 prints, or, with DCP_PRINT set, the ranks it
says (1: this one, 0: none), for node_loss_bench.py's survivor. Only the
two newest checkpoints are kept.
Usage: dcp_restart_worker.py FOLDER STEPS EVERY KILL"""
import os
import shutil
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn

from dcp_bench import mlp100m_ddp  # the same model, beside this file


def newest(folder):
    steps = []
    for name in os.listdir(folder) if os.path.isdir(folder) else []:
        if name.startswith("step") and os.path.exists(os.path.join(folder, name, ".metadata")):
            steps.append(int(name[4:]))
    return max(steps) if steps else 0


def main():
    folder, steps, every, kill = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    talk = os.environ.get("DCP_PRINT", "1" if rank == 0 else "0") == "1"
    model, opt = mlp100m_ddp()
    start = 0
    found = newest(folder)
    if found:
        t = time.perf_counter()
        # the optimizer's state exists once it stepped: one step of zeros
        # makes its buffers, which dcp.load then fills in place
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        opt.step()
        state = {"model": model.state_dict(), "optim": opt.state_dict()}
        dcp.load(state, checkpoint_id=os.path.join(folder, f"step{found}"))
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        start = found
        if talk:
            print(f"resumed from {folder} at step {found} (dcp.load; read in "
                  f"{(time.perf_counter() - t) * 1000:.1f} ms)", flush=True)
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    for step in range(start + 1, steps + 1):
        torch.manual_seed(step * 100 + rank)
        x, y = torch.randn(4, 2048), torch.randint(0, 1000, (4,))
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if talk:
            print(f"step {step} loss {loss.item():.6f}", flush=True)
        if step % every == 0:
            dcp.save({"model": model.state_dict(), "optim": opt.state_dict()},
                     checkpoint_id=os.path.join(folder, f"step{step}"))
            if rank == 0:
                shutil.rmtree(os.path.join(folder, f"step{step - 2 * every}"), ignore_errors=True)
        if rank == 1 and restart == 0 and step == kill:
            os.kill(os.getpid(), signal.SIGKILL)
    dist.destroy_process_group()


main()
