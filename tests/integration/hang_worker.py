"""Workers for dtrun's hang tests: beat with the standard library, then wedge.

usage: hang_worker.py MODE [ARGS]
  wedge STEPS HUNG_RANK HUNG_STEP   beat each step; HUNG_RANK sleeps in wedged()
                                    at HUNG_STEP on the first attempt
  silent SECONDS_RANK0              never beat; rank 0 exits after SECONDS,
                                    others sleep forever
  env                               print the hang variables dtrun set
  collective HUNG_STEP              gloo all_reduce each step; rank 1 sleeps in
                                    diverged() before HUNG_STEP's beat
  after HUNG_STEP SLEEPER           gloo all_reduce each step, then the beat;
                                    SLEEPER sleeps in diverged() before
                                    HUNG_STEP's all_reduce, so every rank's
                                    last beat is HUNG_STEP - 1
  crash STEP GROWTH                  beat each step, rank 1 exits 1 after STEP +
                                    GROWTH x attempt (GROWTH 0: the same step
                                    every attempt, a crash loop)
  progress STEPS                    beat "<step> <compute> STEPS" every 20 ms,
                                    print a line a step (every 10th also to
                                    stderr)
  timer                             torch's FileTimerClient: expires(after=1)
                                    around a sleep in stuck_here()
"""
import os
import sys
import time

RANK = int(os.environ.get("RANK", "0"))
ATTEMPT = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
BEAT_FILE = os.environ.get("DTRUN_HEARTBEAT_FILE")
# The documented beat: open once, one pwrite per step.
hb = os.open(BEAT_FILE, os.O_WRONLY | os.O_CREAT) if BEAT_FILE else None


def beat(step):
    if hb is None:
        return
    os.pwrite(hb, b"%d\n" % step, 0)
    if "BEAT_LOG" in os.environ:  # when the test measures detection latency
        with open(os.environ["BEAT_LOG"] + f".{RANK}.{ATTEMPT}", "w") as f:
            f.write(f"{time.time()} {step}\n")


def wedged():
    time.sleep(3600)


def diverged():
    time.sleep(3600)


def stuck_here():
    time.sleep(3600)


def wedge(steps, hung_rank, hung_step):
    for step in range(steps):
        beat(step)
        time.sleep(0.05)
        if ATTEMPT == 0 and RANK == hung_rank and step == hung_step:
            wedged()
    print(f"finished rank {RANK} attempt {ATTEMPT}", flush=True)


def silent(seconds):
    time.sleep(seconds if RANK == 0 else 3600)
    print(f"finished rank {RANK}", flush=True)


def collective(hung_step):
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.ones(4)
    for step in range(hung_step + 3):
        if ATTEMPT == 0 and RANK == 1 and step == hung_step:
            diverged()
        beat(step)
        dist.all_reduce(t)
    if hb is not None:
        os.pwrite(hb, b"done\n", 0)  # teardown may be slow: stop watching
    dist.destroy_process_group()
    print(f"finished rank {RANK} attempt {ATTEMPT}", flush=True)


def after(hung_step, sleeper):
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.ones(4)
    for step in range(hung_step + 3):
        if ATTEMPT == 0 and RANK == sleeper and step == hung_step:
            diverged()
        dist.all_reduce(t)
        beat(step)
    if hb is not None:
        os.pwrite(hb, b"done\n", 0)
    dist.destroy_process_group()
    print(f"finished rank {RANK} attempt {ATTEMPT}", flush=True)


def crash(step, growth):
    last = step + growth * ATTEMPT
    for s in range(last + 1):
        beat(s)
        time.sleep(0.01)
    if RANK == 1:
        sys.exit(1)
    time.sleep(3600)  # stopped by dtrun when rank 1 fails


def progress(steps):
    for step in range(1, steps + 1):
        time.sleep(0.02)
        os.pwrite(hb, b"%d 0.020000 %d\n" % (step, steps), 0)
        print(f"rank {RANK} line {step}", flush=True)
        if step % 10 == 0:
            print(f"rank {RANK} err {step}", file=sys.stderr, flush=True)


def timer():
    from torch.distributed.elastic import timer as tt
    tt.configure(tt.FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
    with open(os.environ["BEAT_LOG"] + ".timer", "w") as f:
        f.write(repr(time.time()))
    with tt.expires(after=1):
        if ATTEMPT == 0:
            stuck_here()
    print(f"finished rank {RANK} attempt {ATTEMPT}", flush=True)


def main():
    mode = sys.argv[1]
    args = [int(a) for a in sys.argv[2:]]
    if mode == "env":
        for k in ("DTRUN_HEARTBEAT_FILE", "PYTHONFAULTHANDLER", "TORCHELASTIC_TIMER_FILE"):
            print(f"{k}={os.environ.get(k, '<unset>')}", flush=True)
        return
    {"wedge": wedge, "silent": silent, "collective": collective, "after": after,
     "crash": crash, "timer": timer, "progress": progress}[mode](*args)


main()
