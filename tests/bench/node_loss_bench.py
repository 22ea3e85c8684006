"""A whole node lost mid-training: the survivor's time to its next step.

Two dtrun nodes on loopback (c10d rendezvous on 127.0.0.1, --nnodes=1:2,
one rank each: group rank 0 is the survivor, --node-rank decides it),
examples/configs/mlp100m_ddp.toml (96.4 M parameters, 0.77 GB of state),
CPU gloo, checkpoint.mode = "memory" every 4 steps, dtrun's default
keep-alive (1 s x 3) unless --rdzv-conf says otherwise. Once the survivor
prints step 14, the other node is
  - kill: SIGKILLed, its dtrun and worker (its process group): its store
          connection closes, which the store pushes at once;
  - stop: SIGSTOPped, the same processes: its connection stays open and
          silent, so the missed heartbeats tell (the silent limit).
The survivor's worker fails in its collective or is stopped by the new
round, which has the survivor alone; its new worker resumes from its own
memory copy. Measured from the signal to the survivor's first completed
step after the resume (each output line timed as it arrives), with dtrun's
own recovery line beside it. The faults take turns, repeated; medians and
spread.

--sides dtrun-in-place: dtrun with --restart=in-place, the survivor's
worker kept in its process for the next round (DDP), going on from the
step it holds. Beside the next step, the time lost: the signal to step 16
(past the failure on every side) less two undisturbed steps.

--sides adds PyTorch's own launcher on the same failure: torchrun 2.6 or
2.14 (from the Debian roots, dtrun's torch shim on PYTHONPATH as their
builds lack libuv) with the same model under PyTorch's DDP in Python
(dcp_restart_worker.py), checkpointed with torch.distributed.checkpoint
every 4 steps into a folder both nodes share, resumed with dcp.load;
torchrun's c10d rendezvous with the same last call and --max-restarts=3.
A torchrun run that has no next step within --torchrun-cap seconds of the
signal counts as "none" (a SIGSTOPped peer leaves gloo's collective
waiting for its 30 min timeout). Sides and faults take turns.

Usage: node_loss_bench.py --dtrun PATH --train-cfg PATH [--repeat N]
         [--faults kill,stop] [--rdzv-conf K=V,...] [--dtrun-flags=--standby]
         [--sides dtrun,dtrun-in-place,torchrun-2.6,torchrun-2.14]
         [--torchrun-cap S]"""
import argparse
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from proc_tree import kill_holding, signal_all, tree  # beside this file

HERE = os.path.dirname(os.path.abspath(__file__))
CHECKOUT = os.path.normpath(os.path.join(HERE, "..", ".."))
CONFIG = os.path.join(CHECKOUT, "examples", "configs", "mlp100m_ddp.toml")
SHIM = os.path.join(CHECKOUT, "apps", "dtrun", "python", "dtrun_torch_shim")
ROOTS = {"torchrun-2.6": "torch2.sh", "torchrun-2.14": "torch214.sh"}
RESUMED = re.compile(r"resumed from (memory|\S+) at step (\d+)"
                     r"|in place: round \d+ goes on from (step) (\d+)")
RECOVERED = re.compile(r"recovered in ([\d.]+) s: (.*)")

p = argparse.ArgumentParser()
p.add_argument("--dtrun", required=True)
p.add_argument("--train-cfg", required=True)
p.add_argument("--dtrun-flags", default="", help="more dtrun flags, e.g. --standby")
p.add_argument("--repeat", type=int, default=3)
p.add_argument("--faults", default="kill,stop")
p.add_argument("--rdzv-conf", default="")
p.add_argument("--sides", default="dtrun",
               help="dtrun,dtrun-in-place,torchrun-2.6,torchrun-2.14")
p.add_argument("--torchrun-cap", type=float, default=60)
ARGS = p.parse_args()
for _side in ARGS.sides.split(","):
    if _side not in ("dtrun", "dtrun-in-place") and _side not in ROOTS:
        p.error(f"--sides: unknown side '{_side}'; choose from dtrun, dtrun-in-place, "
                f"{', '.join(ROOTS)}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_node(side, survivor, port, folder, run_id):
    # Only the survivor's worker prints (its rank may be either), and no
    # worker kills itself (kill at step 0).
    cmd = [os.path.join(CHECKOUT, "scripts", ROOTS[side]), "run", "env", "PYTHONPATH=" + SHIM,
           f"DCP_PRINT={int(survivor)}", "/usr/bin/torchrun", "--nnodes=1:2",
           "--nproc-per-node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
           f"--rdzv-id={run_id}",
           # the survivor hosts the rendezvous store, as dtrun's first node does
           f"--rdzv-conf=last_call_timeout=1,join_timeout=60,is_host={str(survivor).lower()}",
           "--max-restarts=3", os.path.join(HERE, "dcp_restart_worker.py"),
           f"{folder}/ckpt", "18", "4", "0"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, cwd=CHECKOUT)


def node(side, rank, port, folder, run_id):
    if not side.startswith("dtrun"):
        return torchrun_node(side, rank == 0, port, folder, run_id)
    in_place = ["--restart=in-place", "--max-restarts=3"] if side == "dtrun-in-place" else []
    conf = "last_call_timeout=1,join_timeout=60" + (f",{ARGS.rdzv_conf}" if ARGS.rdzv_conf else "")
    cmd = [ARGS.dtrun, "--nnodes=1:2", "--nproc-per-node=1", f"--node-rank={rank}",
           "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={run_id}",
           f"--rdzv-conf={conf}", f"--log-dir={folder}/logs{rank}", *in_place,
           *ARGS.dtrun_flags.split(),
           ARGS.train_cfg, CONFIG,
           "--set", f'checkpoint.dir="{folder}/ckpt"', "--set", 'checkpoint.mode="memory"',
           "--set", "checkpoint.persist_every=100", "--set", "checkpoint.every=4",
           "--set", "train.steps=18", "--set", "train.log_every=1"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def once(side, fault, run_id):
    # The roots see the host's /tmp, not /var/tmp.
    dtrun = side.startswith("dtrun")
    tmp = os.environ.get("DTRUN_BENCH_TMP", "/tmp") if dtrun else "/tmp"
    with tempfile.TemporaryDirectory(dir=tmp) as folder:
        port = free_port()
        survivor = node(side, 0, port, folder, run_id)
        time.sleep(0.3)  # the survivor hosts the store
        victim = node(side, 1, port, folder, run_id)
        marks, lines = {}, []

        def lose_the_other_node():
            marks["lost"] = time.monotonic()
            # The launcher and every process under it: both launchers start
            # each worker in a process group (torchrun: a session) of its own.
            signal_all(tree(victim.pid), signal.SIGKILL if fault == "kill" else signal.SIGSTOP)

        def watch(stream):
            for line in stream:
                now = time.monotonic()
                lines.append(line)
                step = re.match(r"step (\d+) loss", line)
                if step and "lost" not in marks:
                    marks.setdefault("steps", []).append(now)
                if step and int(step.group(1)) == 16 and "lost" in marks:
                    marks.setdefault("past", now)  # both sides past the failure
                if line.startswith("step 14 loss") and "lost" not in marks:
                    lose_the_other_node()
                elif ("declared dead" in line or "failed (exitcode" in line) and "lost" in marks:
                    marks.setdefault("declared", now)
                elif RESUMED.search(line) and "lost" in marks:
                    m = RESUMED.search(line)
                    kept = m.group(3) is not None
                    marks["source"] = "kept" if kept else m.group(1)
                    marks["step"] = int(m.group(4) if kept else m.group(2))
                elif "step" in marks and line.startswith(f"step {marks['step'] + 1} loss"):
                    marks.setdefault("first_step", now)
                elif RECOVERED.search(line) and "lost" in marks:
                    marks.setdefault("report", RECOVERED.search(line).group(0))

        threads = [threading.Thread(target=watch, args=(s,)) for s in (survivor.stdout, survivor.stderr)]
        for t in threads:
            t.start()
        threading.Thread(target=lambda: [None for _ in victim.stdout], daemon=True).start()
        threading.Thread(target=lambda: [None for _ in victim.stderr], daemon=True).start()
        try:
            if dtrun:
                survivor.wait(timeout=900)
            else:
                wait_capped(survivor, marks)
        finally:
            for proc in (survivor, victim):
                signal_all(tree(proc.pid), signal.SIGKILL)
                proc.wait()
            kill_holding(folder)  # a worker its launcher lost
        for t in threads:
            t.join()
        if not dtrun and "first_step" not in marks and "lost" in marks:
            # no next step within the cap: counted, not fatal
            print(f"{side} {fault}: no next step (exit {survivor.returncode}); its last lines:\n"
                  + "".join(lines[-12:]), file=sys.stderr, flush=True)
            return None
        # torchrun's survivor is killed once its next step is seen
        ok_exits = (0,) if dtrun else (0, -signal.SIGKILL)
        if survivor.returncode not in ok_exits or "first_step" not in marks:
            sys.exit(f"{side} {fault}: exit {survivor.returncode}\n" + "".join(lines))
        # Time lost: to step 16 (past the failure on both sides: a restart
        # redoes the steps since its copy) less the two steps an undisturbed
        # run takes from step 14 to 16, timed on this run's steps 9..14.
        gaps = [b - a for a, b in zip(marks["steps"][-6:], marks["steps"][-5:])]
        step_s = statistics.median(gaps)
        lost = marks["past"] - marks["lost"] - 2 * step_s if "past" in marks else float("nan")
        return (marks["first_step"] - marks["lost"], marks.get("declared", marks["lost"]) - marks["lost"],
                marks.get("report", "-"), marks["source"], marks["step"], lost, step_s)


def wait_capped(proc, marks):
    """torchrun's survivor: until it exits, or --torchrun-cap seconds after
    the signal, or 900 s in all."""
    deadline = time.monotonic() + 900
    while proc.poll() is None and time.monotonic() < deadline and "first_step" not in marks:
        if "lost" in marks and time.monotonic() - marks["lost"] > ARGS.torchrun_cap:
            break
        time.sleep(0.1)


def where(source):
    return {"memory": "memory", "kept": "kept in place"}.get(source, "the folder")


def row(side, fault, all_runs):
    runs = [r for r in all_runs if r is not None]
    label = {"kill": "SIGKILL", "stop": "SIGSTOP"}[fault] + " of its launcher and worker"
    none = len(all_runs) - len(runs)
    if not runs:
        return f"| {side} | {label} | none within {ARGS.torchrun_cap:.0f} s ({none} of {none}) | | | |"
    total = [r[0] for r in runs]
    declared = [r[1] for r in runs]
    median_run = sorted(runs)[len(runs) // 2]
    missing = f"; {none} of {len(all_runs)} none within {ARGS.torchrun_cap:.0f} s" if none else ""
    lost = [r[5] for r in runs]
    step_s = statistics.median(r[6] for r in runs)
    return (f"| {side} | {label} | {statistics.median(total):.2f} s ({min(total):.2f}-{max(total):.2f}){missing} "
            f"| {statistics.median(lost):.2f} s ({min(lost):.2f}-{max(lost):.2f}; a step {step_s:.2f} s) "
            f"| {statistics.median(declared):.2f} s ({min(declared):.2f}-{max(declared):.2f}) "
            f"| {', '.join(sorted(set(f'{where(r[3])} (step {r[4]})' for r in runs)))} "
            f"| `{median_run[2]}` |")


def main():
    cases = [(side, fault) for side in ARGS.sides.split(",") for fault in ARGS.faults.split(",")]
    got = {c: [] for c in cases}
    for i in range(ARGS.repeat):
        for side, fault in cases:  # the sides and the faults take turns
            run_id = f"nodeloss{os.getpid()}_{i}_{fault}_{side.replace('.', '')}"
            got[(side, fault)].append(once(side, fault, run_id))
    print(f"dtrun's keep-alive: {ARGS.rdzv_conf or 'the default (1 s x 3)'}")
    print("| launcher | fault of the other node | signal to the survivor's next step, median "
          "(min-max) | time lost: signal to step 16 less two undisturbed steps "
          "| of which declared dead (dtrun) or the worker failed (torchrun) after "
          "| resumed from | dtrun's recovery line (the median run) |")
    print("|---|---|---|---|---|---|---|")
    for (side, fault), runs in got.items():
        print(row(side, fault, runs))


main()
