"""A Python DDP worker that opts in to in-place recovery through
dtrun.in_place (in_place_test.py runs it): a small MLP, Adam, each step's
batch drawn from a generator seeded by the step and the rank; rank 1
SIGKILLs itself after step argv[1] on the first attempt (0: never). Rank 0
prints the parameters' SHA-256 at the end."""
import hashlib
import os
import signal
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import dtrun.in_place

KILL_AT, STEPS = int(sys.argv[1]), 60

torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
opt = torch.optim.Adam(net.parameters(), lr=0.01)
group = dtrun.in_place.Group()
step = group.join(0, net, opt)
model = DDP(net)
while step < STEPS:
    try:
        g = torch.Generator().manual_seed(1000 * step + group.rank)
        x, y = torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        step += 1
        group.beat(step)
        if group.rank == 1 and step == KILL_AT and group.attempt == 0:
            os.kill(os.getpid(), signal.SIGKILL)
    except RuntimeError as e:
        step = group.regroup(e, step, net, opt)
        model = DDP(net)
if group.rank == 0:
    params = b"".join(p.detach().numpy().tobytes() for p in net.parameters())
    print("params_sha256=" + hashlib.sha256(params).hexdigest(), flush=True)
dist.destroy_process_group()
