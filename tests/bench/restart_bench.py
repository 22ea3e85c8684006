"""Restart to first step after a SIGKILL: resume from disk vs from memory.

examples/configs/mlp100m_{ddp,fsdp}.toml (96.4 M parameters, 0.77 GB of
state), 2 ranks, CPU gloo, under dtrun with --max-restarts=1. Checkpoints
every 4 steps; rank 1 SIGKILLs itself after step 14; the group restarts and
resumes from the newest checkpoint that was complete (step 4 or 8: a
write takes several steps' time). Measured from dtrun's line that reports
the SIGKILL to the first step the new group completes (each output line
is timed as it arrives), and, within that, how long the resume read its
checkpoint (the trainer's "read in" figure). Sides:
  - disk, warm: checkpoint.mode = "async"; the file is still in the page
    cache when it is read back.
  - disk, cold: the same, with the page cache dropped whenever a write is
    done (a restart on a node whose cache did not keep it, or from a
    network filesystem): the read comes from the device.
  - memory: checkpoint.mode = "memory", nothing persisted before the kill;
    the new group reads the copies in /dev/shm while dtrun persists them.
  - in-place: the memory side's run under --restart=in-place: rank 1
    alone starts again, rank 0 keeps its process and re-forms the group
    around it. DDP: the replacement takes rank 0's state (step 14) from
    shared memory; nothing is read from a checkpoint. FSDP: both ranks go
    back to the newest memory copy, rank 0 in its process, the replacement
    from its predecessor's copy.
The sides take turns, repeated; medians and spread. Each dtrun run's
recovery line ("recovered in ...: detect, regroup, start, init, load,
first step; time lost") goes to stderr as it is seen.

Time lost, two ways: dtrun's own figure from that line (when the step
after the one the job had reached completed again, minus when it would
have completed undisturbed), and the run's wall time minus that of the
same run without the kill (--undisturbed, the default: each kill run is
followed by its undisturbed twin, so they take turns too).

--payloads raw,torch runs each side with both payload formats (the raw
one with XXH3, the default, and torch's archives with SHA-256, the format
before it), taking turns, so that the two compare in one run;
--strategies and --sides pick a subset.

Sides "torchrun-2.6" and "torchrun-2.14" (DDP only) run PyTorch's own
restart of the same failure: torchrun from the Debian roots (dtrun's
torch shim on PYTHONPATH: their builds lack libuv), the same model under
PyTorch's DDP (dcp_restart_worker.py), torch.distributed.checkpoint's
dcp.save every 4 steps and dcp.load on the resume; timed from torchrun's
"failed (exitcode: -9)" line. A torchrun run that fails is counted, not
fatal (2.6's new group at times ends in gloo's connectFullMesh).

Usage: restart_bench.py --dtrun PATH --train-cfg PATH [--repeat N]
         [--strategies ddp,fsdp] [--sides "disk, warm;disk, cold;memory"]
         [--payloads raw[,torch]] [--dtrun-flags "--standby"] [--every 4]"""
import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from proc_tree import kill_holding  # beside this file

HERE = os.path.dirname(os.path.abspath(__file__))
CHECKOUT = os.path.normpath(os.path.join(HERE, "..", ".."))
CONFIGS = os.path.join(CHECKOUT, "examples", "configs")
SHIM = os.path.join(CHECKOUT, "apps", "dtrun", "python", "dtrun_torch_shim")
ROOTS = {"torchrun-2.6": "torch2.sh", "torchrun-2.14": "torch214.sh"}
READ = re.compile(r"resumed from (memory|\S+) at step (\d+) .*read in ([\d.]+) ms")
IN_PLACE = re.compile(r"re-forming the group in place after step (\d+)")

p = argparse.ArgumentParser()
p.add_argument("--dtrun", required=True)
p.add_argument("--train-cfg", required=True)
p.add_argument("--dtrun-flags", default="", help="more dtrun flags, e.g. --standby")
p.add_argument("--repeat", type=int, default=3)
p.add_argument("--strategies", default="ddp,fsdp")
p.add_argument("--sides", default="disk, warm;disk, cold;memory")
p.add_argument("--payloads", default="raw")
p.add_argument("--every", type=int, default=4, help="checkpoint.every (steps)")
p.add_argument("--undisturbed", type=int, default=1,
               help="1: time each dtrun side's run without the kill too")
ARGS = p.parse_args()


def drop_page_cache():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def torchrun_command(side, folder):
    return [os.path.join(CHECKOUT, "scripts", ROOTS[side]), "run", "env", "PYTHONPATH=" + SHIM,
            "/usr/bin/torchrun", "--standalone", "--nproc-per-node=2", "--max-restarts=1",
            os.path.join(HERE, "dcp_restart_worker.py"), folder, "16", "4", "14"]


LOST = re.compile(r"; time lost ([\d.]+) s")


def run(strategy, side, payload, folder, kill=True):
    if side in ROOTS:
        return run_watched(side, torchrun_command(side, folder), "failed (exitcode: -9)")
    mode = "memory" if side in ("memory", "in-place") else "async"
    checksum = "xxh3" if payload == "raw" else "sha256"
    restart = ["--restart=in-place"] if side == "in-place" else []
    cmd = [ARGS.dtrun, "--nproc-per-node=2", "--max-restarts=1", *restart,
           *ARGS.dtrun_flags.split(),
           ARGS.train_cfg,
           os.path.join(CONFIGS, f"mlp100m_{strategy}.toml"),
           "--set", f'checkpoint.dir="{folder}"', "--set", f'checkpoint.mode="{mode}"',
           *(["--set", "checkpoint.persist_every=100"] if mode == "memory" else []),
           "--set", f"checkpoint.every={ARGS.every}",
           "--set", f'checkpoint.payload="{payload}"', "--set", f'checkpoint.checksum="{checksum}"',
           "--set", "train.steps=16", "--set", "train.log_every=1"]
    if not kill:
        return run_watched(side, cmd, None)
    cmd += ["--set", "fault.kill_rank=1", "--set", "fault.kill_at_step=14"]
    return run_watched(side, cmd, "failed: SIGKILL")


def run_watched(side, cmd, killed_line):
    """(SIGKILL to the first step after it, reading the checkpoint, wall
    time, dtrun's time lost or None); with no `killed_line`, the wall time
    of an undisturbed run."""
    began = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         cwd=CHECKOUT, start_new_session=True)
    marks = {}
    lines = []

    def watch(stream):
        for line in stream:
            now = time.monotonic()
            lines.append(line)
            if killed_line and killed_line in line:
                marks.setdefault("killed", now)
            elif "written in the background" in line and "killed" not in marks:
                if side == "disk, cold":
                    drop_page_cache()
            elif READ.search(line):
                m = READ.search(line)
                marks["source"], marks["step"] = m.group(1), int(m.group(2))
                marks["read_ms"] = float(m.group(3))
            elif IN_PLACE.search(line) and "step" not in marks:
                marks["source"], marks["step"] = "in place", int(IN_PLACE.search(line).group(1))
                marks["read_ms"] = 0.0
            elif ("step" in marks and line.startswith(f"step {marks['step'] + 1} loss")):
                marks.setdefault("first_step", now)
            elif "recovered in" in line:  # dtrun's breakdown, to stderr below
                marks.setdefault("report", line[line.index("recovered in"):].strip())
    threads = [threading.Thread(target=watch, args=(s,)) for s in (p.stdout, p.stderr)]
    for t in threads:
        t.start()
    try:
        p.wait(timeout=150 if side in ROOTS else 900)
    except subprocess.TimeoutExpired:  # a torchrun whose new group hangs
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    if side in ROOTS:
        kill_holding(cmd[-4])  # workers torchrun lost: they hold the pipes read here
    for t in threads:
        t.join()
    wall = time.monotonic() - began
    if killed_line is None:
        if p.returncode != 0:
            sys.exit(f"{side}, undisturbed: exit {p.returncode}\n" + "".join(lines[-40:]))
        return wall
    if p.returncode != 0 or "first_step" not in marks or marks["step"] < 4:
        if side in ROOTS:
            print(f"{side}: failed (exit {p.returncode})", file=sys.stderr, flush=True)
            return None
        sys.exit(f"{side}: exit {p.returncode}\n" + "".join(lines[-40:]))
    if "report" in marks:
        print(f"{side}: {marks['report']}", file=sys.stderr, flush=True)
    want_memory = side == "memory"
    if side != "in-place" and (marks["source"] == "memory") != want_memory:
        sys.exit(f"{side}: resumed from {marks['source']}")
    lost = LOST.search(marks.get("report", ""))
    return (marks["first_step"] - marks["killed"], marks["read_ms"] / 1000, wall,
            float(lost.group(1)) if lost else None)


def cases():
    """(strategy, side, payload) for each run; torchrun's sides once per
    strategy (their payload is DCP's), and only for DDP."""
    known = {"disk, warm", "disk, cold", "memory", "in-place", *ROOTS}
    sides, payloads = ARGS.sides.split(";"), ARGS.payloads.split(",")
    for side in sides:
        if side not in known:
            p.error(f"--sides: unknown side '{side}'; choose from {sorted(known)}")
    if "fsdp" in ARGS.strategies.split(",") and any(side in ROOTS for side in sides):
        p.error("--sides: torchrun's sides run DDP only; pass --strategies ddp")
    return [(s, side, pay) for s in ARGS.strategies.split(",") for side in sides
            for pay in (payloads[:1] if side in ROOTS else payloads)]


def spread(values):
    """"median s (min-max)", or "-" for none."""
    if not values:
        return "-"
    return f"{statistics.median(values):.2f} s ({min(values):.2f}-{max(values):.2f})"


def main():
    sides = cases()
    got = {k: [] for k in sides}
    calm = {k: [] for k in sides}  # undisturbed wall times
    # The roots see the host's /tmp, not /var/tmp.
    tmp_dir = "/tmp" if any(side in ROOTS for _, side, _ in sides) else os.environ.get(
        "DTRUN_BENCH_TMP", "/tmp")
    with tempfile.TemporaryDirectory(dir=tmp_dir) as tmp:
        for _ in range(ARGS.repeat):
            for strategy, side, payload in sides:  # the sides take turns
                folder = os.path.join(tmp, "ckpt")
                shutil.rmtree(folder, ignore_errors=True)
                got[(strategy, side, payload)].append(run(strategy, side, payload, folder))
                shutil.rmtree(folder, ignore_errors=True)
                if ARGS.undisturbed and side not in ROOTS:
                    calm[(strategy, side, payload)].append(
                        run(strategy, side, payload, folder, kill=False))
                    shutil.rmtree(folder, ignore_errors=True)
    print("| strategy, resumed from, payload (2 ranks, 96.4 M parameters) | SIGKILL to the first "
          "step after it, median (min-max) | of which reading the checkpoint | vs the first row "
          "| time lost: wall minus undisturbed | dtrun's time lost |")
    print("|---|---|---|---|---|---|")
    for (strategy, side, payload), all_runs in got.items():
        runs = [r for r in all_runs if r is not None]
        failed = f"; {len(all_runs) - len(runs)} of {len(all_runs)} failed" if len(runs) < len(all_runs) else ""
        if not runs:
            print(f"| {strategy.upper()}, {side} | failed ({len(all_runs)} of {len(all_runs)}) | | |")
            continue
        total = [r[0] for r in runs]
        read = [r[1] for r in runs]
        first = next(k for k in got if k[0] == strategy)
        base = statistics.median(r[0] for r in got[first] if r is not None)
        what = f"{side} (dcp)" if side in ROOTS else f"{side}, {payload}"
        print(f"| {strategy.upper()}, {what} | {statistics.median(total):.2f} s "
              f"({min(total):.2f}-{max(total):.2f}){failed} | {statistics.median(read):.2f} s "
              f"({min(read):.2f}-{max(read):.2f}) | {statistics.median(total) / base:.3f} "
              f"| {spread([r[2] - c for r, c in zip(runs, calm[(strategy, side, payload)])])} "
              f"| {spread([r[3] for r in runs if r[3] is not None])} |")


main()
