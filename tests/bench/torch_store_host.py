"""torch's own TCPStore server for fanin_bench, from whichever torch runs
this script (scripts/torch2-python: the trixie root's 2.6): prints
"listening on 127.0.0.1:PORT" and serves until it is killed. The libuv
server where this torch has it, else the one before it (Debian's 2.6 is
built without libuv); the first line of stderr says which."""
import datetime
import sys
import time

import torch
import torch.distributed as dist


def serve():
    for libuv in (True, False):
        try:
            store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                  timeout=datetime.timedelta(seconds=600), use_libuv=libuv)
        except Exception:  # noqa: BLE001 - no libuv in this build: the other server
            continue
        print(f"torch {torch.__version__} TCPStore server, libuv={libuv}", file=sys.stderr,
              flush=True)
        return store
    sys.exit("no TCPStore server could be started")


store = serve()
print(f"listening on 127.0.0.1:{store.port}", flush=True)
while True:
    time.sleep(3600)
