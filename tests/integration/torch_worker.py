"""A Python torch worker for dtrun's integration tests.

  torch_worker.py env OUT_DIR        dump the environment (and "torch.__version__") to
                                     OUT_DIR/env_<RANK>.json
  torch_worker.py allreduce          gloo all_reduce; exit 1 if the sum is wrong
  torch_worker.py fail-once DIR      all_reduce; rank 1 raises on the first attempt
  torch_worker.py always-fail        rank 0 raises (with an error file) every time
  torch_worker.py hang PID_DIR       write PID_DIR/pid_<RANK>_<RESTART>, then barrier forever
  torch_worker.py grow N             all_reduce; below N ranks wait to be restarted, at N exit
"""
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


def all_reduce_ok():
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    t = torch.full((256,), float(dist.get_rank() + 1))
    dist.all_reduce(t)
    ok = bool(torch.all(t == world * (world + 1) / 2))
    if dist.get_rank() == 0:
        print(f"sum={t[0].item():g} attempt={os.environ['TORCHELASTIC_RESTART_COUNT']} "
              f"{'OK' if ok else 'WRONG'}", flush=True)
    dist.destroy_process_group()
    return ok


@record
def main():
    mode = sys.argv[1]
    rank = os.environ["RANK"]
    if mode == "env":
        with open(os.path.join(sys.argv[2], f"env_{rank}.json"), "w") as f:
            json.dump(dict(os.environ, **{"torch.__version__": torch.__version__}), f)
    elif mode == "allreduce":
        sys.exit(0 if all_reduce_ok() else 1)
    elif mode == "fail-once":
        marker = os.path.join(sys.argv[2], "failed")
        if rank == "1" and not os.path.exists(marker):
            open(marker, "w").close()
            raise RuntimeError("simulated crash on rank 1")
        sys.exit(0 if all_reduce_ok() else 1)
    elif mode == "always-fail":
        if rank == "0":
            raise ValueError("rank 0 always fails")
        time.sleep(60)
    elif mode == "hang":
        restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
        # Whole or absent, as fake_worker's: a hidden temporary, then a
        # rename (the test reads the folder while workers start).
        final = os.path.join(sys.argv[2], f"pid_{rank}_{restart}")
        temp = os.path.join(sys.argv[2], f".pid_{rank}_{restart}")
        with open(temp, "w") as f:
            f.write(str(os.getpid()))
        os.rename(temp, final)
        dist.init_process_group("gloo")
        while True:
            time.sleep(1)
    elif mode == "grow":
        ok = all_reduce_ok()
        if int(os.environ["WORLD_SIZE"]) < int(sys.argv[2]):
            time.sleep(300)  # the launcher restarts this group once more nodes join
            sys.exit(1)
        sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
