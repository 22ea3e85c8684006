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

Usage: node_loss_bench.py --dtrun PATH --train-cfg PATH [--repeat N]
         [--faults kill,stop] [--rdzv-conf K=V,...] [--dtrun-flags "--standby"]"""
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

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG = os.path.join(HERE, "..", "..", "examples", "configs", "mlp100m_ddp.toml")
RESUMED = re.compile(r"resumed from (memory|\S+) at step (\d+)")
RECOVERED = re.compile(r"recovered in ([\d.]+) s: (.*)")

p = argparse.ArgumentParser()
p.add_argument("--dtrun", required=True)
p.add_argument("--train-cfg", required=True)
p.add_argument("--dtrun-flags", default="", help="more dtrun flags, e.g. --standby")
p.add_argument("--repeat", type=int, default=3)
p.add_argument("--faults", default="kill,stop")
p.add_argument("--rdzv-conf", default="")
ARGS = p.parse_args()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node(rank, port, folder, run_id):
    conf = "last_call_timeout=1,join_timeout=60" + (f",{ARGS.rdzv_conf}" if ARGS.rdzv_conf else "")
    cmd = [ARGS.dtrun, "--nnodes=1:2", "--nproc-per-node=1", f"--node-rank={rank}",
           "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={run_id}",
           f"--rdzv-conf={conf}", f"--log-dir={folder}/logs{rank}", *ARGS.dtrun_flags.split(),
           ARGS.train_cfg, CONFIG,
           "--set", f'checkpoint.dir="{folder}/ckpt"', "--set", 'checkpoint.mode="memory"',
           "--set", "checkpoint.persist_every=100", "--set", "checkpoint.every=4",
           "--set", "train.steps=18", "--set", "train.log_every=1"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def once(fault, run_id):
    with tempfile.TemporaryDirectory(dir=os.environ.get("DTRUN_BENCH_TMP", "/tmp")) as folder:
        port = free_port()
        survivor = node(0, port, folder, run_id)
        time.sleep(0.3)
        victim = node(1, port, folder, run_id)
        marks, lines = {}, []

        def lose_the_other_node():
            marks["lost"] = time.monotonic()
            os.killpg(victim.pid, signal.SIGKILL if fault == "kill" else signal.SIGSTOP)

        def watch(stream):
            for line in stream:
                now = time.monotonic()
                lines.append(line)
                if line.startswith("step 14 loss") and "lost" not in marks:
                    lose_the_other_node()
                elif "declared dead" in line:
                    marks.setdefault("declared", now)
                elif RESUMED.search(line) and "lost" in marks:
                    m = RESUMED.search(line)
                    marks["source"], marks["step"] = m.group(1), int(m.group(2))
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
            survivor.wait(timeout=900)
        finally:
            for proc in (survivor, victim):
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
        for t in threads:
            t.join()
        if survivor.returncode != 0 or "first_step" not in marks:
            sys.exit(f"{fault}: exit {survivor.returncode}\n" + "".join(lines))
        return (marks["first_step"] - marks["lost"], marks.get("declared", 0) - marks["lost"],
                marks.get("report", "-"), marks["source"], marks["step"])


def main():
    faults = ARGS.faults.split(",")
    got = {f: [] for f in faults}
    for i in range(ARGS.repeat):
        for fault in faults:  # the faults take turns
            got[fault].append(once(fault, f"nodeloss{os.getpid()}_{i}_{fault}"))
    print(f"keep-alive: {ARGS.rdzv_conf or 'the default (1 s x 3)'}")
    print("| fault of the other node | signal to the survivor's next step, median (min-max) "
          "| of which declared dead after | resumed from | dtrun's recovery line (the median run) |")
    print("|---|---|---|---|---|")
    for fault, runs in got.items():
        total = [r[0] for r in runs]
        declared = [r[1] for r in runs]
        median_run = sorted(runs)[len(runs) // 2]
        label = "SIGKILL of its dtrun and worker" if fault == "kill" else "SIGSTOP of its dtrun and worker"
        print(f"| {label} | {statistics.median(total):.2f} s ({min(total):.2f}-{max(total):.2f}) "
              f"| {statistics.median(declared):.2f} s ({min(declared):.2f}-{max(declared):.2f}) "
              f"| {', '.join(sorted(set(f'{r[3]} (step {r[4]})' for r in runs)))} "
              f"| `{median_run[2]}` |")


main()
