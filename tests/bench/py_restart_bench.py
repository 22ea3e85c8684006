"""A Python torch worker SIGKILLed: the time to its next step, restarted by
dtrun cold, by dtrun from its standby (--standby-import, STANDBY_MODULES below),
and by torchrun, for torch 1.13 (the host), 2.6 (the trixie root) and 2.14
(the forky root). The worker is tests/integration/py_train_worker.py (DDP,
gloo, 2 ranks, torch.save checkpoints after every step); rank 1 kills itself
after step --kill-at, and the figure is the time from that step's line to the
next step's, both stamped by rank 0. For dtrun the recovery line's phases
come too. Sides alternate within each repetition; medians and ranges.

  py_restart_bench.py --dtrun PATH [--reps 3] [--torch 1.13,2.6,2.14]

torchrun 1.13 runs through tests/bench/torchrun_shim.py (Debian's crashes on
Python 3.11 at start; the shim fixes only that); torchrun 2.6 and 2.14 get
dtrun's torch shim on PYTHONPATH (Debian's builds lack libuv).
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CHECKOUT = os.path.normpath(os.path.join(HERE, "..", ".."))
WORKER = os.path.join(CHECKOUT, "tests", "integration", "py_train_worker.py")
SHIM = os.path.join(CHECKOUT, "apps", "dtrun", "python", "dtrun_torch_shim")
# torch 2.x's DDP imports torch._dynamo (~900 modules, 0.6 s here) when the
# first one is made: the standby imports it too. 1.13 has none.
STANDBY_MODULES = {"1.13": "torch,torch.distributed",
                   "2.6": "torch,torch.distributed,torch._dynamo",
                   "2.14": "torch,torch.distributed,torch._dynamo"}
STEP = re.compile(r"^step (\d+) ([0-9.]+)$", re.M)
RECOVERED = re.compile(r"recovered in ([0-9.]+) s: detect ([0-9.]+), regroup ([0-9.]+), "
                       r"start ([0-9.]+), init ([0-9.]+), load ([0-9.]+), first step ([0-9.]+)")


def peers():
    root = lambda name: os.path.join(CHECKOUT, "scripts", name)  # noqa: E731
    return {
        "1.13": ("/usr/bin/python3",
                 ["/usr/bin/python3", os.path.join(HERE, "torchrun_shim.py")]),
        "2.6": (root("torch2-python"),
                [root("torch2.sh"), "run", "env", "PYTHONPATH=" + SHIM, "/usr/bin/torchrun"]),
        "2.14": (root("torch214-python"),
                 [root("torch214.sh"), "run", "env", "PYTHONPATH=" + SHIM, "/usr/bin/torchrun"]),
    }


def run_once(args, version, side):
    python, torchrun = peers()[version]
    ckpt = tempfile.mkdtemp(prefix="py-restart-", dir="/tmp")
    logs = tempfile.mkdtemp(prefix="py-restart-logs-", dir="/tmp")
    worker = [WORKER, ckpt, str(args.steps), "--kill-at", str(args.kill_at),
              "--width", str(args.width), "--layers", str(args.layers)]
    common = ["--nproc_per_node=2", "--max_restarts=1"]
    if side == "torchrun":
        cmd = torchrun + ["--standalone"] + common + worker
    else:
        cmd = [args.dtrun, "--python", python, "--log-dir", logs] + common
        if side == "standby":
            cmd += ["--standby-import=" + STANDBY_MODULES[version]]
        cmd += worker
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=CHECKOUT, timeout=600)
    subprocess.run(["rm", "-rf", ckpt, logs])
    steps = {int(m.group(1)): float(m.group(2)) for m in STEP.finditer(p.stdout)}
    k = args.kill_at
    if p.returncode != 0 or k not in steps or k + 1 not in steps:
        # Counted, not fatal: torchrun 2.x's restart of this worker fails at
        # times (gloo's connectFullMesh), which is a result too.
        tail = [l for l in p.stderr.splitlines() if "Error" in l][-1:]
        print("  %s %s failed (rc %d): %s" % (version, side, p.returncode, tail),
              file=sys.stderr, flush=True)
        return None
    phases = RECOVERED.search(p.stderr)
    return steps[k + 1] - steps[k], [float(x) for x in phases.groups()] if phases else None


def spread(xs):
    return "%.2f (%.2f-%.2f)" % (statistics.median(xs), min(xs), max(xs))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtrun", required=True)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--torch", default="1.13,2.6,2.14")
    ap.add_argument("--sides", default="cold,standby,torchrun")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--kill-at", type=int, default=4)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    args = ap.parse_args()
    sides = args.sides.split(",")
    print("| torch | side | kill -> next step (s) | init (s) | first step (s) |")
    print("|---|---|---|---|---|")
    for version in args.torch.split(","):
        got = {s: [] for s in sides}
        for rep in range(args.reps):
            order = sides if rep % 2 == 0 else sides[::-1]
            for side in order:
                got[side].append(run_once(args, version, side))
        for side in sides:
            done = [r for r in got[side] if r]
            gaps = [g for g, _ in done]
            phases = [ph for _, ph in done if ph]
            failed = len(got[side]) - len(done)
            if failed:
                side_name = "%s (failed %d of %d)" % (side, failed, len(got[side]))
            else:
                side_name = side
            if not gaps:
                print("| %s | %s | - | - | - |" % (version, side_name), flush=True)
                continue
            init = spread([ph[4] for ph in phases]) if phases else "-"
            first = spread([ph[6] for ph in phases]) if phases else "-"
            print("| %s | %s | %s | %s | %s |" % (version, side_name, spread(gaps), init, first),
                  flush=True)


if __name__ == "__main__":
    main()
