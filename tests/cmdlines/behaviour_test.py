"""What torchrun users rely on beyond parsing, on the real dtrun binary:
signals in every phase, the console's bytes, the newer torchrun flags, the
entrypoint rule, placement by --node-rank, and a real D-state worker.

Usage: behaviour_test.py --dtrun PATH --fake-worker PATH
"""
import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "integration"))
from dtrun_proc import alive, wait_for  # noqa: E402  (the launcher tests' helpers)

ARGS = None
PY = "/usr/bin/python3"


def blocks_sigterm(pid):
    """True once `pid` has SIGTERM in its blocked mask (dtrun's signalfd)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigBlk:"):
                    return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    except OSError:
        pass
    return False


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Launcher(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="dtrun-behaviour-")
        self.procs = []

    def tearDown(self):
        for p in self.procs:  # by pid, never by name
            if p.poll() is None:
                p.kill()
            p.communicate()
        for pid in self.worker_pids():
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.dir, ignore_errors=True)

    def start(self, args, env=None, cwd=None):
        p = subprocess.Popen([ARGS.dtrun] + args, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, cwd=cwd or self.dir,
                             env=dict(os.environ, **(env or {})))
        self.procs.append(p)
        return p

    def run_dtrun(self, args, env=None, cwd=None, timeout=60):
        p = self.start(args, env, cwd)
        out, err = p.communicate(timeout=timeout)
        return p.returncode, out, err

    def worker_pids(self):
        pids = []
        for name in os.listdir(self.dir) if os.path.isdir(self.dir) else []:
            if name.startswith("pid_"):
                with open(os.path.join(self.dir, name)) as f:
                    pids.append(int(f.read()))
        return pids

    def wait_workers(self, n, timeout=20):
        self.assertTrue(wait_for(lambda: len(self.worker_pids()) >= n, timeout),
                        "workers did not start")
        return self.worker_pids()

    def script(self, name, text):
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    # --- signals -----------------------------------------------------------

    def test_listed_sigusr1_reaches_every_worker_and_the_job_goes_on(self):
        p = self.start(["--nproc-per-node=2", "--signals-to-handle",
                        "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1", ARGS.fake_worker,
                        "--record-signal", str(int(signal.SIGUSR1)), self.dir,
                        "--pid-dir", self.dir, "--sleep-ms", "3000"])
        self.wait_workers(2)
        p.send_signal(signal.SIGUSR1)
        out, err = p.communicate(timeout=30)
        self.assertEqual(p.returncode, 0, err)
        for rank in (0, 1):
            self.assertTrue(os.path.exists(os.path.join(self.dir, f"got_10_{rank}")), err)
        self.assertIn("received SIGUSR1; forwarding it to 2 worker(s)", err)

    def test_torchelastic_signals_to_handle_variable_lists_sigusr2(self):
        p = self.start(["--nproc-per-node=1", ARGS.fake_worker, "--record-signal",
                        str(int(signal.SIGUSR2)), self.dir, "--pid-dir", self.dir,
                        "--env-dir", self.dir, "--sleep-ms", "3000"],
                       env={"TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGUSR2"})
        self.wait_workers(1)
        p.send_signal(signal.SIGUSR2)
        out, err = p.communicate(timeout=30)
        self.assertEqual(p.returncode, 0, err)
        self.assertTrue(os.path.exists(os.path.join(self.dir, "got_12_0")))
        with open(os.path.join(self.dir, "env_0")) as f:
            self.assertIn("TORCHELASTIC_SIGNALS_TO_HANDLE=SIGTERM,SIGINT,SIGUSR2\n", f.read())

    def stop_running_job(self, signo):
        """Sends `signo` to a running 2-worker job; returns its stderr once
        every worker is gone."""
        p = self.start(["--nproc-per-node=2", ARGS.fake_worker, "--pid-dir", self.dir,
                        "--hang"])
        pids = self.wait_workers(2)
        p.send_signal(signo)
        out, err = p.communicate(timeout=30)
        self.assertEqual(p.returncode, 128 + signo, err)
        self.assertTrue(wait_for(lambda: not any(alive(x) for x in pids), 5))
        for name in os.listdir(self.dir):
            os.unlink(os.path.join(self.dir, name))
        return err

    def test_an_unlisted_catchable_signal_tears_down_with_a_summary(self):
        for signo in (signal.SIGUSR1, signal.SIGALRM, signal.SIGPWR):
            with self.subTest(signal=signo.name):
                err = self.stop_running_job(signo)
                self.assertIn(f"received {signo.name}, which --signals-to-handle does not list",
                              err)

    def test_stop_signals_while_running_end_with_torchruns_code(self):
        for signo in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
            with self.subTest(signal=signo.name):
                self.stop_running_job(signo)

    def test_sigterm_while_spawning(self):
        p = self.start(["--nproc-per-node=8", ARGS.fake_worker, "--pid-dir", self.dir,
                        "--hang"])
        # Before dtrun blocks its stop signals (exec and the loader under a
        # loaded CI) SIGTERM takes its default action, as it would for
        # torchrun's Python: wait for the mask, then stop it at once.
        self.assertTrue(wait_for(lambda: blocks_sigterm(p.pid), 10))
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=30)
        self.assertEqual(p.returncode, 143, err)
        pids = self.worker_pids()
        self.assertTrue(wait_for(lambda: not any(alive(x) for x in pids), 5))

    def test_sigterm_while_restarting(self):
        p = self.start(["--nproc-per-node=2", "--max-restarts=50", ARGS.fake_worker,
                        "--pid-dir", self.dir, "--only-rank", "1", "--sleep-ms", "50",
                        "--exit", "3"])
        self.assertTrue(wait_for(lambda: len(self.worker_pids()) >= 6, 20))
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=30)
        self.assertEqual(p.returncode, 143, err)
        pids = self.worker_pids()
        self.assertTrue(wait_for(lambda: not any(alive(x) for x in pids), 5))

    def test_sigterm_while_waiting_for_the_store_answers_at_once(self):
        port = free_port()  # nobody listens: dtrun keeps trying to connect
        p = self.start(["--nnodes=2", "--rdzv-backend=c10d",
                        f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-conf", "is_host=0",
                        ARGS.fake_worker])
        time.sleep(1.5)
        self.assertIsNone(p.poll())
        t = time.monotonic()
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=30)
        self.assertLess(time.monotonic() - t, 3, err)
        self.assertEqual(p.returncode, 143, err)
        self.assertIn("while connecting to the rendezvous store", err)

    def test_listed_sigusr2_while_waiting_for_the_store_is_not_a_stop(self):
        port = free_port()
        p = self.start(["--nnodes=2", "--rdzv-backend=c10d", "--signals-to-handle",
                        "SIGTERM,SIGUSR2", f"--rdzv-endpoint=127.0.0.1:{port}",
                        "--rdzv-conf", "is_host=0", ARGS.fake_worker])
        time.sleep(1.5)
        p.send_signal(signal.SIGUSR2)
        time.sleep(1.5)
        self.assertIsNone(p.poll(), "SIGUSR2 is listed: forwarded (to no one), not a stop")
        p.send_signal(signal.SIGQUIT)
        out, err = p.communicate(timeout=30)
        self.assertEqual(p.returncode, 128 + signal.SIGQUIT, err)
        self.assertIn("received SIGUSR2 while no worker runs", err)

    def test_sigint_while_waiting_for_other_nodes(self):
        port = free_port()
        p = self.start(["--nnodes=2", "--node-rank=0", f"--master-port={port}",
                        ARGS.fake_worker])
        time.sleep(1.5)
        t = time.monotonic()
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
        self.assertLess(time.monotonic() - t, 3, err)
        self.assertEqual(p.returncode, 130, err)

    # --- endpoints and backends ---------------------------------------------

    def test_localhost_port_0_hosts_the_store_on_a_free_port(self):
        rc, out, err = self.run_dtrun(["--nproc_per_node=2", "--rdzv_backend", "c10d",
                                       "--rdzv_endpoint=localhost:0", "--rdzv-id=t1",
                                       ARGS.fake_worker, "--env-dir", self.dir], timeout=30)
        self.assertEqual(rc, 0, err)
        with open(os.path.join(self.dir, "env_1")) as f:
            env = dict(l.rstrip("\n").split("=", 1) for l in f if "=" in l)
        self.assertNotEqual(env["MASTER_PORT"], "0")
        self.assertEqual(env["TORCHELASTIC_RUN_ID"], "t1")

    def test_backends_dtrun_lacks_exit_2_naming_them(self):
        for backend, words in (("zookeeper", "unknown backend 'zookeeper'"),
                               ("etcd-v3", "unknown backend 'etcd-v3'")):
            rc, out, err = self.run_dtrun([f"--rdzv-backend={backend}", "--nnodes=2",
                                           "--rdzv-endpoint=127.0.0.1:2379",
                                           ARGS.fake_worker])
            self.assertEqual(rc, 2, err)
            self.assertIn(words, err)

    # --- output ---------------------------------------------------------------

    def test_console_is_unprefixed_like_torchruns(self):
        rc, out, err = self.run_dtrun(["--nproc-per-node=2", ARGS.fake_worker,
                                       "--only-rank", "1", "--lines", "2"])
        self.assertEqual(rc, 0, err)
        self.assertEqual(out, "line 0 from rank 1\nline 1 from rank 1\n")

    def test_tee_prefixes_role_and_local_rank(self):
        rc, out, err = self.run_dtrun(["--nproc-per-node=2", "--role=trainer", "--tee=1",
                                       ARGS.fake_worker, "--only-rank", "1", "--lines",
                                       "1", "--stderr", "warn"])
        self.assertEqual(rc, 0, err)
        self.assertEqual(out, "[trainer1]:line 0 from rank 1\n")
        self.assertIn("\nwarn\n", "\n" + err)  # stderr is not tee'd

    def test_template_from_the_flag_and_the_variable(self):
        host = socket.gethostname()
        rc, out, err = self.run_dtrun(
            ["--nproc-per-node=2", "--tee=3", "--log-line-prefix-template",
             "${hostname}|${role_name}|${rank}|${local_rank}|${pid}: ",
             ARGS.fake_worker, "--only-rank", "1", "--pid-dir", self.dir, "--lines", "1"])
        self.assertEqual(rc, 0, err)
        pid = [x for x in self.worker_pids()][0]
        self.assertEqual(out, f"{host}|default|1|1|{pid}: line 0 from rank 1\n")
        rc, out, err = self.run_dtrun(
            ["--nproc-per-node=2", "--tee=3", ARGS.fake_worker, "--only-rank", "0",
             "--lines", "1"], env={"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "<${rank}> "})
        self.assertEqual(out, "<0> line 0 from rank 0\n")

    def test_label_ranks_is_dtruns_own_view(self):
        rc, out, err = self.run_dtrun(["--nproc-per-node=2", "--label-ranks",
                                       ARGS.fake_worker, "--only-rank", "1", "--lines", "1"])
        self.assertEqual(out, "[rank1]:line 0 from rank 1\n")

    def test_duplicate_filters_copy_matching_lines_to_their_file(self):
        logs = os.path.join(self.dir, "logs")
        rc, out, err = self.run_dtrun(["--nproc-per-node=2", "--log-dir", logs,
                                       "--duplicate-stdout-filters", "line 1,,x,line 0 from rank 1",
                                       ARGS.fake_worker, "--lines", "3"])
        self.assertEqual(rc, 0, err)
        (run,) = os.listdir(logs)
        with open(os.path.join(logs, run, "attempt_0", "filtered_stdout.log")) as f:
            lines = sorted(f.read().splitlines())
        self.assertEqual(lines, ["line 0 from rank 1"])  # "line 1,x" matches nothing

    def test_event_log_file_holds_torch_events(self):
        path = os.path.join(self.dir, "events.jsonl")
        rc, out, err = self.run_dtrun(["--nproc-per-node=2", "--rdzv-id=ev1",
                                       f"--event-log-handler=file:{path}", ARGS.fake_worker,
                                       "--only-rank", "1", "--exit", "4"])
        self.assertEqual(rc, 4, err)
        with open(path) as f:
            events = [json.loads(l) for l in f]
        names = sorted(e["name"] for e in events if e["name"].startswith("torchelastic."))
        self.assertEqual(names, ["torchelastic.worker.status.FAILED"] * 2 +
                         ["torchelastic.worker.status.TERMINATED"])
        # dtrun's own record of the one attempt: where, how big, why it ended.
        (attempt,) = [e["metadata"] for e in events if e["name"] == "dtrun.attempt"]
        self.assertEqual((attempt["run_id"], attempt["attempt"], attempt["ranks"]), ("ev1", 0, 2))
        self.assertEqual(attempt["cause"], "failed: rank 1 exit code 4")
        self.assertLessEqual(attempt["start"], attempt["end"])
        worker = [e for e in events if e["metadata"].get("global_rank") == 1][0]
        self.assertEqual(worker["source"], "WORKER")
        self.assertEqual(worker["metadata"]["run_id"], "ev1")
        self.assertEqual(worker["metadata"]["raw_error"], "exit code 4")
        agent = [e for e in events if e["source"] == "AGENT"
                 and e["name"].startswith("torchelastic.")][0]
        self.assertIsNone(agent["metadata"]["global_rank"])
        rc, out, err = self.run_dtrun(["--event-log-handler", "./plain.jsonl", ARGS.fake_worker])
        self.assertEqual(rc, 0, err)
        with open(os.path.join(self.dir, "plain.jsonl")) as f:
            self.assertIn('"source":"AGENT"', f.read())
        rc, out, err = self.run_dtrun(["--event-log-handler=console", ARGS.fake_worker])
        self.assertIn('"name":"torchelastic.worker.status.SUCCEEDED"', err)

    def test_event_log_records_every_attempt_and_the_rendezvous(self):
        path = os.path.join(self.dir, "rounds.jsonl")
        marks = os.path.join(self.dir, "marks")
        os.makedirs(marks)
        port = free_port()
        rc, out, err = self.run_dtrun(
            ["--nnodes=1", "--nproc-per-node=2", "--rdzv-backend=c10d",
             f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=ev2", "--max-restarts=1",
             f"--event-log-handler=file:{path}", ARGS.fake_worker,
             "--only-rank", "1", "--fail-once", marks])
        self.assertEqual(rc, 0, err)
        with open(path) as f:
            events = [json.loads(l) for l in f]
        attempts = [e["metadata"] for e in events if e["name"] == "dtrun.attempt"]
        self.assertEqual([(a["attempt"], a["cause"]) for a in attempts],
                         [(0, "failed: rank 1 exit code 3"), (1, "succeeded")])
        rdzv = [e for e in events if "node_state" in e]
        self.assertEqual([(e["name"], e["node_state"]) for e in rdzv],
                         [("next_rendezvous", "INIT"), ("next_rendezvous", "RUNNING"),
                          ("report_failure", "FAILED"),
                          ("next_rendezvous", "INIT"), ("next_rendezvous", "RUNNING"),
                          ("shutdown", "SUCCEEDED")])
        for e in rdzv:  # torch's RdzvEvent fields, all of them
            self.assertEqual(set(e), {"name", "run_id", "message", "hostname", "pid",
                                      "node_state", "master_endpoint", "rank", "local_id",
                                      "error_trace"})
            self.assertEqual(e["run_id"], "ev2")
        self.assertEqual(rdzv[1]["rank"], 0)
        self.assertIn("round 1 complete", rdzv[4]["message"])

    # --- entrypoints and placement -------------------------------------------

    def test_non_native_files_go_through_python(self):
        self.script("train", "import sys\nprint('py', sys.argv[1:])\n")
        os.chmod(os.path.join(self.dir, "train"), 0o755)
        rc, out, err = self.run_dtrun(["--nproc-per-node=1", "train", "a"],
                                      env={"PYTHON_EXEC": PY})
        self.assertEqual(rc, 0, err)
        self.assertEqual(out, "py ['a']\n")
        rc, out, err = self.run_dtrun(["--nproc-per-node=1", "--no-python", "./train"])
        self.assertNotEqual(rc, 0)  # no shebang: not executable as a program

    def test_virtual_local_rank(self):
        rc, out, err = self.run_dtrun(["--nproc-per-node=2", "--virtual-local-rank",
                                       ARGS.fake_worker, "--env-dir", self.dir],
                                      env={"CUDA_VISIBLE_DEVICES": "3,5"})
        self.assertEqual(rc, 0, err)
        for rank, gpu in ((0, "3"), (1, "5")):
            with open(os.path.join(self.dir, f"env_{rank}")) as f:
                env = dict(l.rstrip("\n").split("=", 1) for l in f if "=" in l)
            self.assertEqual(env["LOCAL_RANK"], "0")
            self.assertEqual(env["RANK"], str(rank))
            self.assertEqual(env["CUDA_VISIBLE_DEVICES"], gpu)

    def test_c10d_ranks_follow_distinct_node_ranks(self):
        port = free_port()
        common = ["--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
                  f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=place"]
        dirs = [os.path.join(self.dir, d) for d in ("a", "b")]
        for d in dirs:
            os.makedirs(d)
        # The node started first asks for rank 1; without --node-rank it
        # would become group rank 0.
        first = self.start(common + ["--node-rank=1", ARGS.fake_worker, "--env-dir", dirs[0]])
        time.sleep(1)
        second = self.start(common + ["--node-rank=0", ARGS.fake_worker, "--env-dir",
                                      dirs[1]])
        for p in (first, second):
            out, err = p.communicate(timeout=60)
            self.assertEqual(p.returncode, 0, err)
        self.assertTrue(os.path.exists(os.path.join(dirs[0], "env_1")))
        self.assertTrue(os.path.exists(os.path.join(dirs[1], "env_0")))

    # --- NUMA binding (this machine's topology) --------------------------------

    def test_numa_binding_on_this_machine(self):
        show = ["sh", "-c", 'echo "$RANK $(grep Cpus_allowed_list /proc/self/status | cut -f2)"']
        n = len(os.sched_getaffinity(0))
        rc, out, err = self.run_dtrun([f"--nproc-per-node={n}", "--numa-binding=exclusive"]
                                      + show)
        self.assertEqual(rc, 0, err)
        cpus = dict(line.split(" ", 1) for line in out.splitlines())
        self.assertEqual(len(set(cpus.values())), n, out)  # one CPU each, no overlap
        rc, out, err = self.run_dtrun(["--nproc-per-node=2", "--numa-binding=node"] + show)
        self.assertEqual(rc, 0, err)
        self.assertIn("--numa-binding=node: local_rank 1 on CPUs", err)
        rc, out, err = self.run_dtrun(["--nproc-per-node=2", "--numa-binding=exclusive"] + show,
                                      env={"HWLOC_SYNTHETIC": "pack:4 numa:1 core:64 pu:2"})
        self.assertEqual(rc, 2, err)
        self.assertIn("describe another machine", err)

    # --- uninterruptible sleep -------------------------------------------------

    def test_a_worker_in_d_state_is_named_and_not_restarted(self):
        p = self.start(["--nproc-per-node=2", "--max-restarts=3", ARGS.fake_worker,
                        "--pid-dir", self.dir, "--only-rank", "1", "--vfork-stall", "--hang"],
                       env={"TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT": "1"})
        pids = self.wait_workers(2)
        out, err = p.communicate(timeout=60)
        self.assertEqual(p.returncode, 1, err)
        self.assertIn("uninterruptible sleep (D state)", err)
        self.assertIn("local_rank 1", err)
        self.assertIn("is not restarted", err)
        self.assertEqual(len(self.worker_pids()), 2, "the group was restarted")
        self.assertTrue(wait_for(lambda: not any(alive(x) for x in pids), 5))


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtrun", required=True)
    ap.add_argument("--fake-worker", required=True)
    ARGS, rest = ap.parse_known_args()
    ARGS.dtrun = os.path.abspath(ARGS.dtrun)
    ARGS.fake_worker = os.path.abspath(ARGS.fake_worker)
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
