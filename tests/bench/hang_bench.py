"""Hang benchmark: detection latency against --hang-timeout (median of N),
the cost of one Python heartbeat, and how long torch 1.13's own
FileTimerServer (torchrun, through torchrun_shim.py) and dtrun take to kill
a worker whose timer expired, in the same run. Prints Markdown rows.

usage: hang_bench.py --dtrun PATH [--cpp-bench PATH] [--runs 10] [--timeout 1]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "..", "integration", "hang_worker.py")
SHIM = os.path.join(HERE, "torchrun_shim.py")
PY = "/usr/bin/python3"
HUNG = re.compile(r"is hung: no heartbeat for ([\d.]+) s")


def detection_latency(dtrun, timeout, runs):
    """Seconds from the last beat to the kill, minus the timeout."""
    out = []
    for _ in range(runs):
        p = subprocess.run([dtrun, "--python", PY, f"--hang-timeout={timeout}", WORKER,
                            "wedge", "5", "0", "2"], capture_output=True, text=True, timeout=120)
        out.append(float(HUNG.search(p.stderr).group(1)) - timeout)
    return out


def python_beat_us(n=200000):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "hb")
        hb = os.open(path, os.O_WRONLY | os.O_CREAT)
        t = time.perf_counter()
        for step in range(n):
            os.pwrite(hb, b"%d\n" % step, 0)
        fast = (time.perf_counter() - t) / n * 1e6
        t = time.perf_counter()
        for step in range(n // 200):  # truncating: ext4 flushes on close
            open(path, "w").write(f"{step}\n")
        slow = (time.perf_counter() - t) / (n // 200) * 1e6
    return fast, slow


def timer_kill_latency(cmd, env):
    """Seconds from a FileTimer's expiry to the worker's death, watched from here."""
    with tempfile.TemporaryDirectory() as d:
        env = dict(env, BEAT_LOG=os.path.join(d, "b"), TORCHELASTIC_ENABLE_FILE_TIMER="1")
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        stamp = os.path.join(d, "b.timer")
        while not os.path.exists(stamp) or not os.path.getsize(stamp):
            if p.poll() is not None:
                raise RuntimeError(f"{cmd[:2]} exited with {p.returncode} before the timer started")
            time.sleep(0.001)
        expiry = float(open(stamp).read()) + 1
        pids = [int(x) for x in subprocess.run(["pgrep", "-f", "hang_worker.py timer"],
                                                capture_output=True, text=True).stdout.split()]
        while any(alive(pid) for pid in pids):
            time.sleep(0.001)
        died = time.time()
        p.wait(timeout=120)
        return died - expiry


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def main():
    a = argparse.ArgumentParser()
    a.add_argument("--dtrun", required=True)
    a.add_argument("--cpp-bench")
    a.add_argument("--runs", type=int, default=10)
    a.add_argument("--timeout", type=float, default=1.0)
    args = a.parse_args()
    sys.stdout.reconfigure(line_buffering=True)
    lat = detection_latency(args.dtrun, args.timeout, args.runs)
    print(f"| detection latency over --hang-timeout={args.timeout:g} s, median of {args.runs} "
          f"| {statistics.median(lat) * 1000:.0f} ms (min {min(lat) * 1000:.0f}, max {max(lat) * 1000:.0f}) |")
    fast, slow = python_beat_us()
    print(f"| one Python beat, os.pwrite on an open fd | {fast:.2f} us ({fast / 100:.3f}% of a 10 ms step) |")
    print(f"| one Python beat, open(path, 'w').write() (truncates: avoid) | {slow:.2f} us ({slow / 100:.3f}% of a 10 ms step) |")
    if args.cpp_bench:
        words = subprocess.run([args.cpp_bench], capture_output=True, text=True).stdout.split()
        cpp = float(words[1])
        print(f"| one C++ beat, Heartbeat::Beat | {cpp:.2f} us ({cpp / 100:.3f}% of a 10 ms step) |")
        if len(words) >= 4:  # the beat with the step's compute time (stragglers)
            timed = float(words[3])
            print(f"| one C++ beat with the compute time, Heartbeat::Beat(step, seconds) | "
                  f"{timed:.2f} us ({timed / 100:.3f}% of a 10 ms step) |")
    env = dict(os.environ)
    worker = [WORKER, "timer"]
    torch_runs = [timer_kill_latency([PY, SHIM, "--standalone", "--nproc_per_node=1", "--max_restarts=0", *worker], env)
                  for _ in range(3)]
    dtrun_runs = [timer_kill_latency([args.dtrun, "--python", PY, *worker], env) for _ in range(3)]
    print(f"| FileTimer expiry to worker death, torchrun 1.13 (FileTimerServer), median of 3 "
          f"| {statistics.median(torch_runs) * 1000:.0f} ms |")
    print(f"| FileTimer expiry to worker death, dtrun, median of 3 | {statistics.median(dtrun_runs) * 1000:.0f} ms |")


if __name__ == "__main__":
    sys.exit(main())
