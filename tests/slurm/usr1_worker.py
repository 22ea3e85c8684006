"""A worker that waits for SLURM's warning signal: writes DIR/ready_<RANK>,
then on SIGUSR1 writes DIR/usr1_<RANK> and exits 0 (a checkpoint would be
saved there). Exits 3 if no SIGUSR1 comes within 120 s.
Usage: usr1_worker.py DIR"""
import os
import signal
import sys
import time

folder, rank = sys.argv[1], os.environ["RANK"]


def on_usr1(signo, frame):
    # SLURM may deliver the warning to the worker itself as well as through
    # dtrun: a second SIGUSR1 during the interpreter's shutdown (which puts
    # the default handlers back) would kill it. Ignore it, and leave at once.
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    with open(os.path.join(folder, f"usr1_{rank}"), "w") as f:
        f.write(f"{signo} {os.environ['WORLD_SIZE']}\n")
    os._exit(0)


signal.signal(signal.SIGUSR1, on_usr1)
open(os.path.join(folder, f"ready_{rank}"), "w").close()
time.sleep(120)
sys.exit(3)
