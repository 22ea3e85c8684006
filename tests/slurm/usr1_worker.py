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
    with open(os.path.join(folder, f"usr1_{rank}"), "w") as f:
        f.write(f"{signo} {os.environ['WORLD_SIZE']}\n")
    sys.exit(0)


signal.signal(signal.SIGUSR1, on_usr1)
open(os.path.join(folder, f"ready_{rank}"), "w").close()
time.sleep(120)
sys.exit(3)
