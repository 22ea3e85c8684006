"""Chaos under --restart=in-place: --runs train_cfg jobs (digits, DDP or,
with --strategy fsdp, FSDP, whose ranks all go back to the newest
checkpoint in place; 3 ranks on CPU gloo, --mode checkpoints (sync by
default) every 50 steps, --steps steps), each SIGKILLed from
outside --kills times at random moments, a random worker each time (found as
dtrun's children in /proc). A kill may land anywhere: in a step, in a
checkpoint, in a re-forming group (then the group restarts whole and
resumes from its checkpoint). Every run must end with exit 0 and the
params_sha256 of an undisturbed run, and leave no staged state in
/dev/shm (a survivor stopped mid-recovery leaves its own; dtrun removes
it), nor a collectives' segment of its workers. With --nodes N the job
is N dtrun nodes on loopback (127.0.0.2, ...; c10d rendezvous, --nproc
ranks each, 2 by default), the kills land on any node's workers, and each
is recovered on its own node while the other nodes' ranks re-form around
it. Prints, per run, how each failure was recovered (in place, or the
group restarted) and the time lost dtrun reported; then the counts. Usage:
  in_place_chaos_bench.py --dtrun D --train-cfg T [--runs 50] [--kills 2]
                          [--seed N] [--transport shm|gloo] [--strategy ddp|fsdp]
                          [--mode sync|async|memory] [--steps 3000]
                          [--nodes 1] [--nproc 3]"""
import argparse
import glob
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

p = argparse.ArgumentParser()
p.add_argument("--dtrun", required=True)
p.add_argument("--train-cfg", required=True)
p.add_argument("--runs", type=int, default=50)
p.add_argument("--kills", type=int, default=2)
p.add_argument("--seed", type=int, default=0)
p.add_argument("--transport", choices=("shm", "gloo"), default="shm")
p.add_argument("--strategy", choices=("ddp", "fsdp"), default="ddp")
p.add_argument("--mode", choices=("sync", "async", "memory"), default="sync")
p.add_argument("--steps", type=int, default=3000)
p.add_argument("--nodes", type=int, default=1)
p.add_argument("--nproc", type=int, default=0, help="ranks per node (3 on one, else 2)")
p.add_argument("--verbose", action="store_true", help="each run's recovery lines")
ARGS = p.parse_args()
if ARGS.nodes < 1 or ARGS.nproc < 0 or ARGS.runs < 1 or ARGS.kills < 0:
    p.error("--nodes and --runs must be >= 1, --nproc and --kills >= 0")
NPROC = ARGS.nproc or (3 if ARGS.nodes == 1 else 2)
# On several nodes, a silent node is declared dead within seconds.
FAST = ("keep_alive_interval=0.5,keep_alive_max_attempt=6,last_call_timeout=1,"
        "join_timeout=30")
ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
DIGITS = os.path.join(ROOT, "examples", "configs", f"digits_{ARGS.strategy}.toml")
DONE = re.compile(r"params_sha256=([0-9a-f]{64})")
LOST = re.compile(r"time lost ([\d.]+) s")
RECOVERY = re.compile(r"replacing worker|failed here|restarting the worker group|recovered in")
SETS = [f"train.steps={ARGS.steps}", "train.log_every=1000", "train.eval_every=0",
        "checkpoint.every=50", f'checkpoint.mode="{ARGS.mode}"', 'optimizer.type="adamw"',
        "optimizer.lr=0.001"]
if ARGS.transport == "gloo":
    SETS.append("strategy.shared_memory=false")


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def commands(ckpt, in_place, n):
    """One dtrun command line per node."""
    cmds = []
    port = free_port()
    for node in range(ARGS.nodes):
        cmd = [ARGS.dtrun, f"--nproc-per-node={NPROC}", f"--max-restarts={ARGS.kills * 2}"]
        if ARGS.nodes > 1:
            cmd += [f"--nnodes={ARGS.nodes}", "--rdzv-backend=c10d",
                    f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id=chaos{n}",
                    f"--rdzv-conf={FAST}", f"--local-addr=127.0.0.{2 + node}"]
        if in_place:
            cmd.append("--restart=in-place")
        cmd += [ARGS.train_cfg, DIGITS, "--set", f'checkpoint.dir="{ckpt}"']
        for s in SETS:
            cmd += ["--set", s]
        cmds.append(cmd)
    return cmds


def workers(pid):
    """dtrun's live children (its workers)."""
    kids = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                kids += [int(k) for k in f.read().split()]
        except OSError:
            pass
    return kids


def run(tmp, n, rng, in_place=True, kills=0):
    ckpt = os.path.join(tmp, f"run{n}")
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for cmd in commands(ckpt, in_place, n)]
    out, err = [], []
    readers = [threading.Thread(target=lambda s=s, into=into: into.extend(s))
               for proc in procs for s, into in ((proc.stdout, out), (proc.stderr, err))]
    for t in readers:
        t.start()
    killed = 0
    time.sleep(1.5 + ARGS.nodes)  # set up, a few steps in
    while killed < kills and all(proc.poll() is None for proc in procs):
        time.sleep(rng.uniform(0.3, 1.2))
        kids = [workers(proc.pid) for proc in procs]
        # not while a group is being stopped or started
        if all(len(k) == NPROC for k in kids):
            os.kill(rng.choice(rng.choice(kids)), signal.SIGKILL)
            killed += 1
    for proc in procs:
        try:
            proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for t in readers:
        t.join()
    text_out, text_err = "".join(out), "".join(err)
    m = DONE.search(text_out)
    rc = max(abs(proc.returncode) for proc in procs)
    return (rc, m.group(1) if m else None, killed,
            text_err.count("in place: attempt"),
            # one node's group restart; on several, a new round
            text_err.count("restarting the worker group") + text_err.count("failed here;"),
            [float(x) for x in LOST.findall(text_err)], text_err)


def collective_segments(err):
    """The collectives' segments left by the run's workers (named after
    the pid of the rank 0 that made each)."""
    pids = set(re.findall(r"replaced local_rank \d+ with pid (\d+)", err))
    for started in re.findall(r"started \d+ worker\(s\), pids ([\d,]+)", err):
        pids.update(started.split(","))
    return [p for p in glob.glob("/dev/shm/dtrun-ddp-*") if p.split("-")[2] in pids]


def main():
    rng = random.Random(ARGS.seed)
    with tempfile.TemporaryDirectory() as tmp:
        rc, clean, *_ = run(tmp, 0, rng, in_place=False)
        if rc != 0 or not clean:
            sys.exit("the undisturbed run failed")
        bitwise = in_place = group = 0
        lost = []
        began = time.monotonic()
        for n in range(1, ARGS.runs + 1):
            rc, sha, killed, replaced, restarted, times, err = run(tmp, n, rng, kills=ARGS.kills)
            left = glob.glob("/dev/shm/dtrun-inplace-*") + collective_segments(err)
            same = rc == 0 and sha == clean and not left
            bitwise += same
            in_place += replaced
            group += restarted
            lost += times
            print(f"run {n}: exit {rc}, {killed} kill(s), {replaced} replaced in place, "
                  f"{restarted} group restart(s), time lost {times}, "
                  f"{'bitwise' if same else 'DIFFERENT'}", flush=True)
            if not same:
                print(f"left in /dev/shm: {left}\n" + err[-3000:], file=sys.stderr)
            elif ARGS.verbose:
                print("".join(f"  {line}\n" for line in err.splitlines()
                              if RECOVERY.search(line)), end="", flush=True)
        print(f"\n{bitwise} of {ARGS.runs} runs bitwise an undisturbed one ({ARGS.strategy}, "
              f"{ARGS.transport}, {ARGS.nodes} node(s) of {NPROC}); "
              f"{in_place} failures recovered in place, {group} by a group restart; time lost "
              f"median {statistics.median(lost) if lost else 0:.2f} s; "
              f"{time.monotonic() - began:.0f} s")
        sys.exit(0 if bitwise == ARGS.runs else 1)


main()
