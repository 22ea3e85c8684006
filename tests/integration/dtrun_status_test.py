"""dtrun --status against live jobs: the jobs on this host, one job by its
run id, its log folder or its store, on one node and on two loopback nodes;
the status' steps move while the job runs."""
import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

from dtrun_proc import stop_all

p = argparse.ArgumentParser()
p.add_argument("--dtrun", required=True)
p.add_argument("--python", default="/usr/bin/python3")
p.add_argument("--fake-worker", default="")
ARGS, REST = p.parse_known_args()
HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "hang_worker.py")
FAST = "keep_alive_interval=0.2,keep_alive_max_attempt=5,last_call_timeout=0.5,join_timeout=30"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class StatusTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        # A registry of this test's own, so other jobs on the host do not show.
        self.env = dict(os.environ, XDG_RUNTIME_DIR=self.tmp.name)
        self.procs = []

    def tearDown(self):
        stop_all(self.procs)
        self.tmp.cleanup()

    def launch(self, *flags):
        # Beats are on with --hang-timeout; the workers beat every 50 ms.
        cmd = [ARGS.dtrun, "--python", ARGS.python, "--hang-timeout=60", *flags,
               WORKER, "wedge", "100000", "99", "99"]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True, env=self.env)
        self.procs.append(proc)
        return proc

    def status(self, *args):
        p = subprocess.run([ARGS.dtrun, "--status", *args], capture_output=True, text=True,
                           env=self.env, timeout=30)
        return p.returncode, p.stdout, p.stderr

    def wait_for(self, what, check, timeout=60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = check()
            if got:
                return got
            time.sleep(0.2)
        self.fail(f"no {what} within {timeout} s")

    def job_json(self, target):
        rc, out, err = self.status(target, "--json")
        if rc != 0:
            return None
        nodes = json.loads(out)["nodes"]
        ranks = [r for n in nodes for r in n["ranks"]]
        return nodes if ranks and all(r["step"] >= 0 for r in ranks) else None

    def on_terminal(self, *flags, steps=150):
        """Runs a 2-worker job under a new terminal (pty); all it printed."""
        import pty
        cmd = [ARGS.dtrun, "--python", ARGS.python, "--nproc-per-node=2", *flags,
               WORKER, "progress", str(steps)]
        pid, fd = pty.fork()
        if pid == 0:
            os.environ.update(self.env, TERM="xterm")
            os.execv(cmd[0], cmd)
        out = b""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: the job is gone
                break
            if not chunk:
                break
            out += chunk
        _, status = os.waitpid(pid, 0)
        os.close(fd)
        self.assertEqual(os.waitstatus_to_exitcode(status), 0, out)
        return out.decode()

    def test_progress_line_on_a_terminal_never_splits_worker_lines(self):
        out = self.on_terminal()
        self.assertRegex(out, r"dtrun: step \d+/150 \(\d+%\)")
        self.assertIn("2/2 up", out)
        # Each erase starts a piece: whole lines, then at most one status
        # line at its end, which the next erase takes away.
        shown = []
        for piece in out.split("\r\x1b[K"):
            lines = piece.split("\r\n")
            if lines[-1]:
                self.assertTrue(lines[-1].startswith("dtrun"), repr(piece))
            shown += lines[:-1]
        for line in shown:
            self.assertNotIn("dtrun: step", line)
            if line.startswith("rank"):
                self.assertRegex(line, r"^rank [01] (line|err) \d+$")
        for rank in (0, 1):
            for step in range(1, 151):
                self.assertIn(f"rank {rank} line {step}", shown)
            self.assertIn(f"rank {rank} err 150", shown)
        self.assertTrue(out.endswith("\r\x1b[K"), repr(out[-200:]))  # erased at the end

    def test_no_progress_line_when_asked_or_when_piped(self):
        out = self.on_terminal("--no-progress", steps=20)
        self.assertNotIn("\x1b", out)
        self.assertIn("rank 1 line 20", out)
        p = subprocess.run([ARGS.dtrun, "--python", ARGS.python, "--nproc-per-node=2",
                            WORKER, "progress", "60"], capture_output=True, text=True,
                           env=self.env, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertNotIn("\x1b", p.stdout + p.stderr)
        self.assertIn("rank 1 line 60", p.stdout)

    def test_one_node_by_run_id_log_folder_and_in_the_list(self):
        logs = os.path.join(self.tmp.name, "logs")
        proc = self.launch("--nproc-per-node=2", "--rdzv-id=statusjob", "--log-dir", logs)
        nodes = self.wait_for("status with steps", lambda: self.job_json("statusjob"))
        self.assertEqual(len(nodes), 1)
        ranks = nodes[0]["ranks"]
        self.assertEqual(sorted(r["rank"] for r in ranks), [0, 1])
        for r in ranks:
            self.assertEqual(r["state"], "running")
            self.assertGreater(r["pid"], 0)
            self.assertGreater(r["rss_mb"], 1)
            self.assertLess(r["beat_age_s"], 5)
        first = {r["rank"]: r["step"] for r in ranks}
        moved = self.wait_for("moving steps", lambda: (
            lambda n: n and all(r["step"] > first[r["rank"]] and r["step_time_median_s"] > 0
                                for r in n[0]["ranks"]) and n)(self.job_json(logs)))
        for r in moved[0]["ranks"]:  # hang_worker sleeps 50 ms a step
            self.assertGreater(r["step_time_median_s"], 0.04)
            self.assertLess(r["step_time_median_s"], 1.0)
        rc, out, _ = self.status()
        self.assertEqual(rc, 0)
        self.assertIn("statusjob", out)
        self.assertIn(str(proc.pid), out)
        rc, out, _ = self.status("statusjob")
        self.assertEqual(rc, 0)
        self.assertIn("node 0 of 1", out)
        self.assertIn("running", out)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        rc, out, _ = self.status()
        self.assertNotIn("statusjob", out)  # its entry went with it

    def test_two_nodes_through_the_rendezvous_store(self):
        port = free_port()
        for addr in ("127.0.0.2", "127.0.0.3"):
            self.launch("--nnodes=2", "--nproc-per-node=2", "--rdzv-backend=c10d",
                        f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=twonodes",
                        f"--rdzv-conf={FAST}", f"--local-addr={addr}",
                        "--log-dir", os.path.join(self.tmp.name, addr))
        def four_ranks(target):
            nodes = self.job_json(target)
            return nodes if nodes and len(nodes) == 2 else None
        for target in (f"127.0.0.1:{port}", "twonodes"):
            nodes = self.wait_for(f"both nodes through {target}", lambda: four_ranks(target))
            ranks = sorted(r["rank"] for n in nodes for r in n["ranks"])
            self.assertEqual(ranks, [0, 1, 2, 3])
            self.assertEqual(sorted(n["group_rank"] for n in nodes), [0, 1])
        rc, out, _ = self.status(f"127.0.0.1:{port}")
        self.assertEqual(rc, 0)
        self.assertIn("node 0 of 2", out)
        self.assertIn("node 1 of 2", out)

    def stacks(self, target):
        p = subprocess.run([ARGS.dtrun, "--stacks", target], capture_output=True, text=True,
                           env=self.env, timeout=90)
        return p.returncode, p.stdout, p.stderr

    def test_status_and_stacks_of_torch_gloo_ranks_in_a_collective(self):
        if subprocess.run([ARGS.python, "-c", "import torch"],
                          capture_output=True).returncode != 0:
            self.skipTest(f"{ARGS.python} has no torch")
        # Rank 1 sleeps before step 5's all_reduce; rank 0 waits inside it.
        cmd = [ARGS.dtrun, "--python", ARGS.python, "--nproc-per-node=2",
               "--rdzv-id=torchstacks", "--hang-timeout=120", WORKER, "after", "5", "1"]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True, env=self.env)
        self.procs.append(proc)
        nodes = self.wait_for("both ranks at step 4", lambda: (
            lambda n: n and all(r["step"] == 4 for r in n[0]["ranks"]) and n)(
                self.job_json("torchstacks")), timeout=120)
        self.assertEqual([r["state"] for r in nodes[0]["ranks"]], ["running", "running"])
        rc, out, err = self.stacks("torchstacks")
        self.assertEqual(rc, 0, err)
        rank0 = out.split("=== rank 0 on ")[1].split("=== rank")[0]
        rank1 = out.split("=== rank 1 on ")[1]
        self.assertIn("in all_reduce", rank0)
        self.assertIn("in diverged", rank1)
        self.assertIsNone(proc.poll())  # stacks do not stop the job

    def test_stacks_of_a_running_job_which_goes_on(self):
        proc = self.launch("--nproc-per-node=2", "--rdzv-id=stacksjob", "--log-dir",
                           os.path.join(self.tmp.name, "logs"))
        before = self.wait_for("beats", lambda: self.job_json("stacksjob"))
        rc, out, err = self.stacks("stacksjob")
        self.assertEqual(rc, 0, err)
        for rank in (0, 1):  # the interpreter's own dump, every thread
            block = out.split(f"=== rank {rank} on ")[1].split("=== rank")[0]
            self.assertIn("hang_worker.py", block)
            self.assertIn("in wedge", block)
        self.assertIsNone(proc.poll())  # the job goes on...
        step = max(r["step"] for r in before[0]["ranks"])
        self.wait_for("steps after the dump", lambda: (
            lambda n: n and min(r["step"] for r in n[0]["ranks"]) > step)(
                self.job_json("stacksjob")))  # ...and its workers too

    @unittest.skipUnless(ARGS.fake_worker, "needs --fake-worker")
    def test_stacks_of_native_workers_through_a_debugger(self):
        import shutil
        if not (shutil.which("eu-stack") or shutil.which("gdb")):
            self.skipTest("neither eu-stack nor gdb is installed")
        cmd = [ARGS.dtrun, "--nproc-per-node=2", "--rdzv-id=nativejob", ARGS.fake_worker,
               "--hang"]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True, env=self.env)
        self.procs.append(proc)
        self.wait_for("the job", lambda: "nativejob" in self.status()[1])
        rc, out, err = self.stacks("nativejob")
        self.assertEqual(rc, 0, err)
        self.assertIn("=== rank 1 on ", out)
        self.assertIn("main", out)  # the worker's own frame
        self.assertIsNone(proc.poll())

    def test_stacks_of_two_nodes_through_the_store(self):
        port = free_port()
        for addr in ("127.0.0.2", "127.0.0.3"):
            self.launch("--nnodes=2", "--nproc-per-node=2", "--rdzv-backend=c10d",
                        f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=stacks2",
                        f"--rdzv-conf={FAST}", f"--local-addr={addr}",
                        "--log-dir", os.path.join(self.tmp.name, addr))
        self.wait_for("both nodes", lambda: (
            lambda n: n and len(n) == 2)(self.job_json(f"127.0.0.1:{port}")))
        rc, out, err = self.stacks(f"127.0.0.1:{port}")
        self.assertEqual(rc, 0, err)
        for rank in range(4):
            self.assertIn(f"=== rank {rank} on ", out)
        self.assertEqual(out.count("in wedge"), 4, out)

    def test_a_run_that_is_not_there_exits_2_saying_so(self):
        rc, _, err = self.status("nosuchrun")
        self.assertEqual(rc, 2)
        self.assertIn("no dtrun job on this host matches 'nosuchrun'", err)
        rc, _, err = self.stacks("nosuchrun")
        self.assertEqual(rc, 2)
        self.assertIn("dtrun --stacks: no dtrun job on this host matches", err)
        rc, out, _ = self.status()
        self.assertEqual((rc, out), (0, "no dtrun job runs on this host\n"))


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]] + REST)
