"""Runs the dtrun binary for integration tests and checks processes by pid."""
import argparse
import os
import re
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
        if name.startswith("pid_"):  # temporaries are hidden (".pid_...")
            _, rank, restart = name.split("_")
            with open(os.path.join(folder, name)) as f:
                out[(int(rank), int(restart))] = int(f.read())
    return out


def check_torchrun_env(test, env, rank, world, local_rank=None, local_world=None,
                       group_rank=0, group_world=1, restart=0, max_restarts=0,
                       run_id="none", role="default"):
    """Asserts every variable of torchrun's worker contract in `env` (one
    worker's environment) for a single-role job."""
    local_rank = rank if local_rank is None else local_rank
    local_world = world if local_world is None else local_world
    want = {
        "RANK": rank, "LOCAL_RANK": local_rank, "GROUP_RANK": group_rank,
        "ROLE_RANK": rank, "ROLE_NAME": role, "LOCAL_WORLD_SIZE": local_world,
        "WORLD_SIZE": world, "GROUP_WORLD_SIZE": group_world, "ROLE_WORLD_SIZE": world,
        "TORCHELASTIC_RESTART_COUNT": restart, "TORCHELASTIC_MAX_RESTARTS": max_restarts,
        "TORCHELASTIC_RUN_ID": run_id, "TORCHELASTIC_USE_AGENT_STORE": "True",
    }
    for key, value in want.items():
        test.assertEqual(env.get(key), str(value), f"{key} of rank {rank}")
    test.assertTrue(env.get("MASTER_ADDR"), "MASTER_ADDR")
    test.assertTrue(0 < int(env.get("MASTER_PORT", "0")) < 65536, "MASTER_PORT")
    test.assertTrue(env.get("TORCHELASTIC_ERROR_FILE", "").endswith(
        f"/attempt_{restart}/{local_rank}/error.json"), "TORCHELASTIC_ERROR_FILE")
    if local_world > 1 and "OMP_NUM_THREADS" not in os.environ:
        test.assertEqual(env.get("OMP_NUM_THREADS"), "1")
    new = os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    test.assertEqual(env.get("TORCH_NCCL_ASYNC_ERROR_HANDLING"), new)
    # The deprecated name: the user's, else only for torch < 2.2, where the
    # shim copies the new name's value once torch.distributed is imported.
    old = os.environ.get("NCCL_ASYNC_ERROR_HANDLING")
    version = tuple(int(v) for v in env.get("torch.__version__", "2.2").split(".")[:2])
    if old is None and version >= (2, 2):
        test.assertNotIn("NCCL_ASYNC_ERROR_HANDLING", env)
    else:
        test.assertEqual(env.get("NCCL_ASYNC_ERROR_HANDLING"), old or new)


def kill_all(pids):
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def stop_all(procs, timeout=30):
    """SIGTERM to every process still running (dtrun stops its workers),
    SIGKILL to one that outlives `timeout`."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


class WorkerTestCase(unittest.TestCase):
    """A temporary folder per test (self.dir); worker pids written there with
    --pid-dir are killed at the end."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        kill_all(read_pids(self.dir).values())
        self.tmp.cleanup()


class NodesTestCase(WorkerTestCase):
    """WorkerTestCase that also kills the dtrun agents a test started and kept
    in self.procs (several nodes), before their workers."""

    def setUp(self):
        super().setUp()
        self.procs = []

    def tearDown(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
        super().tearDown()


def rank_ordered(text):
    """Streamed output shows each rank's lines as they come, so two ranks'
    lines may interleave either way: their labelled lines in rank order
    (each rank's own order kept), every other line where it was."""
    lines = text.split("\n")
    at = [i for i, line in enumerate(lines) if re.match(r"\[rank \d+\] ", line)]
    ranked = sorted((lines[i] for i in at), key=lambda line: int(line[6:line.index("]")]))
    for i, line in zip(at, ranked):
        lines[i] = line
    return "\n".join(lines)
