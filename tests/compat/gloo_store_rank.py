"""One gloo rank whose process group meets through a TCPStore client made
here for the store at MASTER_ADDR:MASTER_PORT (init_process_group(store=)),
the way to reach an outside store with torch 2.6 as Debian ships it: its
env:// client for the agent store asks for libuv, which that build lacks.
Gathers every rank and broadcasts from the last one; exits 1 when wrong.
GLOO_STORE_PREFIX names the keys, so that a second try on the same store
never reads the addresses of the first."""
import os
import sys

import torch
import torch.distributed as dist

from dtstore_proc import tcp_store


def main() -> int:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = tcp_store(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                      world, timeout=60)
    prefix = os.environ.get("GLOO_STORE_PREFIX", "gloo_store_rank")
    dist.init_process_group("gloo", store=dist.PrefixStore(prefix, store),
                            rank=rank, world_size=world)
    gathered = [torch.zeros(1) for _ in range(world)]
    dist.all_gather(gathered, torch.tensor([float(rank)]))
    flag = torch.tensor([float(rank == world - 1)])
    dist.broadcast(flag, src=world - 1)
    ok = [t.item() for t in gathered] == list(range(world)) and flag.item() == 1
    print(f"rank {rank}: gathered {[int(t.item()) for t in gathered]} "
          f"{'OK' if ok else 'WRONG'}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
