"""One rank of a gloo all_reduce through the store at MASTER_ADDR:MASTER_PORT.

Run one process per rank with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT
set (dtrun sets them; so does torchrun). Each rank contributes rank + 1 in
every element; rank 0 prints the sum and every rank exits 1 if it is wrong.
"""
import os
import sys

import torch
import torch.distributed as dist


def main() -> int:
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.full((1024,), float(rank + 1))
    dist.all_reduce(t)
    expected = world * (world + 1) / 2
    ok = bool(torch.all(t == expected))
    if rank == 0:
        print(f"all_reduce over {world} ranks: sum={t[0].item():g} "
              f"expected={expected:g} {'OK' if ok else 'WRONG'}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
