"""dtrun --restart=in-place under the real dtrun and train_cfg: a SIGKILLed
rank is replaced alone while the others keep their processes, re-form the
group around it and hand it their state, and the run ends bitwise as an
undisturbed one (through shared memory and through gloo, the replaced rank
rank 0 or not); FSDP's ranks all go back to the newest checkpoint (the
node's memory copy) or to the start, in place; the same for a Python worker
under PyTorch's own DDP through dtrun.in_place; what cannot be kept falls
back to the whole-group restart (FSDP without checkpoints, workers that did
not opt in, a failure during a replacement). On loopback nodes
(InPlaceOnNodes): a worker replaced across nodes; a node lost, SIGSTOPped
or joining keeps the other nodes' workers, bitwise as a run with the same
world-size schedule.
Labelled torch2: the same runs against Torch 2.x."""
import argparse
import glob
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest

p = argparse.ArgumentParser()
p.add_argument("--dtrun", required=True)
p.add_argument("--train-cfg", required=True)
ARGS, REST = p.parse_known_args()
HERE = os.path.dirname(os.path.abspath(__file__))
PY_PACKAGE = os.path.join(HERE, "..", "..", "apps", "dtrun", "python")
CONFIGS = os.path.join(HERE, "..", "..", "examples", "configs")
DDP = os.path.join(CONFIGS, "digits_ddp.toml")
FSDP = os.path.join(CONFIGS, "digits_fsdp.toml")
DONE = re.compile(r"done: steps=\d+ loss=\S+ eval_accuracy=\S+ params_sha256=([0-9a-f]{64})")
STARTED = re.compile(r"attempt 0: started 3 worker\(s\), pids ([\d,]+)")
SHORT = ["train.steps=240", "train.log_every=100", "checkpoint.every=40"]
KILL_1 = ["fault.kill_rank=1", "fault.kill_at_step=130"]

# A worker that is not lib's trainer: it opts in to in-place recovery
# (argv[1] == "ready") or not; rank 1 fails on attempt 0 and, opted in,
# its replacement (attempt 1) fails too; the survivors wait to be stopped.
PY_WORKER = textwrap.dedent("""\
    import os, sys, time
    ready = sys.argv[1] == "ready"
    rank = int(os.environ["RANK"])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    assert os.environ["DTRUN_RESTART"] == "in-place"
    if ready:
        open(os.environ["DTRUN_HEARTBEAT_FILE"] + ".in_place", "w").close()
    if rank == 1 and attempt == 0:
        time.sleep(1.0)
        sys.exit(3)
    if rank == 1 and attempt == 1 and ready:
        sys.exit(4)
    if attempt == 0:
        time.sleep(60)
    """)


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def staged_segments(err):
    """The segments left by the run that logged `err` (named after its
    workers' store port: other runs may stage theirs meanwhile)."""
    ports = set(re.findall(r"(?:store at|workers' store) [\d.]+:(\d+)", err))
    assert ports, "no workers' store port in the log"
    return [p for p in glob.glob("/dev/shm/dtrun-inplace-*") if p.split("-")[2] in ports]


class Runs(unittest.TestCase):
    clean = {}  # (config, sets) -> params_sha256 of an undisturbed run

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.runs = 0

    def tearDown(self):
        self.tmp.cleanup()

    def dtrun(self, argv, flags=(), env=None, nproc=3):
        cmd = [ARGS.dtrun, f"--nproc-per-node={nproc}", *flags, *argv]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
        return p.returncode, p.stdout, p.stderr

    def train(self, config, sets, flags=()):
        self.runs += 1
        ckpt = os.path.join(self.tmp.name, f"run{self.runs}")
        argv = [ARGS.train_cfg, config, "--set", f'checkpoint.dir="{ckpt}"']
        for s in [*SHORT, *sets]:
            argv += ["--set", s]
        return self.dtrun(argv, flags)

    def sha(self, out):
        m = DONE.search(out)
        self.assertIsNotNone(m, out)
        return m.group(1)

    def undisturbed(self, config, sets=()):
        key = (config, tuple(sets))
        if key not in self.clean:
            rc, out, err = self.train(config, sets)
            self.assertEqual(rc, 0, err)
            self.clean[key] = self.sha(out)
        return self.clean[key]

    def assert_replaced_in_place(self, err, local_rank, source):
        self.assertIn(f"replacing worker local_rank {local_rank} (rank {local_rank}) in "
                      "place", err)
        self.assertNotIn("restarting the worker group", err)
        self.assertRegex(err, rf"recovered in [\d.]+ s: .*\(from step 130, {source}\)")
        # The survivors re-formed; none of them was started again.
        started = STARTED.search(err)
        self.assertIsNotNone(started, err)
        self.assertEqual(len(re.findall(r"attempt \d+: started", err)), 1, err)
        self.assertEqual(len(re.findall(r"re-forming the group in place after step 130",
                                        err)), 2, err)
        self.assertEqual(staged_segments(err), [])


class InPlaceRecovery(Runs):
    """One node."""

    def test_a_killed_rank_is_replaced_and_the_run_ends_bitwise(self):
        clean = self.undisturbed(DDP)
        rc, out, err = self.train(DDP, KILL_1, ["--restart=in-place", "--max-restarts=1"])
        self.assertEqual(rc, 0, err)
        self.assert_replaced_in_place(err, 1, "kept")
        self.assertEqual(self.sha(out), clean)

    def test_rank_0_replaced_over_gloo_takes_a_survivors_state(self):
        # No shared-memory all-reduce: the survivors learn of the death from
        # gloo; rank 0's replacement gets rank 1's state, async checkpoints
        # going on around it.
        sets = ["strategy.shared_memory=false", 'checkpoint.mode="async"']
        clean = self.undisturbed(DDP, sets)
        rc, out, err = self.train(DDP, [*sets, "fault.kill_rank=0", "fault.kill_at_step=130"],
                                  ["--restart=in-place", "--max-restarts=1"])
        self.assertEqual(rc, 0, err)
        self.assert_replaced_in_place(err, 0, "peer")
        self.assertEqual(self.sha(out), clean)

    def test_fsdp_goes_back_to_the_nodes_memory_copy_in_place(self):
        # A dead rank's shards died with it: every rank goes back to the
        # newest checkpoint, the survivors in their processes, the
        # replacement from the memory copy its predecessor left.
        sets = ['checkpoint.mode="memory"']
        clean = self.undisturbed(FSDP, sets)
        rc, out, err = self.train(FSDP, [*sets, *KILL_1],
                                  ["--restart=in-place", "--max-restarts=1"])
        self.assertEqual(rc, 0, err)
        self.assertIn("replacing worker local_rank 1 (rank 1) in place", err)
        self.assertNotIn("restarting the worker group", err)
        self.assertIn("in place: back to step 120 from memory (10 step(s) to do again)", out)
        self.assertEqual(len(re.findall(r"attempt \d+: started", err)), 1, err)
        self.assertEqual(self.sha(out), clean)

    def test_fsdp_before_its_first_checkpoint_starts_over_in_place(self):
        clean = self.undisturbed(FSDP)
        rc, out, err = self.train(FSDP, ["fault.kill_rank=0", "fault.kill_at_step=20"],
                                  ["--restart=in-place", "--max-restarts=1"])
        self.assertEqual(rc, 0, err)
        self.assertIn("replacing worker local_rank 0 (rank 0) in place", err)
        self.assertIn("in place: back to step 0 from the start (no checkpoint yet)", out)
        self.assertEqual(self.sha(out), clean)

    def test_fsdp_without_checkpoints_falls_back_to_the_group_restart(self):
        argv = [ARGS.train_cfg, FSDP, "--set", 'checkpoint.dir=""']
        for s in [*SHORT, *KILL_1]:
            argv += ["--set", s]
        rc, out, err = self.dtrun(argv, ["--restart=in-place", "--max-restarts=1"])
        self.assertEqual(rc, 0, err)
        self.assertNotIn("replacing worker", err)
        self.assertIn("in-place recovery is off for this run: FSDP's shards die with their "
                      "rank, and without checkpoint.dir there is no checkpoint to go back to",
                      err)
        self.assertIn("--restart=in-place: local_rank 0 never said it can re-form its group", err)
        self.assertIn("restarting the worker group: attempt 2 of 2", err)
        self.assertIsNotNone(DONE.search(out), out)

    def test_a_survivor_stuck_in_its_step_exits_and_the_group_restarts(self):
        # Rank 0 stops in place after the step rank 1 dies in, as one
        # blocked in a collective with a live peer would: it never re-forms,
        # so it ends itself once the stuck limit passes, and the whole group
        # restarts from its checkpoint.
        clean = self.undisturbed(DDP)
        argv = [ARGS.train_cfg, DDP, "--set", f'checkpoint.dir="{self.tmp.name}/stuck"']
        for s in [*SHORT, *KILL_1, "fault.hang_rank=0", "fault.hang_at_step=130"]:
            argv += ["--set", s]
        rc, out, err = self.dtrun(argv, ["--restart=in-place", "--max-restarts=2"],
                                  env=dict(os.environ, DTRUN_IN_PLACE_STUCK_S="2"))
        self.assertEqual(rc, 0, err)
        self.assertIn("replacing worker local_rank 1 (rank 1) in place", err)
        self.assertIn("rank 0: still in a collective 2 s after dtrun said a rank died", err)
        self.assertIn("restarting the worker group: attempt 3 of 3", err)
        self.assertEqual(self.sha(out), clean)

    def torch_job(self, kill_at, flags):
        env = dict(os.environ, PYTHONPATH=os.path.abspath(PY_PACKAGE))
        # 2 ranks: PyTorch's DDP built again lays out its buckets anew, and
        # with 3 or more ranks a gradient's sum then adds in another order.
        rc, out, err = self.dtrun(
            [sys.executable, os.path.join(HERE, "in_place_py_worker.py"), str(kill_at)],
            flags, env, nproc=2)
        self.assertEqual(rc, 0, err)
        m = re.search(r"params_sha256=([0-9a-f]{64})", out)
        self.assertIsNotNone(m, out + err)
        return m.group(1), err

    def test_a_python_ddp_worker_opts_in_through_dtrun_in_place(self):
        clean, _ = self.torch_job(0, [])
        sha, err = self.torch_job(20, ["--restart=in-place", "--max-restarts=1"])
        self.assertIn("replacing worker local_rank 1 (rank 1) in place", err)
        self.assertNotIn("restarting the worker group", err)
        self.assertIn("rank 0: re-forming the group in place after step 20", err)
        self.assertRegex(err, r"recovered in [\d.]+ s: .*\(from step 20, kept\); time lost")
        self.assertEqual(sha, clean)

    def python_job(self, mode):
        script = os.path.join(self.tmp.name, "worker.py")
        with open(script, "w") as f:
            f.write(PY_WORKER)
        return self.dtrun([sys.executable, script, mode],
                          ["--restart=in-place", "--max-restarts=2", "--term-timeout=5"])

    def test_workers_that_did_not_opt_in_restart_as_a_group(self):
        rc, _, err = self.python_job("plain")
        self.assertEqual(rc, 0, err)
        self.assertNotIn("replacing worker", err)
        self.assertIn("never said it can re-form its group", err)
        self.assertIn("restarting the worker group: attempt 2 of 3", err)

    def test_a_failure_during_a_replacement_restarts_the_group(self):
        rc, _, err = self.python_job("ready")
        self.assertEqual(rc, 0, err)
        self.assertIn("replacing worker local_rank 1 (rank 1) in place: attempt 2 of 3", err)
        self.assertIn("worker local_rank 1", err)
        self.assertIn("restarting the worker group: attempt 3 of 3", err)


class InPlaceOnNodes(Runs):
    """Loopback nodes: a worker replaced, a node lost, stopped or joining
    (integration.in_place_nodes)."""

    def two_nodes(self, config, sets, flags=()):
        """Two loopback nodes of 2 ranks each (c10d rendezvous, two dtrun
        processes); their returncodes, joined stdout and stderr."""
        self.runs += 1
        ckpt = os.path.join(self.tmp.name, f"nodes{self.runs}")
        port = free_port()
        run = [self.start_node(n, port, f"inplace{self.runs}", ckpt, [*SHORT, *sets],
                               nnodes="2", config=config, flags=flags) for n in (0, 1)]
        results = [self.finish(*r) for r in run]
        return ([r[0] for r in results], results[0][1] + results[1][1],
                results[0][2] + results[1][2])

    def test_on_two_nodes_the_other_nodes_ranks_re_form_around_a_replacement(self):
        # Rank 3 (node 1's second) dies: node 1 replaces it, every other
        # rank of both nodes keeps its process. DDP takes its state from its
        # node's survivor, FSDP goes back to the memory copies, both bitwise.
        # FSDP over gloo: rank 1, in the ring all-gather with rank 0 (which
        # left it, seeing the dead rank), is not left blocked in it.
        for config, sets, source in ((DDP, ["strategy.shared_memory=false"], "kept"),
                                     (FSDP, ['checkpoint.mode="memory"'], "memory"),
                                     (FSDP, ['checkpoint.mode="memory"',
                                             "strategy.shared_memory=false"], "memory")):
            with self.subTest(config=os.path.basename(config)):
                _, clean_out, clean_err = self.two_nodes(config, sets)
                clean = self.sha(clean_out)
                rcs, out, err = self.two_nodes(
                    config, [*sets, "fault.kill_rank=3", "fault.kill_at_step=130"],
                    ["--restart=in-place", "--max-restarts=1"])
                self.assertEqual(rcs, [0, 0], err)
                self.assertIn("replacing worker local_rank 1 (rank 3) in place", err)
                self.assertNotIn("failed here", err)  # no new round
                self.assertEqual(len(re.findall(r"re-forming the group in place after "
                                                r"step 130", err)), 3, err)
                self.assertRegex(err, rf"recovered in [\d.]+ s: .*\(from step 1[23]0, "
                                      rf"{source}\)")
                self.assertEqual(self.sha(out), clean)
                self.assertEqual(staged_segments(err), [])

    # Elastic jobs of two loopback nodes (--nnodes=1:2), each dtrun's output
    # in files that the test reads as the run goes.
    # A SIGKILLed node's connection closes at once; a silent one is declared
    # dead after 3 s, which a loaded machine does not reach by mistake.
    FAST = ("keep_alive_interval=0.5,keep_alive_max_attempt=6,last_call_timeout=1,"
            "join_timeout=30")

    def start_node(self, node, port, run_id, ckpt, sets, nnodes="1:2", config=DDP,
                   flags=("--restart=in-place", "--max-restarts=2")):
        out = open(os.path.join(self.tmp.name, f"{run_id}.out{node}"), "w+")
        err = open(os.path.join(self.tmp.name, f"{run_id}.err{node}"), "w+")
        cmd = [ARGS.dtrun, f"--nnodes={nnodes}", "--nproc-per-node=2", "--rdzv-backend=c10d",
               f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={run_id}",
               f"--rdzv-conf={self.FAST}", f"--local-addr=127.0.0.{2 + node}", *flags,
               ARGS.train_cfg, config, "--set", f'checkpoint.dir="{ckpt}"']
        for s in ["train.log_every=50", "checkpoint.every=40", *sets]:
            cmd += ["--set", s]
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True)
        out.close()
        err.close()
        self.addCleanup(lambda: proc.poll() is None and (proc.kill(), proc.wait()))
        return proc, out.name, err.name

    def wait_for(self, path, pattern, proc):
        deadline = time.time() + 120
        while time.time() < deadline:
            with open(path) as f:
                m = re.search(pattern, f.read())
            if m:
                return m
            self.assertIsNone(proc.poll(), f"ended before {pattern!r}")
            time.sleep(0.05)
        self.fail(f"no {pattern!r} in {path}")

    def finish(self, proc, out, err):
        proc.wait(timeout=240)
        with open(out) as o, open(err) as e:
            return proc.returncode, o.read(), e.read()

    def schedule(self, first_nodes, then_nodes, step, steps):
        """params_sha256 of a run on `first_nodes` nodes (2 ranks each)
        stopped after `step`, resumed on `then_nodes` to `steps`."""
        ckpt = os.path.join(self.tmp.name, f"schedule{step}")
        for i, (nodes, sets) in enumerate(((first_nodes, [f"train.stop_after_step={step}",
                                                          f"checkpoint.every={step}"]),
                                           (then_nodes, []))):
            port = free_port()
            run = [self.start_node(n, port, f"sched{step}x{i}", ckpt,
                                   [f"train.steps={steps}", *sets], nnodes=str(nodes))
                   for n in range(nodes)]
            results = [self.finish(*r) for r in run]
            self.assertEqual([r[0] for r in results], [0] * nodes, results[0][2])
        return self.sha("".join(r[1] for r in results))

    def lose_node(self, signo, run_id):
        """Node 1 of two gets `signo` (its dtrun and workers) after step 200:
        node 0's output and the step its 2 ranks went on from."""
        port = free_port()
        ckpt = os.path.join(self.tmp.name, run_id)
        sets = ["train.steps=900"]
        node0 = self.start_node(0, port, run_id, ckpt, sets)
        self.wait_for(node0[2], r"joining rendezvous", node0[0])
        node1 = self.start_node(1, port, run_id, ckpt, sets)
        pids = self.wait_for(node1[2], r"attempt 0: started 2 worker\(s\), pids (\d+),(\d+)",
                             node1[0])
        self.wait_for(node0[1], r"step 200 loss", node0[0])
        lost = (node1[0].pid, *map(int, pids.groups()))
        for pid in lost:
            os.kill(pid, signo)
        rc, out, err = self.finish(*node0)
        for pid in lost:  # a stopped node is killed once the test is done
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        node1[0].wait()
        self.assertEqual(rc, 0, err)
        self.assertRegex(err, r"round \d+: kept the 2 worker\(s\) in place as ranks 0\.\.1 of 2")
        self.assertEqual(len(re.findall(r"attempt \d+: started", err)), 1, err)
        step = int(re.search(r"recovered in [\d.]+ s: .*\(from step (\d+), \w+\)", err).group(1))
        return out, err, step

    def test_a_lost_node_leaves_the_others_running_on_fewer_ranks(self):
        # Node 1 of two is SIGKILLed whole (its dtrun and workers): node 0's
        # workers keep their processes, re-form as the 2 ranks of the next
        # round and go on from the step they hold, bitwise as a run that
        # went from 4 ranks to 2 at that step.
        out, err, step = self.lose_node(signal.SIGKILL, "lost")
        self.assertIn(f"in place: round 1 goes on from step {step} with 2 ranks", out)
        # "peer": a kept worker slower than 2 s to leave its step (a loaded
        # machine) was replaced by a new one, which took the step held.
        self.assertRegex(err, rf"recovered in [\d.]+ s: .*\(from step {step}, (kept|peer)\)")
        self.assertEqual(self.sha(out), self.schedule(2, 1, step, 900))

    def test_a_stopped_node_leaves_no_kept_worker_stuck(self):
        # Node 1 is SIGSTOPped: a worker of node 0 blocked in a collective
        # with it (gloo cannot abort one) never reads its round file, and a
        # new worker of the round takes its place after 2 s, from the state
        # a kept one holds or the checkpoint; bitwise as 4 ranks, then 2.
        out, err, step = self.lose_node(signal.SIGSTOP, "stopped")
        self.assertEqual(self.sha(out), self.schedule(2, 1, step, 900))

    def test_a_replacement_dying_in_its_set_up_leaves_the_other_nodes_ranks_kept(self):
        # Node 1's first worker dies, and its replacement dies too while it
        # sets up: node 1's round fails. Node 0's workers, re-forming around
        # the replacement in the round's store, follow the new round in
        # their processes (that store closing is not a failure of theirs):
        # one failed round, bitwise as an undisturbed run of 4 ranks.
        sets = ["train.steps=1500"]
        port = free_port()
        clean = [self.start_node(n, port, "dies2clean", os.path.join(self.tmp.name, "d2c"),
                                 sets, nnodes="2") for n in (0, 1)]
        clean = [self.finish(*r) for r in clean]
        self.assertEqual([r[0] for r in clean], [0, 0], clean[0][2] + clean[1][2])
        port = free_port()
        ckpt = os.path.join(self.tmp.name, "dies2")
        node0, node1 = (self.start_node(n, port, "dies2", ckpt, sets, nnodes="2")
                        for n in (0, 1))
        pids = self.wait_for(node1[2], r"attempt 0: started 2 worker\(s\), pids (\d+),",
                             node1[0])
        time.sleep(1.5)  # some steps in
        os.kill(int(pids.group(1)), signal.SIGKILL)
        new = self.wait_for(node1[2], r"replaced local_rank 0 with pid (\d+)", node1[0])
        time.sleep(0.1)
        os.kill(int(new.group(1)), signal.SIGKILL)
        results = [self.finish(*node0), self.finish(*node1)]
        err = results[0][2] + results[1][2]
        self.assertEqual([r[0] for r in results], [0, 0], err)
        self.assertEqual(len(re.findall(r"failed here", err)), 1, err)
        self.assertRegex(err, r"kept the 2 worker\(s\) in place as ranks")
        self.assertEqual(len(re.findall(r"kept for a new round", err)), 2, err)
        self.assertEqual(self.sha(results[0][1] + results[1][1]),
                         self.sha(clean[0][1] + clean[1][1]))

    def test_a_node_joining_takes_the_state_of_the_running_ones(self):
        # Node 0 trains alone; node 1 joins: node 0's workers stay, re-form
        # as ranks 0..1 of 4, and node 1's new workers take their state.
        port = free_port()
        ckpt = os.path.join(self.tmp.name, "grow")
        sets = ["train.steps=700"]
        node0 = self.start_node(0, port, "grow", ckpt, sets)
        self.wait_for(node0[1], r"step 100 loss", node0[0])
        node1 = self.start_node(1, port, "grow", ckpt, sets)
        results = [self.finish(*node0), self.finish(*node1)]
        self.assertEqual([r[0] for r in results], [0, 0], results[0][2] + results[1][2])
        rc, out, err = results[0]
        self.assertRegex(err, r"round 1: kept the 2 worker\(s\) in place as ranks 0\.\.1 of 4")
        self.assertEqual(len(re.findall(r"attempt \d+: started", err)), 1, err)
        step = int(re.search(r"in place: round 1 goes on from step (\d+) with 4 ranks",
                             out).group(1))
        self.assertEqual(self.sha(out), self.schedule(1, 2, step, 700))


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0], *REST])
