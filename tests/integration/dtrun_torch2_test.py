"""The host-built dtrun launching Debian's torch 2.6 workers, which run in the
trixie root made by scripts/torch2.sh (through scripts/torch2-python), and
the torch compatibility shim that lets those workers join dtrun's store with
no help from the user; then torch 1.13 on the host, where the shim changes
nothing.

The root is required: a missing one fails every test, saying how to make it."""
import json
import os
import signal
import subprocess
import sys
import time
import unittest

from dtrun_proc import (NodesTestCase, WorkerTestCase, alive, check_torchrun_env, parse_args, read_pids, run,
                        start, wait_for)

ARGS, REST = parse_args()
DTRUN = os.path.abspath(ARGS.dtrun)
FAKE = os.path.abspath(ARGS.fake_worker)
HERE = os.path.dirname(os.path.abspath(__file__))
CHECKOUT = os.path.normpath(os.path.join(HERE, "..", ".."))
# The peer: torch 2.6 (scripts/torch2.sh, trixie) unless DTRUN_TORCH_PEER
# names another root's script: torch214 (scripts/torch214.sh, forky).
PEER = os.environ.get("DTRUN_TORCH_PEER", "torch2")
PEER_VERSION = {"torch2": "2.6", "torch214": "2.14"}[PEER]
PEER_PYTHON = {"torch2": "(3, 13)", "torch214": "(3, 14)"}[PEER]
TORCH2_SH = os.path.join(CHECKOUT, "scripts", f"{PEER}.sh")
PYTHON2 = os.path.join(CHECKOUT, "scripts", f"{PEER}-python")
PY2 = ["--python", PYTHON2]
PY1 = ["--python", "/usr/bin/python3"]
WORKER = os.path.join(HERE, "torch_worker.py")
ALLREDUCE = os.path.join(CHECKOUT, "examples", "allreduce_check.py")
LIBUV_ERROR = "use_libuv was requested but PyTorch was build without libuv support"
SLOW = 300  # seconds for a job of torch 2.6 workers on a busy machine
# Workers run in the root, in dtrun's folder: the checkout is visible there.
os.chdir(CHECKOUT)

import dtrun_interactive_test as interactive  # noqa: E402 (its Console; needs --dtrun)
import dtrun_torch_test as torch_test  # noqa: E402 (the standby's restart check)
from dtrun_multinode_test import FAST, free_port  # noqa: E402

# What a worker sees of the shim: before torch is imported, after, and when
# it meets a store error that has nothing to do with libuv.
PROBE = r'''
import datetime, json, os, socket, sys
out = {"torch_at_start": "torch" in sys.modules,
       "finders": [type(f).__module__ + "." + type(f).__name__ for f in sys.meta_path]}
import torch, torch.distributed as dist
out["finders_after"] = [type(f).__module__ + "." + type(f).__name__ for f in sys.meta_path]

def store_error(port, **kwargs):
    try:
        dist.TCPStore("127.0.0.1", port, None, False, datetime.timedelta(seconds=1), **kwargs)
    except Exception as e:
        return {"text": str(e), "context": repr(e.__context__)}

with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    closed = s.getsockname()[1]
out.update(version=torch.__version__,
           wrapped=getattr(dist.TCPStore.__init__, "_dtrun_torch_shim", False),
           sitecustomize=getattr(sys.modules.get("sitecustomize"), "__file__", None),
           user_site=os.environ.get("USER_SITECUSTOMIZE_RAN"),
           pythonpath=os.environ.get("PYTHONPATH"),
           shim_dir=os.environ.get("DTRUN_TORCH_SHIM_DIR"),
           closed_port=store_error(closed))
if torch.__version__ >= "2":
    out["explicit_libuv"] = store_error(int(os.environ["MASTER_PORT"]), use_libuv=True)
dist.init_process_group("gloo")
t = torch.ones(4) * (dist.get_rank() + 1)
dist.all_reduce(t)
out["sum"] = t[0].item()
with open(os.path.join(sys.argv[1], f"probe_{os.environ['RANK']}.json"), "w") as f:
    json.dump(out, f)
'''


def setUpModule():
    root = subprocess.run([TORCH2_SH, "path"], capture_output=True, text=True,
                          check=True).stdout.strip()
    if not os.path.exists(os.path.join(root, ".dtrun-packages")):
        raise RuntimeError(f"no torch {PEER_VERSION} root at {root}; make it first (as root, a few "
                           f"minutes): {TORCH2_SH}")


class Torch2Workers(WorkerTestCase):
    def test_env_contract_for_four_workers(self):
        rc, _, err = run(DTRUN, PY2 + ["--nproc-per-node=4", WORKER, "env", self.dir], SLOW)
        self.assertEqual(rc, 0, err)
        for rank in range(4):
            with open(os.path.join(self.dir, f"env_{rank}.json")) as f:
                env = json.load(f)
            check_torchrun_env(self, env, rank, 4)
            self.assertTrue(env["torch.__version__"].startswith(PEER_VERSION + "."),
                            env["torch.__version__"])

    def test_gloo_all_reduce(self):
        rc, out, err = run(DTRUN, PY2 + ["--nproc-per-node=4", WORKER, "allreduce"], SLOW)
        self.assertEqual(rc, 0, err)
        self.assertIn("sum=10 attempt=0 OK", out)

    def test_worker_failing_once_then_succeeding(self):
        # torchrun 2.6 fails this one (its reused store: Gloo connectFullMesh failed).
        rc, out, err = run(DTRUN, PY2 + ["--nproc-per-node=2", "--max-restarts=1", WORKER,
                                         "fail-once", self.dir], SLOW)
        self.assertEqual(rc, 0, err)
        self.assertIn("sum=3 attempt=1 OK", out)
        self.assertIn("simulated crash on rank 1", err)
        self.assertEqual(err.count("restarting the worker group"), 1)

    def test_sigterm_to_dtrun_ends_every_worker_in_the_root(self):
        p = start(DTRUN, PY2 + ["--nproc-per-node=2", "--term-timeout=5", WORKER, "hang",
                                self.dir])
        self.assertTrue(wait_for(lambda: len(read_pids(self.dir)) == 2, SLOW))
        pids = sorted(read_pids(self.dir).values())
        time.sleep(0.5)  # into init_process_group
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=30)
        self.assertEqual(p.returncode, 128 + signal.SIGTERM, err)
        self.assertLess(time.monotonic() - t0, 5.5)
        self.assertTrue(all(not alive(pid) for pid in pids))
        # The pids dtrun started are Python's own (torch2.sh execs chroot).
        started = err.split("started 2 worker(s), pids ")[1].split()[0]
        self.assertEqual(sorted(int(x) for x in started.split(",")), pids)

    def test_a_killed_worker_restarts_from_the_standby_bitwise(self):
        # --standby-import with the root's interpreter: the standby imports
        # torch in the root and forks the workers there.
        err = torch_test.standby_restart(self, DTRUN, PY2, timeout=SLOW)
        self.assertIn("imports torch,torch.distributed", err)

    def test_workers_that_are_not_python_get_no_shim(self):
        rc, _, err = run(DTRUN, ["--nproc-per-node=2", FAKE, "--env-dir", self.dir],
                         env={"PYTHONPATH": "/user/path"})
        self.assertEqual(rc, 0, err)
        for rank in range(2):
            with open(os.path.join(self.dir, f"env_{rank}")) as f:
                env = dict(l.rstrip("\n").split("=", 1) for l in f if "=" in l)
            self.assertEqual(env["PYTHONPATH"], "/user/path")
            self.assertNotIn("DTRUN_TORCH_SHIM_DIR", env)


class Torch2MultiNode(NodesTestCase):
    """Nodes on loopback addresses 127.0.0.2 and 127.0.0.3."""

    def node(self, args, stdout=subprocess.PIPE):
        p = subprocess.Popen([DTRUN] + args, stdout=stdout, stderr=subprocess.PIPE, text=True)
        self.procs.append(p)
        return p

    def static_pair(self, *extra):
        """Two static nodes of 2 workers each running ALLREDUCE; node 0's
        stdout and node 1's stderr, once both exited 0."""
        port = free_port()
        common = PY2 + ["--nnodes=2", "--nproc-per-node=2", "--master-addr=127.0.0.2",
                        f"--master-port={port}", *extra]
        n1 = self.node(common + ["--node-rank=1", "--local-addr=127.0.0.3", ALLREDUCE])
        n0 = self.node(common + ["--node-rank=0", "--local-addr=127.0.0.2", ALLREDUCE])
        out0, err0 = n0.communicate(timeout=SLOW)
        _, err1 = n1.communicate(timeout=SLOW)
        self.assertEqual((n0.returncode, n1.returncode), (0, 0), err0 + err1)
        self.assertIn("all_reduce over 4 ranks: sum=10 expected=10 OK", out0)
        return out0, err1

    def test_static_two_nodes_two_workers_all_reduce(self):
        self.static_pair()

    def test_two_nodes_through_the_store_proxy(self):
        """Node 1's workers (this root's torch) reach the workers' store
        through their dtrun's proxy."""
        _, err1 = self.static_pair("--store-proxy=on")
        self.assertIn("(this node's proxy to it)", err1)

    def test_elastic_one_to_two_nodes_second_joins_later(self):
        # torchrun 2.6 times out on MASTER_ADDR here unless
        # TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1.
        port = free_port()
        common = PY2 + ["--nnodes=1:2", "--nproc-per-node=2", "--rdzv-backend=c10d",
                        f"--rdzv-endpoint=127.0.0.2:{port}", "--rdzv-id=grow",
                        f"--rdzv-conf={FAST}"]
        first_out = os.path.join(self.dir, "first.out")
        with open(first_out, "w") as f:
            first = self.node(common + ["--local-addr=127.0.0.2", WORKER, "grow", "4"], stdout=f)

        def first_says(text):
            with open(first_out) as f:
                return text in f.read()
        self.assertTrue(wait_for(lambda: first_says("sum=3 attempt=0 OK"), SLOW, 0.2),
                        "the first node's 2 workers did not all_reduce alone")
        second = self.node(common + ["--local-addr=127.0.0.3", WORKER, "grow", "4"])
        out2, err2 = second.communicate(timeout=SLOW)
        _, err1 = first.communicate(timeout=60)
        self.assertEqual((first.returncode, second.returncode), (0, 0), err1 + err2)
        with open(first_out) as f:
            out = f.read() + out2
        self.assertRegex(out, r"sum=10 attempt=[1-9]\d* OK", err1 + err2)


class Torch2Interactive(unittest.TestCase):
    def test_session_whose_python_is_the_roots(self):
        c = interactive.Console(2, f"--python={PYTHON2}")
        try:
            c.send("import sys\n%rank 0 print(torch.__version__, sys.version_info[:2])\n"
                   "x = torch.ones(2) * (rank + 1)\ndist.all_reduce(x)\nprint(x)\n"
                   "!echo shell on $rank\n%time y = rank * 3\n"
                   "%rank all --noblock import time; time.sleep(0.5 + rank); y\n"
                   "%result c1 --wait\n%timeline 2\n%status\n")
            self.assertEqual(c.finish(SLOW), 0, c.text())
        finally:
            if c.p.poll() is None:
                c.kill()
        out = c.text()
        self.assertIn(f"[rank 0] {PEER_VERSION}.", out)
        self.assertIn(PEER_PYTHON, out)
        self.assertIn("[rank 0] tensor([3., 3.])\n[rank 1] tensor([3., 3.])", out)
        # Cells through the root's IPython; a non-blocking cell; the timeline.
        self.assertIn("[rank 0] shell on 0\n[rank 1] shell on 1\n", out)
        self.assertRegex(out, r"\[rank 1\] Wall time: ")
        self.assertIn("c1: running on rank(s) 0-1", out)
        self.assertIn("[rank 0] 0\n[rank 1] 3\n", out)
        self.assertRegex(out, r"\[c1\] import time; time\.s\S* +\d+\.\d+ m?s +\d\.\d\d s\* +rank 1")
        self.assertRegex(out, r"cells run through IPython \d+\.\d+\.\d+ on every rank")


class TorchShim(WorkerTestCase):
    def probe(self, python, env=None):
        script = os.path.join(self.dir, "probe.py")
        with open(script, "w") as f:
            f.write(PROBE)
        rc, out, err = run(DTRUN, python + ["--nproc-per-node=2", script, self.dir], SLOW,
                           env=env)
        self.assertEqual(rc, 0, out + err)
        probes = []
        for rank in range(2):
            with open(os.path.join(self.dir, f"probe_{rank}.json")) as f:
                probes.append(json.load(f))
        return probes

    def test_the_shim_is_what_lets_env_workers_join(self):
        rc, out, err = run(DTRUN, PY2 + ["--nproc-per-node=2", WORKER, "allreduce"], SLOW,
                           env={"DTRUN_TORCH_SHIM": "0"})
        self.assertNotEqual(rc, 0, out)
        self.assertIn(LIBUV_ERROR, err)
        rc, out, err = run(DTRUN, PY2 + ["--nproc-per-node=2", WORKER, "allreduce"], SLOW)
        self.assertEqual(rc, 0, err)
        self.assertIn("sum=3 attempt=0 OK", out)

    def test_torch_2_6_waits_for_torch_distributed_and_keeps_explicit_choices(self):
        user = os.path.join(self.dir, "user")
        os.mkdir(user)
        with open(os.path.join(user, "sitecustomize.py"), "w") as f:
            f.write("import os\nos.environ['USER_SITECUSTOMIZE_RAN'] = '1'\n")
        for p in self.probe(PY2, env={"PYTHONPATH": user}):
            self.assertTrue(p["version"].startswith("2.6"), p)
            self.assertFalse(p["torch_at_start"])
            self.assertEqual(p["finders"][0], "sitecustomize._Finder")
            self.assertNotIn("sitecustomize._Finder", p["finders"][1:] + p["finders_after"])
            self.assertTrue(p["wrapped"])
            self.assertEqual(p["pythonpath"], p["shim_dir"] + ":" + user)
            self.assertEqual(p["user_site"], "1")  # the sitecustomize it shadows ran
            self.assertEqual(p["sum"], 3.0)
            self.assertIn(LIBUV_ERROR, p["explicit_libuv"]["text"])  # the caller's choice
            self.assertNotIn("libuv", p["closed_port"]["text"])  # other errors: as they were
            self.assertEqual(p["closed_port"]["context"], "None")

    def test_debians_own_sitecustomize_still_runs(self):
        for p in self.probe(PY2):
            self.assertEqual(p["sitecustomize"], "/usr/lib/python3.13/sitecustomize.py")
            self.assertEqual(p["pythonpath"], p["shim_dir"])

    def test_torch_1_13_on_the_host_is_unchanged(self):
        for p in self.probe(PY1):
            self.assertTrue(p["version"].startswith("1.13"), p)
            self.assertFalse(p["torch_at_start"])
            self.assertFalse(p["wrapped"])  # 1.13's TCPStore has no use_libuv: left alone
            self.assertEqual(p["sitecustomize"], "/usr/lib/python3.11/sitecustomize.py")
            self.assertNotIn("sitecustomize._Finder", p["finders_after"])  # gone once used
            self.assertEqual(p["closed_port"]["context"], "None")
            self.assertEqual(p["sum"], 3.0)
        for p in self.probe(PY1, env={"DTRUN_TORCH_SHIM": "0"}):
            self.assertIsNone(p["shim_dir"])
            self.assertEqual(p["pythonpath"], os.environ.get("PYTHONPATH"))


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]] + REST, verbosity=2)
