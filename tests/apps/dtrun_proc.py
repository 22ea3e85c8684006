"""Runs the dtrun binary for integration tests and checks processes by pid."""
import argparse
import os
import signal
import subprocess
import tempfile
import time
import unittest


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--dtrun", required=True)
    p.add_argument("--fake-worker", required=True)
    return p.parse_known_args()


def run(dtrun, args, timeout=120, env=None):
    """Runs dtrun to completion; returns (exit code, stdout, stderr)."""
    full_env = dict(os.environ, **(env or {}))
    p = subprocess.run([dtrun] + args, capture_output=True, text=True,
                       timeout=timeout, env=full_env)
    return p.returncode, p.stdout, p.stderr


def start(dtrun, args, env=None):
    full_env = dict(os.environ, **(env or {}))
    return subprocess.Popen([dtrun] + args, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=full_env)


def alive(pid):
    """True while `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_for(predicate, timeout, step=0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


def read_pids(folder):
    """{(rank, restart): pid} from fake_worker --pid-dir files."""
    out = {}
    for name in os.listdir(folder):
        if name.startswith("pid_") and not name.endswith(".tmp"):
            _, rank, restart = name.split("_")
            with open(os.path.join(folder, name)) as f:
                out[(int(rank), int(restart))] = int(f.read())
    return out


def kill_all(pids):
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


class WorkerTestCase(unittest.TestCase):
    """A temporary folder per test (self.dir); worker pids written there with
    --pid-dir are killed at the end."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        kill_all(read_pids(self.dir).values())
        self.tmp.cleanup()
