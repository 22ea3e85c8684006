"""The real dtrun binary launching Debian's Python torch workers (gloo)."""
import json
import os
import signal
import sys
import time
import unittest

from dtrun_proc import (WorkerTestCase, alive, check_torchrun_env, parse_args, read_pids, run,
                        start, wait_for)

ARGS, REST = parse_args()
DTRUN = ARGS.dtrun
HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "torch_worker.py")
PY = ["--python", "/usr/bin/python3"]


class DtrunWithTorchWorkers(WorkerTestCase):
    def test_env_contract_for_four_workers(self):
        rc, _, err = run(DTRUN, PY + ["--nproc-per-node=4", WORKER, "env", self.dir])
        self.assertEqual(rc, 0, err)
        for rank in range(4):
            with open(os.path.join(self.dir, f"env_{rank}.json")) as f:
                check_torchrun_env(self, json.load(f), rank, 4)

    def test_gloo_all_reduce(self):
        rc, out, err = run(DTRUN, PY + ["--nproc-per-node=4", WORKER, "allreduce"])
        self.assertEqual(rc, 0, err)
        self.assertIn("sum=10 attempt=0 OK", out)

    def test_worker_failing_once_then_succeeding(self):
        rc, out, err = run(DTRUN, PY + ["--nproc-per-node=2", "--max-restarts=1", WORKER,
                                        "fail-once", self.dir])
        self.assertEqual(rc, 0, err)
        self.assertIn("sum=3 attempt=1 OK", out)
        self.assertIn("simulated crash on rank 1", err)

    def test_worker_always_failing_gets_three_attempts_and_a_summary(self):
        rc, _, err = run(DTRUN, PY + ["--nproc-per-node=2", "--max-restarts=2", WORKER,
                                      "always-fail"])
        self.assertEqual(rc, 1)
        self.assertIn("attempts  : 3 (--max-restarts=2)", err)
        self.assertIn("torch_worker.py FAILED", err)
        self.assertIn("ValueError: rank 0 always fails", err)
        self.assertIn("/attempt_2/0/error.json", err)
        self.assertEqual(err.count("restarting the worker group"), 2)

    def test_sigterm_to_dtrun_ends_every_worker(self):
        p = start(DTRUN, PY + ["--nproc-per-node=2", "--term-timeout=5", WORKER, "hang",
                               self.dir])
        self.assertTrue(wait_for(lambda: len(read_pids(self.dir)) == 2, 60))
        pids = list(read_pids(self.dir).values())
        time.sleep(0.5)  # into init_process_group
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=30)
        self.assertEqual(p.returncode, 128 + signal.SIGTERM)
        self.assertLess(time.monotonic() - t0, 5.5)
        self.assertTrue(all(not alive(pid) for pid in pids))

    def test_two_standalone_jobs_at_once(self):
        jobs = [start(DTRUN, PY + ["--standalone", "--nproc-per-node=2", WORKER, "allreduce"])
                for _ in range(2)]
        for p in jobs:
            out, err = p.communicate(timeout=120)
            self.assertEqual(p.returncode, 0, err)
            self.assertIn("sum=3 attempt=0 OK", out)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]] + REST, verbosity=2)
