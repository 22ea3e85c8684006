"""Every rank prints its place and the all_reduce sum (for the SLURM test)."""
import os
import socket

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
print(f"rank {rank} of {world} on {socket.gethostname()} group {os.environ['GROUP_RANK']}: "
      f"sum={t.item():g}", flush=True)
dist.destroy_process_group()
