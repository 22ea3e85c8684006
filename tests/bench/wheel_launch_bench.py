"""dtrun launched three ways, the whole process timed: the build tree's
binary, the wheel's (scripts/wheel.sh from the same build, pip-installed
into a fresh venv, offline) and `python -m dtrun` from that venv, each
running `--no-python --nproc-per-node=1 /bin/true`, the three taking turns.
Prints a Markdown table: median [lo-hi] ms, and the wheel's size.

Usage (as root): wheel_launch_bench.py --build BUILD_DIR [--rounds 20]
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.normpath(os.path.join(HERE, "..", ".."))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--rounds", type=int, default=20)
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    wheel = subprocess.run([os.path.join(SRC, "scripts", "wheel.sh"), build], cwd=SRC,
                           check=True, capture_output=True, text=True).stdout.split()[-1]
    wheel = os.path.join(SRC, wheel)
    with tempfile.TemporaryDirectory() as tmp:
        venv = os.path.join(tmp, "venv")
        subprocess.run(["/usr/bin/python3", "-m", "venv", venv], check=True)
        subprocess.run([f"{venv}/bin/python", "-m", "pip", "install", "--no-index", "--no-deps",
                        "--disable-pip-version-check", "-q", wheel], check=True)
        args = ["--no-python", "--nproc-per-node=1", "--log-level=error", "/bin/true"]
        sides = {
            "the build tree's `dtrun`": [f"{build}/apps/dtrun", *args],
            "the wheel's `venv/bin/dtrun`": [f"{venv}/bin/dtrun", *args],
            "`venv/bin/python -m dtrun`": [f"{venv}/bin/python", "-m", "dtrun", *args],
        }
        ms = {k: [] for k in sides}
        for _ in range(a.rounds):
            for name, cmd in sides.items():
                t = time.perf_counter()
                subprocess.run(cmd, check=True, cwd=tmp, stdout=subprocess.DEVNULL)
                ms[name].append((time.perf_counter() - t) * 1000)
    print(f"wheel {os.path.basename(wheel)}: {os.path.getsize(wheel) / 1e6:.1f} MB; "
          f"{a.rounds} rounds taking turns")
    print()
    print("| launched as | ms, median [lo-hi] |")
    print("|---|---|")
    for name, v in ms.items():
        print(f"| {name} | {statistics.median(v):.1f} [{min(v):.1f}-{max(v):.1f}] |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
