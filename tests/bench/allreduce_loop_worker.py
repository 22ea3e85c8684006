"""Benchmark worker: joins a gloo process group, writes the time it did to
$STAMP_DIR/start_<RANK>_<TORCHELASTIC_RESTART_COUNT> (ns), then all-reduces
a small tensor every 50 ms for $LOOP_S seconds: a peer's death fails it at
its next collective, as in training."""
import os
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
name = f"start_{os.environ['RANK']}_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
path = os.path.join(os.environ["STAMP_DIR"], name)
with open(path + ".tmp", "w") as f:
    f.write(str(time.time_ns()))
os.rename(path + ".tmp", path)
with open(os.path.join(os.environ["STAMP_DIR"], f"pid_{os.environ['RANK']}_"
                       f"{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"), "w") as f:
    f.write(str(os.getpid()))
t = torch.ones(4)
end = time.time() + float(os.environ.get("LOOP_S", "120"))
while time.time() < end:
    dist.all_reduce(t)
    time.sleep(0.05)
dist.destroy_process_group()
