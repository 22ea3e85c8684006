"""dtrun --hang-timeout and torch's file-timer watchdog with real workers:
detection, every rank's stack, the root cause, restarts, exit code 124."""
import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import unittest

p = argparse.ArgumentParser()
p.add_argument("--dtrun", required=True)
p.add_argument("--python", default="/usr/bin/python3")
p.add_argument("--require-torch", action="store_true", help="fail, not skip, without torch")
ARGS, REST = p.parse_known_args()
HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "hang_worker.py")
HUNG = re.compile(r"local_rank (\d+) \(pid \d+\) is hung: no heartbeat for ([\d.]+) s")


def has_torch():
    ok = subprocess.run([ARGS.python, "-c", "import torch"], capture_output=True).returncode == 0
    if not ok and ARGS.require_torch:
        sys.exit(f"{ARGS.python} cannot import torch (for torch 2.6: run scripts/torch2.sh)")
    return ok


class HangTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.env = dict(os.environ, BEAT_LOG=os.path.join(self.tmp.name, "beat"))

    def tearDown(self):
        self.tmp.cleanup()

    def dtrun(self, *args, timeout=120):
        cmd = [ARGS.dtrun, "--python", ARGS.python, "--log-dir", self.tmp.name, *args]
        start = time.monotonic()
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=self.env)
        return p.returncode, p.stdout, p.stderr, time.monotonic() - start

    def test_wedged_worker_is_found_with_its_stack_and_the_group_restarts(self):
        rc, out, err, _ = self.dtrun("--nproc-per-node=2", "--hang-timeout=2", "--max-restarts=1",
                                     WORKER, "wedge", "20", "1", "5")
        self.assertEqual(rc, 0, err)
        m = HUNG.search(err)
        self.assertIsNotNone(m, err)
        self.assertEqual(m.group(1), "1")
        self.assertGreaterEqual(float(m.group(2)), 2.0)
        self.assertLess(float(m.group(2)), 2.0 + 3, err)  # margin for a loaded machine
        self.assertIn("Root cause (stopped first / lowest step): rank 1", err)
        self.assertIn("last step 5", err)
        self.assertRegex(err, r"File \".*hang_worker.py\", line \d+ in wedged")
        stack_file = re.search(r"whole stack: (\S+)", err).group(1)
        with open(stack_file) as f:
            self.assertIn("in wedged", f.read())
        self.assertIn("finished rank 0 attempt 1", out)
        self.assertIn("finished rank 1 attempt 1", out)

    def test_no_kill_before_the_first_beat_allowance_and_a_hang_exits_124(self):
        rc, out, err, secs = self.dtrun("--nproc-per-node=2", "--hang-timeout=1",
                                        "--hang-first-beat=5", WORKER, "silent", "2")
        self.assertEqual(rc, 124, err)
        self.assertIn("finished rank 0", out)  # silent 2 s > timeout, not killed
        self.assertGreaterEqual(secs, 5.0)
        self.assertIn("no heartbeat yet, after", err)
        self.assertIn("exit code : 124", err)

    def test_without_the_flag_beats_and_faulthandler_are_given_but_no_timer(self):
        rc, out, _, _ = self.dtrun(WORKER, "env")
        self.assertEqual(rc, 0)
        # The beat file feeds --status and the straggler scores in any job.
        self.assertRegex(out, r"DTRUN_HEARTBEAT_FILE=\S+/attempt_0/0/heartbeat")
        self.assertIn("PYTHONFAULTHANDLER=1", out)  # Python workers: on by default
        self.assertIn("TORCHELASTIC_TIMER_FILE=<unset>", out)
        rc, out, _, _ = self.dtrun("--hang-timeout=5", WORKER, "env")
        self.assertRegex(out, r"DTRUN_HEARTBEAT_FILE=\S+/attempt_0/0/heartbeat")
        self.assertIn("PYTHONFAULTHANDLER=1", out)

    @unittest.skipUnless(has_torch(), "needs torch")
    def test_gloo_collective_hang_names_rank1_root_cause_and_rank0_waiting(self):
        rc, out, err, _ = self.dtrun("--nproc-per-node=2", "--hang-timeout=3", "--max-restarts=1",
                                     WORKER, "collective", "3", timeout=200)
        self.assertEqual(rc, 0, err)
        report = err[err.index("HANG on attempt 0"):]
        root = report[report.index("Root cause"):]
        self.assertTrue(root.startswith("Root cause (stopped first / lowest step): rank 1"), report)
        self.assertIn("in diverged", root.split("\nrank 0")[0])
        waiting = report[report.index("\nrank 0"):]
        self.assertRegex(waiting, r"waiting: no heartbeat for [\d.]+ s, last step 3")
        self.assertIn("in all_reduce", waiting)
        self.assertIn("finished rank 1 attempt 1", out)

    @unittest.skipUnless(has_torch(), "needs torch")
    def test_beats_after_the_collective_the_stacks_name_the_sleeper(self):
        # Every rank last beat the same step: the beats cannot tell. The
        # sleeper's stack is in its own code, the others' in all_reduce.
        for nproc, sleeper in ((2, 1), (3, 0), (3, 2)):
            with self.subTest(nproc=nproc, sleeper=sleeper):
                rc, out, err, _ = self.dtrun(f"--nproc-per-node={nproc}", "--hang-timeout=3",
                                             "--max-restarts=1", WORKER, "after", "5",
                                             str(sleeper), timeout=200)
                self.assertEqual(rc, 0, err)
                report = err[err.index("HANG on attempt 0"):]
                root = report[report.index("Root cause"):]
                self.assertTrue(root.startswith(
                    f"Root cause (stopped first / lowest step): rank {sleeper}"), report)
                self.assertIn("in diverged", root.split("\nrank ")[0])
                for rank in set(range(nproc)) - {sleeper}:
                    block = report[report.index(f"\nrank {rank} "):]
                    self.assertRegex(block, r"^\nrank \d+ .*\n  waiting: no heartbeat for "
                                     r"[\d.]+ s, last step 4", report)
                    self.assertIn("in all_reduce", block.split("\nrank ")[1])
                for rank in range(nproc):
                    self.assertIn(f"finished rank {rank} attempt 1", out)

    def test_a_crash_loop_stops_after_restarts_without_progress_with_93(self):
        rc, out, err, _ = self.dtrun("--nproc-per-node=2", "--max-restarts=10",
                                     "--max-restarts-without-progress=2", "--term-timeout=2",
                                     WORKER, "crash", "5", "0")
        self.assertEqual(rc, 93, err)
        self.assertIn("2 restart(s) in a row beat no step past step 5", err)
        self.assertIn("do not requeue", err)
        # attempt 0 reached step 5, attempts 1 and 2 did not pass it: 3 in all
        self.assertIn("restarting the worker group: attempt 3 of 11", err)
        self.assertNotIn("attempt 4 of 11", err)

    def test_restarts_that_get_further_are_progress(self):
        rc, out, err, _ = self.dtrun("--nproc-per-node=2", "--max-restarts=3",
                                     "--max-restarts-without-progress=1", "--term-timeout=2",
                                     WORKER, "crash", "5", "2")
        self.assertEqual(rc, 1, err)  # the restarts ran out: the worker's code
        self.assertIn("restarting the worker group: attempt 4 of 4", err)
        self.assertNotIn("no progress", err)

    def two_nodes(self, hang_timeout, *worker_args):
        """Two loopback nodes of 2 workers each (global ranks 2 and 3 on the
        second), restarted once; both must exit 0. Their stdout and stderr,
        each joined."""
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        # A 2 s silent limit: a node busy with its hang report (stack dumps)
        # on a loaded 2-core machine must not look dead at 0.6 s.
        fast = "keep_alive_interval=0.5,keep_alive_max_attempt=4,last_call_timeout=0.5,join_timeout=30"
        procs = []
        for node, addr in enumerate(("127.0.0.2", "127.0.0.3")):
            cmd = [ARGS.dtrun, "--python", ARGS.python, "--nnodes=2", "--nproc-per-node=2",
                   "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=hang",
                   f"--rdzv-conf={fast}", f"--local-addr={addr}", f"--node-rank={node}",
                   "--max-restarts=1", f"--hang-timeout={hang_timeout}", WORKER, *worker_args]
            procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True, env=self.env))
        results = []
        for proc in procs:
            try:
                results.append(proc.communicate(timeout=150))
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.communicate()
        out = results[0][0] + results[1][0]
        err = results[0][1] + results[1][1]
        self.assertEqual([p.returncode for p in procs], [0, 0], err)
        for rank in range(4):
            self.assertIn(f"finished rank {rank} attempt 1", out)
        return out, err

    def test_hang_on_node_1_restarts_the_round_on_both_nodes(self):
        _, err = self.two_nodes(2, "wedge", "100", "3", "5")
        self.assertIn("HANG on attempt 0", err)
        self.assertIn("Root cause (stopped first / lowest step): rank 3", err)

    @unittest.skipUnless(has_torch(), "needs torch")
    def test_two_nodes_the_sleeper_on_either_node_is_the_root_cause(self):
        # Every rank of both nodes last beat step 4; the sleeper's node may
        # not be the one that declares the hang: the nodes share their
        # ranks' stacks through the store before anything is stopped.
        for sleeper in (3, 0):
            with self.subTest(sleeper=sleeper):
                _, err = self.two_nodes(3, "after", "5", str(sleeper))
                reports = re.findall(r"HANG on attempt 0.*?\n={60}", err, re.S)
                self.assertTrue(reports, err)
                for report in reports:
                    root = report[report.index("Root cause"):]
                    self.assertTrue(root.startswith(
                        f"Root cause (stopped first / lowest step): rank {sleeper} "), report)
                    self.assertIn("in diverged", root.split("\nrank ")[0])
                    for rank in set(range(4)) - {sleeper}:
                        block = report[report.index(f"\nrank {rank} "):].split("\nrank ")[1]
                        self.assertIn("waiting: no heartbeat for", block, report)
                        self.assertIn("in all_reduce", block, report)
                self.assertRegex(err, r"hang root cause, weighing 4 ranks on 2 node\(s\): "
                                 rf"rank {sleeper} ")

    @unittest.skipUnless(has_torch(), "needs torch")
    def test_torch_file_timer_kills_stuck_here_within_a_second_of_expiry(self):
        self.env["TORCHELASTIC_ENABLE_FILE_TIMER"] = "1"
        rc, out, err, _ = self.dtrun("--nproc-per-node=1", WORKER, "timer", timeout=200)
        self.assertEqual(rc, 124, err)
        m = re.search(r"file timer '([^']*)' of pid \d+ expired", err)
        self.assertIsNotNone(m, err)
        self.assertIn("#", m.group(1))  # torch's default scope: file#line
        self.assertIn("torch file timer", err)
        self.assertRegex(err, r"File \".*hang_worker.py\", line \d+ in stuck_here")
        with open(re.search(r"whole stack: (\S+)", err).group(1)) as f:
            self.assertIn("stuck_here", f.read())
        # Killed within 1 s of expiry: the worker logged its acquire time.
        with open(self.env["BEAT_LOG"] + ".timer") as f:
            acquired = float(f.read())
        killed = float(re.search(r"expired at ([\d.]+), killed at ([\d.]+)", err).group(2))
        self.assertLess(killed - (acquired + 1), 1.0)
        self.assertGreaterEqual(killed - (acquired + 1), -0.05)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]] + REST)
