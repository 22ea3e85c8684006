"""Multi-node start-up and node-failure detection, dtrun vs Debian's torchrun
1.13 (through torchrun_shim.py, c10d backend) and, with --torch2, torchrun
2.6 in the root of scripts/torch2.sh (through dtrun's torch shim), in one run, the
sides alternating. "Nodes" are agents on this machine sharing a c10d
endpoint on 127.0.0.1.

  start-up: seconds from the last node's start to the moment every worker of
            N nodes x 2 is running (the workers stamp their start).
  failure:  seconds from kill -9 of one of 2 nodes' agents (and its
            workers) until the surviving node's workers are restarted.

Usage: multinode_bench.py --dtrun PATH --fake-worker PATH [--reps N]
                          [--torch2 scripts/torch2.sh]
"""
import argparse
import glob
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SHIM = os.path.join(HERE, "torchrun_shim.py")
SHIM2 = os.path.normpath(os.path.join(HERE, "..", "..", "apps", "dtrun", "python", "dtrun_torch_shim"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dtrun_cmd(a, n, port, rid, conf, worker_args):
    return [a.dtrun, f"--nnodes={n}", "--nproc-per-node=2", "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={rid}", f"--rdzv-conf={conf}",
            a.fake_worker] + worker_args


def torchrun_cmd(a, n, port, rid, conf, worker_args):
    return ["/usr/bin/python3", SHIM, f"--nnodes={n}", "--nproc_per_node=2",
            "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}", f"--rdzv_id={rid}",
            f"--rdzv_conf={conf}", "--monitor_interval=0.1", "--no_python",
            a.fake_worker] + worker_args


def torchrun2_cmd(a, n, port, rid, conf, worker_args):
    """torchrun 2.6 in the root; its default --monitor_interval is 0.1."""
    return [a.torch2, "run", "env", f"PYTHONPATH={SHIM2}", "/usr/bin/torchrun",
            f"--nnodes={n}", "--nproc_per_node=2", "--rdzv_backend=c10d",
            f"--rdzv_endpoint=127.0.0.1:{port}", f"--rdzv_id={rid}", f"--rdzv_conf={conf}",
            "--no_python", a.fake_worker] + worker_args


def stamps(folder, restart):
    out = []
    for path in glob.glob(os.path.join(folder, f"start_*_{restart}")):
        with open(path) as f:
            out.append(int(f.read()) / 1e9)
    return out


def startup(a, make, n):
    with tempfile.TemporaryDirectory() as d:
        port = free_port()
        procs = []
        for i in range(n):
            if i == n - 1:
                last_start = time.time()
            procs.append(subprocess.Popen(
                make(a, n, port, f"s{n}_{port}", "join_timeout=60",
                     ["--stamp-dir", d, "--sleep-ms", "200"]),
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for p in procs:
            p.wait(timeout=120)
        s = stamps(d, 0)
        if len(s) != 2 * n:
            raise RuntimeError(f"only {len(s)} of {2 * n} workers started")
        return max(s) - last_start


def failure_detection(a, make, conf, limit):
    """Seconds until the survivor restarts its workers; None if not within limit."""
    with tempfile.TemporaryDirectory() as d:
        port = free_port()
        args = ["--stamp-dir", d, "--sleep-ms", str(int((limit + 10) * 1000))]
        survivor = subprocess.Popen(make(a, "1:2", port, f"f{port}", conf, args),
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.3)
        victim = subprocess.Popen(make(a, "1:2", port, f"f{port}", conf, args),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  start_new_session=True)
        try:
            deadline = time.time() + 90
            while len(stamps(d, 0)) + len(stamps(d, 1)) < 4 and time.time() < deadline:
                time.sleep(0.05)
            round_ = 0 if len(stamps(d, 0)) >= 4 else 1
            if len(stamps(d, round_)) < 4:
                raise RuntimeError("the 2-node round never started")
            killed = time.time()
            os.killpg(victim.pid, signal.SIGKILL)  # the agent and its workers
            victim.wait()
            while time.time() < killed + limit:
                later = [t for r in range(round_ + 1, round_ + 4) for t in stamps(d, r)]
                if later:
                    return min(later) - killed
                time.sleep(0.05)
            return None
        finally:
            for p in (survivor, victim):
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL) if p is victim else p.kill()
                    p.wait()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dtrun", required=True)
    p.add_argument("--fake-worker", required=True)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--torch2", help="scripts/torch2.sh: also measure torchrun 2.6 in its root")
    a = p.parse_args()
    makers = [dtrun_cmd, torchrun_cmd] + ([torchrun2_cmd] if a.torch2 else [])
    two = " torchrun 2.6 (root, shim) |" if a.torch2 else ""
    print(f"| multi-node (agents on one machine, c10d endpoint) | dtrun | torchrun 1.13 (shim) "
          f"|{two} torchrun 1.13 / dtrun |{' torchrun 2.6 / dtrun |' if two else ''}")
    print("|---|---:|---:|---:|" + ("---:|---:|" if two else ""))
    for n in (2, 4):
        samples = [[] for _ in makers]
        for _ in range(a.reps):
            for i, make in enumerate(makers):
                samples[i].append(startup(a, make, n))
        m = [statistics.median(s) for s in samples]
        cells = [f"{x:.2f} s [{min(s):.2f}-{max(s):.2f}]" for x, s in zip(m, samples)]
        ratios = [f"{x / m[0]:.1f}x" for x in m[1:]]
        print(f"| {n} nodes x 2 workers: last node's start -> all workers running "
              f"| {' | '.join(cells)} | {' | '.join(ratios)} |", flush=True)
    conf = "keep_alive_interval=5,keep_alive_max_attempt=3,last_call_timeout=1"
    fmt = lambda v: "not within 60 s" if v is None else f"{v:.1f} s"
    found = [fmt(failure_detection(a, dtrun_cmd, conf, 60)),
             fmt(failure_detection(a, torchrun_cmd, "last_call_timeout=1", 60))]
    if a.torch2:
        found.append(fmt(failure_detection(a, torchrun2_cmd, "last_call_timeout=1", 60)))
    print(f"| 1 of 2 nodes killed (-9): survivor's workers restarted after "
          f"(keep-alive 5 s x 3) | {' | '.join(found)} | |{' |' if two else ''}")


if __name__ == "__main__":
    sys.exit(main())
