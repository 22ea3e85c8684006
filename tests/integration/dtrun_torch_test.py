"""The real dtrun binary launching Debian's Python torch workers (gloo)."""
import glob
import json
import os
import re
import signal
import subprocess
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


TRAIN = os.path.join(HERE, "py_train_worker.py")
TRAIN_ARGS = ["8", "--width", "64", "--layers", "2"]
SHA = re.compile(r"params_sha256=([0-9a-f]{64})")
RECOVERED = re.compile(r"recovered in [0-9.]+ s: detect [0-9.]+, regroup [0-9.]+, start [0-9.]+, "
                       r"init [0-9.]+, load [0-9.]+, first step [0-9.]+ \(from step 4, disk\)")
STANDBY = "--standby-import=torch,torch.distributed"


def standby_restart(test, dtrun, python, timeout=120):
    """A Python DDP run (py_train_worker.py) undisturbed, then the same run
    with rank 1 SIGKILLed after step 3 once dtrun's standby is ready: the
    restarted workers come from the standby, the recovery is reported whole,
    and the parameters end bitwise equal. Returns the second run's stderr."""
    ref = os.path.join(test.dir, "ref")
    os.makedirs(ref)
    rc, out, err = run(dtrun, python + ["--nproc-per-node=2", TRAIN, ref] + TRAIN_ARGS,
                       timeout=timeout)
    test.assertEqual(rc, 0, err)
    want = SHA.search(out).group(1)
    ckpt, trigger = os.path.join(test.dir, "ckpt"), os.path.join(test.dir, "kill")
    os.makedirs(ckpt)
    err_path = os.path.join(test.dir, "stderr")
    with open(err_path, "w") as err_file:
        p = subprocess.Popen([dtrun] + python + ["--nproc-per-node=2", "--max-restarts=1",
                                                 STANDBY, TRAIN, ckpt] + TRAIN_ARGS +
                             ["--kill-at", "3", "--kill-when", trigger],
                             stdout=subprocess.PIPE, stderr=err_file, text=True)
    read_err = lambda: open(err_path).read()  # noqa: E731
    try:
        ready = wait_for(lambda: "the standby is ready" in read_err() or p.poll() is not None,
                         timeout)
        test.assertTrue(ready and p.poll() is None, read_err())
        open(trigger, "w").close()
        out, _ = p.communicate(timeout=timeout)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    err = read_err()
    test.assertEqual(p.returncode, 0, err)
    test.assertIn("attempt 1: started 2 worker(s)", err)
    test.assertIn("(2 from the standby)", err)
    test.assertRegex(err, RECOVERED)
    test.assertEqual(SHA.search(out).group(1), want, err)
    return err


class StandbyWorkers(WorkerTestCase):
    """--standby-import: restarted Python workers forked from a standby that
    imported torch, or, when it cannot be, started cold saying why."""

    def test_a_killed_worker_restarts_from_the_standby_bitwise(self):
        standby_restart(self, DTRUN, PY)

    def test_a_hung_worker_from_the_standby_is_found_and_its_stack_kept(self):
        # --hang-timeout gives each worker PYTHONFAULTHANDLER=1, read when an
        # interpreter starts: the standby's worker applies it after the fork
        # (not a refusal), and dtrun's SIGABRT to its group prints its stack.
        logs = os.path.join(self.dir, "logs")
        rc, _, err = run(DTRUN, PY + ["--nproc-per-node=2", "--max-restarts=1",
                                      "--hang-timeout=4", "--hang-first-beat=4",
                                      "--log-dir", logs, STANDBY, WORKER, "hang", self.dir],
                         timeout=120)
        self.assertNotEqual(rc, 0, err)
        self.assertIn("attempt 1: started 2 worker(s)", err)
        self.assertIn("(2 from the standby)", err)
        self.assertNotIn("differs between the worker", err)
        stacks = glob.glob(os.path.join(logs, "*", "attempt_1", "*", "stack.txt"))
        self.assertEqual(len(stacks), 2, err)
        for path in stacks:
            with open(path) as f:
                self.assertIn("torch_worker.py", f.read())

    def test_a_module_that_starts_a_thread_is_refused_and_workers_start_cold(self):
        with open(os.path.join(self.dir, "spinner.py"), "w") as f:
            f.write("import threading, time\n"
                    "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n")
        rc, out, err = run(DTRUN, PY + ["--nproc-per-node=2", "--max-restarts=1",
                                        "--standby-import=spinner", WORKER, "fail-once",
                                        self.dir], env={"PYTHONPATH": self.dir})
        self.assertEqual(rc, 0, err)
        self.assertIn("--standby-import: the standby runs 2 threads after its imports", err)
        self.assertIn("workers start cold from now on", err)
        self.assertNotIn("from the standby)", err)
        self.assertIn("sum=3 attempt=1 OK", out)

    def test_a_restart_waiting_for_the_standby_hears_a_signal_at_once(self):
        # The standby's import takes a minute, so the restart after rank 1's
        # failure waits for it (20 s on a node alone); a SIGTERM then ends
        # the wait and the job within seconds, and neither rank waits again.
        with open(os.path.join(self.dir, "slow_import.py"), "w") as f:
            f.write("import time\ntime.sleep(60)\n")
        p = start(DTRUN, PY + ["--nproc-per-node=2", "--max-restarts=1",
                               "--standby-import=slow_import", WORKER, "fail-once", self.dir],
                  env={"PYTHONPATH": self.dir})
        err = []

        def restarting():
            line = p.stderr.readline()
            err.append(line)
            return "restarting the worker group" in line or not line
        try:
            self.assertTrue(wait_for(restarting, 60, step=0), "".join(err))
            time.sleep(1)  # into the wait
            t0 = time.monotonic()
            p.send_signal(signal.SIGTERM)
            _, rest = p.communicate(timeout=60)
            elapsed = time.monotonic() - t0
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        err = "".join(err) + rest
        self.assertEqual(p.returncode, 128 + signal.SIGTERM, err)
        self.assertLess(elapsed, 8, err)
        # Each rank started cold twice: the first start and the restart.
        self.assertEqual(err.count("the standby is still importing; started cold"), 4, err)
        self.assertIn("received SIGTERM", err)

    def test_a_module_that_does_not_import_is_named(self):
        rc, out, err = run(DTRUN, PY + ["--nproc-per-node=1", "--standby-import=no_such_mod_x",
                                        WORKER, "allreduce"])
        self.assertEqual(rc, 0, err)
        self.assertIn("importing no_such_mod_x failed: ModuleNotFoundError", err)

    def test_bad_values_exit_2_naming_the_flag(self):
        rc, _, err = run(DTRUN, PY + ["--standby-import=torch,,numpy", WORKER, "allreduce"])
        self.assertEqual(rc, 2)
        self.assertIn("--standby-import: '' is not a module name", err)
        rc, _, err = run(DTRUN, ["--standby-import=torch", "--no-python", "/bin/true"])
        self.assertEqual(rc, 2)
        self.assertIn("--standby-import: the workers do not run Python", err)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]] + REST, verbosity=2)
