"""A Python DDP training worker (gloo) that checkpoints and resumes, as a
user's would: the restart tests and tests/bench/py_restart_bench.py run it.

  py_train_worker.py CKPT_DIR STEPS [--width N] [--layers N] [--kill-at STEP]
                     [--kill-when FILE] [--sleep S]

Each step trains on data drawn from the step number alone, so a run that
resumes from a checkpoint ends bitwise equal to one that never stopped.
Rank 0 saves the model and optimizer to CKPT_DIR after every step
(torch.save to a temporary, then rename). On the first attempt, rank 1
SIGKILLs itself right after step --kill-at was saved (once FILE exists, with
--kill-when). Every rank beats to
DTRUN_HEARTBEAT_FILE and writes the resume record dtrun's recovery report
reads (apps/dtrun/README.md). Rank 0 prints `step N UNIXTIME` per step
and, at the end, `params_sha256=<hex>`.
"""
import argparse
import hashlib
import os
import signal
import time

import torch
import torch.distributed as dist


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("ckpt_dir")
    p.add_argument("steps", type=int)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--kill-at", type=int, default=-1)
    p.add_argument("--kill-when", help="at --kill-at, wait for this file to exist first")
    p.add_argument("--sleep", type=float, default=0.0, help="seconds per step, after it")
    return p.parse_args()


def model_of(args):
    torch.manual_seed(0)
    layers = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers)


def batch(step, args):
    g = torch.Generator().manual_seed(1000 + step * 7 + dist.get_rank())
    return torch.randn(32, args.width, generator=g), torch.randn(32, args.width, generator=g)


def resume(path, model, opt):
    """(step to start at, source)."""
    if not os.path.exists(path):
        return 0, "none"
    state = torch.load(path)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    return state["step"] + 1, "disk"


def save(path, model, opt, step):
    tmp = path + ".tmp"
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
    os.replace(tmp, path)


def main():
    args = parse()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = model_of(args)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    set_up_at = time.time()
    path = os.path.join(args.ckpt_dir, "ckpt.pt")
    start, source = resume(path, model, opt)
    beat_file = os.environ.get("DTRUN_HEARTBEAT_FILE")
    if beat_file:
        with open(beat_file + ".resume", "w") as f:
            f.write("%d %s %.6f %.6f\n" % (start, source, set_up_at, time.time()))
        hb = os.open(beat_file, os.O_WRONLY | os.O_CREAT)
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    for step in range(start, args.steps):
        x, y = batch(step, args)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
        if rank == 0:
            save(path, model, opt, step)
        dist.barrier()  # the checkpoint of `step` is there for every rank
        if beat_file:
            os.pwrite(hb, b"%d 0 %d\n" % (step + 1, args.steps), 0)
        if rank == 0:
            print("step %d %.6f" % (step, time.time()), flush=True)
        if first_attempt and rank == 1 and step == args.kill_at:
            while args.kill_when and not os.path.exists(args.kill_when):
                time.sleep(0.01)
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(args.sleep)
    if rank == 0:
        h = hashlib.sha256()
        for t in model.state_dict().values():
            h.update(t.detach().contiguous().numpy().tobytes())
        print("params_sha256=%s" % h.hexdigest(), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
