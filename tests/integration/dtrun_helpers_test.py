"""The real dtrun binary with tests/helpers/fake_worker as its workers."""
import json
import os
import signal
import sys
import time
import unittest

from dtrun_proc import (WorkerTestCase, alive, parse_args, read_pids, run, start,
                        wait_for)

ARGS, REST = parse_args()
DTRUN, WORKER = ARGS.dtrun, ARGS.fake_worker


class DtrunWithHelperWorkers(WorkerTestCase):
    def test_env_contract_for_four_workers(self):
        rc, out, err = run(DTRUN, ["--nproc-per-node=4", "--rdzv-id=job42", "--role=trainer",
                                   WORKER, "--env-dir", self.dir],
                           env={"OMP_NUM_THREADS": ""})
        self.assertEqual(rc, 0, err)
        ports = set()
        for rank in range(4):
            with open(os.path.join(self.dir, f"env_{rank}")) as f:
                env = dict(line.rstrip("\n").split("=", 1) for line in f if "=" in line)
            self.assertEqual(env["RANK"], str(rank))
            self.assertEqual(env["LOCAL_RANK"], str(rank))
            self.assertEqual(env["ROLE_RANK"], str(rank))
            self.assertEqual(env["GROUP_RANK"], "0")
            self.assertEqual(env["WORLD_SIZE"], "4")
            self.assertEqual(env["LOCAL_WORLD_SIZE"], "4")
            self.assertEqual(env["ROLE_WORLD_SIZE"], "4")
            self.assertEqual(env["GROUP_WORLD_SIZE"], "1")
            self.assertEqual(env["ROLE_NAME"], "trainer")
            self.assertEqual(env["MASTER_ADDR"], "127.0.0.1")
            self.assertEqual(env["TORCHELASTIC_RUN_ID"], "job42")
            self.assertEqual(env["TORCHELASTIC_RESTART_COUNT"], "0")
            self.assertEqual(env["TORCHELASTIC_MAX_RESTARTS"], "0")
            self.assertEqual(env["TORCHELASTIC_USE_AGENT_STORE"], "True")
            self.assertTrue(env["TORCHELASTIC_ERROR_FILE"].endswith(f"/attempt_0/{rank}/error.json"))
            self.assertEqual(env["OMP_NUM_THREADS"], "")  # the user's (empty) value is kept
            self.assertNotIn("NCCL_ASYNC_ERROR_HANDLING", env)  # deprecated in torch >= 2.2
            self.assertEqual(env["TORCH_NCCL_ASYNC_ERROR_HANDLING"], "1")
            ports.add(env["MASTER_PORT"])
        self.assertEqual(len(ports), 1)

    def test_worker_exit_code_is_dtruns_exit_code(self):
        rc, out, err = run(DTRUN, ["--nproc-per-node=3", WORKER,
                                   "--only-rank", "1", "--exit", "7"])
        self.assertEqual(rc, 7)
        self.assertIn("FAILED", err)
        self.assertIn("rank      : 1 (local_rank: 1)", err)
        self.assertIn("exitcode  : 7", err)
        self.assertIn("exit code : 7", err)

    def test_worker_killing_itself_is_named(self):
        rc, out, err = run(DTRUN, ["--nproc-per-node=2", WORKER, "--only-rank", "0",
                                   "--kill-self", "9"])
        self.assertEqual(rc, 128 + 9)
        self.assertIn("SIGKILL", err)
        self.assertIn("Signal 9 (SIGKILL) received by PID", err)

    def test_fail_once_then_succeed_with_one_restart(self):
        rc, out, err = run(DTRUN, ["--nproc-per-node=2", "--max-restarts=1", WORKER,
                                   "--pid-dir", self.dir, "--wait-pids", "2", "--only-rank", "1",
                                   "--fail-once", self.dir])
        self.assertEqual(rc, 0, err)
        pids = read_pids(self.dir)
        self.assertEqual(sorted(pids), [(0, 0), (0, 1), (1, 0), (1, 1)])
        self.assertIn("restarting the worker group: attempt 2 of 2", err)

    def test_always_failing_uses_every_restart_then_reports(self):
        rc, out, err = run(DTRUN, ["--nproc-per-node=2", "--max-restarts=2", WORKER,
                                   "--pid-dir", self.dir, "--only-rank", "0",
                                   "--error-file", "loss is NaN"])
        self.assertEqual(rc, 1)
        self.assertEqual({r for _, r in read_pids(self.dir)}, {0, 1, 2})
        self.assertIn("attempts  : 3 (--max-restarts=2)", err)
        self.assertIn("RuntimeError: loss is NaN", err)
        self.assertIn("/attempt_2/0/error.json", err)

    def test_root_cause_error_file_for_the_scheduler(self):
        path = os.path.join(self.dir, "agent_error.json")
        rc, _, err = run(DTRUN, ["--nproc-per-node=2", WORKER, "--only-rank", "1",
                                 "--error-file", "bad shard"],
                         env={"TORCHELASTIC_ERROR_FILE": path})
        self.assertEqual(rc, 1)
        with open(path) as f:
            record = json.load(f)
        self.assertEqual(record["message"]["errorCode"], 1)
        self.assertIn("bad shard", record["message"]["message"])

    def test_sigterm_stops_every_worker_within_the_grace_period(self):
        p = start(DTRUN, ["--nproc-per-node=3", "--term-timeout=1", WORKER,
                          "--pid-dir", self.dir, "--ignore-term", "--hang"])
        self.assertTrue(wait_for(lambda: len(read_pids(self.dir)) == 3, 10))
        pids = list(read_pids(self.dir).values())
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=10)
        elapsed = time.monotonic() - t0
        self.assertEqual(p.returncode, 128 + signal.SIGTERM)
        self.assertTrue(all(not alive(pid) for pid in pids))
        self.assertGreaterEqual(elapsed, 0.9)  # they ignored SIGTERM: SIGKILL after 1 s
        self.assertLess(elapsed, 5)

    def test_sigint_is_forwarded_to_workers(self):
        p = start(DTRUN, ["--nproc-per-node=2", WORKER, "--pid-dir", self.dir, "--hang"])
        self.assertTrue(wait_for(lambda: len(read_pids(self.dir)) == 2, 10))
        pids = list(read_pids(self.dir).values())
        p.send_signal(signal.SIGINT)
        p.communicate(timeout=10)
        self.assertEqual(p.returncode, 128 + signal.SIGINT)
        self.assertTrue(all(not alive(pid) for pid in pids))

    def test_no_orphan_survives_kill_9_of_dtrun(self):
        p = start(DTRUN, ["--nproc-per-node=2", WORKER, "--pid-dir", self.dir,
                          "--ignore-term", "--hang"])
        self.assertTrue(wait_for(lambda: len(read_pids(self.dir)) == 2, 10))
        pids = list(read_pids(self.dir).values())
        p.kill()
        p.communicate(timeout=10)
        self.assertTrue(wait_for(lambda: all(not alive(pid) for pid in pids), 5))

    def test_partial_lines_are_never_interleaved(self):
        rc, out, err = run(DTRUN, ["--nproc-per-node=3", "--label-ranks", WORKER, "--partial",
                                   "abcdefghij-abcdefghij", "--lines", "50"])
        self.assertEqual(rc, 0, err)
        lines = out.splitlines()
        for rank in range(3):
            mine = [l for l in lines if l.startswith(f"[rank{rank}]:")]
            self.assertIn(f"[rank{rank}]:abcdefghij-abcdefghij" + "line 0 from rank "
                          + str(rank), mine)
            self.assertEqual(len(mine), 50)
        self.assertTrue(all(l.startswith("[rank") for l in lines))

    def test_redirects_tee_log_dir_and_filter(self):
        logs = os.path.join(self.dir, "logs")
        rc, out, err = run(DTRUN, ["--nproc-per-node=2", "--log-dir", logs, "-r", "0:1",
                                   "-t", "1:3", WORKER, "--lines", "2", "--stderr", "warn"])
        self.assertEqual(rc, 0, err)
        self.assertNotIn("from rank 0", out)          # redirected to its file only
        self.assertIn("[default1]:line 1 from rank 1\n", out)  # tee'd: console and file
        self.assertIn("\nwarn\n", "\n" + err)  # neither: as the worker wrote it
        (run_dir,) = os.listdir(logs)
        attempt = os.path.join(logs, run_dir, "attempt_0")
        with open(os.path.join(attempt, "0", "stdout.log")) as f:
            self.assertEqual(f.read(), "line 0 from rank 0\nline 1 from rank 0\n")
        with open(os.path.join(attempt, "1", "stderr.log")) as f:
            self.assertEqual(f.read(), "warn\n")
        rc, out, _ = run(DTRUN, ["--nproc-per-node=2", "--local-ranks-filter=1", WORKER,
                                 "--lines", "1"])
        self.assertEqual(out, "line 0 from rank 1\n")

    def test_bad_flags_exit_2_naming_the_flag(self):
        rc, _, err = run(DTRUN, ["--nproc-per-node=lots", WORKER])
        self.assertEqual(rc, 2)
        self.assertIn("--nproc-per-node", err)
        rc, _, err = run(DTRUN, ["--no-such-flag", WORKER])
        self.assertEqual(rc, 2)
        self.assertIn("--no-such-flag", err)
        rc, _, err = run(DTRUN, ["./does-not-exist"])
        self.assertEqual(rc, 2)
        self.assertIn("does-not-exist", err)

    def test_busy_master_port_is_a_store_error(self):
        first = start(DTRUN, ["--nproc-per-node=1", "--master-port=0", WORKER,
                              "--env-dir", self.dir, "--sleep-ms", "3000"])
        try:
            self.assertTrue(wait_for(lambda: os.path.exists(os.path.join(self.dir, "env_0")), 10))
            with open(os.path.join(self.dir, "env_0")) as f:
                port = [l.split("=")[1].strip() for l in f if l.startswith("MASTER_PORT=")][0]
            rc, _, err = run(DTRUN, ["--master-port", port, WORKER])
            self.assertEqual(rc, 3)
            self.assertIn("Address already in use", err)
        finally:
            first.kill()
            first.communicate()

    def test_two_standalone_jobs_at_once(self):
        jobs = []
        for i in range(2):
            d = os.path.join(self.dir, str(i))
            os.mkdir(d)
            jobs.append((d, start(DTRUN, ["--standalone", "--nproc-per-node=2", WORKER,
                                          "--env-dir", d, "--sleep-ms", "300"])))
        ports = set()
        for d, p in jobs:
            _, err = p.communicate(timeout=30)
            self.assertEqual(p.returncode, 0, err)
            with open(os.path.join(d, "env_0")) as f:
                ports.update(l.strip() for l in f if l.startswith("MASTER_PORT="))
        self.assertEqual(len(ports), 2)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]] + REST, verbosity=2)
