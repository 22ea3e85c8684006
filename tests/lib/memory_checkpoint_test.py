"""[checkpoint] mode = "memory" under the real dtrun: a restarted group
resumes from the copies in shared memory, a copy cut short or never made is
not used, a damaged one is found as it loads and set aside, dtrun persists
the newest copies when a worker dies and on SIGTERM, no segment outlives the
job, and a node killed whole loses only what was not yet on disk. Each run
ends with the params_sha256 of an undisturbed one. DDP and FSDP; labelled
torch2, so it runs against both Torch versions."""
import argparse
import glob
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

p = argparse.ArgumentParser()
p.add_argument("--dtrun", required=True)
p.add_argument("--train-cfg", required=True)
ARGS, REST = p.parse_known_args()
HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = os.path.join(HERE, "..", "..", "examples", "configs")
DDP = os.path.join(CONFIGS, "digits_ddp.toml")
FSDP = os.path.join(CONFIGS, "digits_fsdp.toml")
DONE = re.compile(r"done: steps=\d+ loss=\S+ eval_accuracy=\S+ params_sha256=([0-9a-f]{64})")
# Checkpoints every 20 steps, to disk every 4th (80, 160, ...) and at the end.
MEMORY = ['checkpoint.mode="memory"', "checkpoint.every=20", "checkpoint.persist_every=4",
          "train.steps=240"]


def command(config, ckpt, sets, restarts):
    cmd = [ARGS.dtrun, "--nproc-per-node=2", f"--max-restarts={restarts}", ARGS.train_cfg, config,
           "--set", f'checkpoint.dir="{ckpt}"']
    for s in sets:
        cmd += ["--set", s]
    return cmd


def segments(pid):
    return glob.glob(f"/dev/shm/dtrun-{pid}-ckpt-*")


class MemoryCheckpoints(unittest.TestCase):
    clean = {}  # config -> params_sha256 of an undisturbed run

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.runs = 0

    def tearDown(self):
        self.tmp.cleanup()

    def run_job(self, config, sets=(), restarts=1, ckpt=None):
        """One dtrun job to its end: (rc, stdout, stderr, dtrun's pid)."""
        if ckpt is None:
            self.runs += 1
            ckpt = os.path.join(self.tmp.name, f"run{self.runs}")
        p = subprocess.Popen(command(config, ckpt, sets, restarts), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        try:
            out, err = p.communicate(timeout=240)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        self.assertEqual(segments(p.pid), [], "a segment outlived the job")
        return p.returncode, out, err, p.pid

    def sha(self, out):
        m = DONE.search(out)
        self.assertIsNotNone(m, out)
        return m.group(1)

    def undisturbed(self, config):
        if config not in self.clean:
            rc, out, err, _ = self.run_job(config, ["train.log_every=100", "train.steps=240"],
                                           restarts=0)
            self.assertEqual(rc, 0, err)
            self.clean[config] = self.sha(out)
        return self.clean[config]

    def test_memory_ends_where_sync_does(self):
        for config in (DDP, FSDP):
            with self.subTest(config=os.path.basename(config)):
                rc, out, err, _ = self.run_job(config, MEMORY, restarts=0)
                self.assertEqual(rc, 0, err)
                self.assertEqual(self.sha(out), self.undisturbed(config))
                self.assertIn("(memory: the copy; written to shared memory in the background)",
                              out)
                self.assertIn("checkpoint step 80: training waited", out)
                self.assertRegex(out, r"checkpoint step 80: training waited [\d.]+ ms \(memory: "
                                      r"the copy; written to shared memory in the background, "
                                      r"and to disk\)")

    def test_worker_killed_resumes_from_memory(self):
        # Step 120 is in memory only (disk: 80); dtrun persists it while the
        # new group resumes from the copies.
        for config in (DDP, FSDP):
            with self.subTest(config=os.path.basename(config)):
                rc, out, err, pid = self.run_job(
                    config, [*MEMORY, "fault.kill_rank=1", "fault.kill_at_step=130"])
                self.assertEqual(rc, 0, err)
                self.assertIn("SIGKILL", err)
                self.assertRegex(out, rf"resumed from memory at step 120 \(copies in "
                                      rf"/dev/shm/dtrun-{pid}-ckpt-\*")
                self.assertRegex(err, r"persisted the checkpoint copy in memory to "
                                      r"\S+/ckpt_000000000120\.dtck")
                self.assertEqual(self.sha(out), self.undisturbed(config))

    def test_kill_during_a_memory_write_or_copy_resumes_from_the_copy_before(self):
        # Step 120's copy is cut short (rank 0 dies halfway through writing
        # its segment) or never made (rank 1 dies once the copy is taken):
        # the other slot's step 100 is what every rank resumes from.
        # (DDP's rank 1 copies nothing: its step's file is rank 0's.)
        for config, rank, where in ((DDP, 0, "write"), (FSDP, 1, "copy"), (FSDP, 0, "write"),
                                    (DDP, 0, "copy")):
            with self.subTest(config=os.path.basename(config), rank=rank, kill_in=where):
                rc, out, err, _ = self.run_job(
                    config, [*MEMORY, f"fault.kill_rank={rank}", "fault.kill_at_step=120",
                             f'fault.kill_in="{where}"'])
                self.assertEqual(rc, 0, err)
                self.assertIn(f"rank {rank} kills itself", err)
                self.assertIn("resumed from memory at step 100 ", out)
                if where == "write":
                    self.assertRegex(err, r"checkpoint copy not used: /dev/shm/\S+: incomplete")
                self.assertEqual(self.sha(out), self.undisturbed(config))

    def test_a_damaged_copy_is_found_as_it_loads_and_set_aside(self):
        # Step 120's copy of the step's file has one byte flipped after its
        # checksum was taken; rank 1 dies at 130. The restart verifies the
        # copy as it copies it into the model, finds the damage, sets the
        # copy aside and resumes from the folder's step 80 (120 persisted
        # from the damaged copy does not load either), ending bitwise where
        # an undisturbed run does.
        for config in (DDP, FSDP):
            with self.subTest(config=os.path.basename(config)):
                rc, out, err, _ = self.run_job(
                    config, [*MEMORY, "fault.damage_copy_at_step=120", "fault.kill_rank=1",
                             "fault.kill_at_step=130"])
                self.assertEqual(rc, 0, err)
                self.assertRegex(err, r"rank 0: memory copy of step 120: checksum mismatch in "
                                      r"payload bytes \d+-\d+")
                self.assertIn("the memory copy of step 120 did not verify as it was loaded (a "
                              "rank's; set aside): resuming from disk", out)
                self.assertRegex(out, r"resumed from \S+ckpt_000000000080\.dtck at step 80 ")
                self.assertNotIn("resumed from memory", out)
                self.assertEqual(self.sha(out), self.undisturbed(config))

    def test_a_damaged_copy_with_nothing_on_disk_starts_over(self):
        # Step 20's copy is damaged and the folder holds nothing good (its
        # first persisted step would be 80): the restart that found the
        # damage has a model it cannot trust, so it fails saying so, and
        # the next one, with the copy set aside, starts from step 0.
        rc, out, err, _ = self.run_job(
            DDP, [*MEMORY, "fault.damage_copy_at_step=20", "fault.kill_rank=1",
                  "fault.kill_at_step=30"], restarts=2)
        self.assertEqual(rc, 0, err)
        self.assertIn("the memory copy of step 20 did not verify as it was loaded, after part "
                      "of it was in the model, and ", err)
        self.assertIn("holds no checkpoint to load instead: the copy is set aside, and the "
                      "next restart starts from step 0", err)
        self.assertEqual(self.sha(out), self.undisturbed(DDP))

    def test_two_nodes_each_resume_from_their_own_memory(self):
        # Two loopback nodes of one rank each, two dtrun processes: each
        # node's first rank keeps the step's file (DDP: the whole state), so
        # after rank 1 dies the new round resumes from memory on both.
        fast = ("keep_alive_interval=0.2,keep_alive_max_attempt=3,last_call_timeout=0.5,"
                "join_timeout=30")
        for config in (DDP, FSDP):
            with self.subTest(config=os.path.basename(config)):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", 0))
                    port = sock.getsockname()[1]
                ckpt = os.path.join(self.tmp.name, "nodes" + os.path.basename(config))
                procs = []
                for node, addr in enumerate(("127.0.0.2", "127.0.0.3")):
                    cmd = [ARGS.dtrun, "--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
                           f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=memory",
                           f"--rdzv-conf={fast}", f"--local-addr={addr}", f"--node-rank={node}",
                           "--max-restarts=1", ARGS.train_cfg, config,
                           "--set", f'checkpoint.dir="{ckpt}"']
                    for s in [*MEMORY, "fault.kill_rank=1", "fault.kill_at_step=130"]:
                        cmd += ["--set", s]
                    procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                                  stderr=subprocess.PIPE, text=True))
                results = []
                for proc in procs:
                    try:
                        results.append(proc.communicate(timeout=240))
                    finally:
                        if proc.poll() is None:
                            proc.kill()
                            proc.communicate()
                out = results[0][0] + results[1][0]
                err = results[0][1] + results[1][1]
                self.assertEqual([p.returncode for p in procs], [0, 0], err)
                self.assertIn("resumed from memory at step 120 ", out)
                self.assertEqual(self.sha(out), self.undisturbed(config))
                for proc in procs:
                    self.assertEqual(segments(proc.pid), [])

    def test_async_kill_during_the_write_or_the_copy_resumes_from_disk(self):
        sets = ['checkpoint.mode="async"', "checkpoint.every=20", "train.steps=240"]
        for config, rank, where in ((DDP, 0, "write"), (FSDP, 1, "write"), (FSDP, 1, "copy"),
                                    (DDP, 0, "copy")):
            with self.subTest(config=os.path.basename(config), rank=rank, kill_in=where):
                rc, out, err, _ = self.run_job(
                    config, [*sets, f"fault.kill_rank={rank}", "fault.kill_at_step=120",
                             f'fault.kill_in="{where}"'])
                self.assertEqual(rc, 0, err)
                self.assertRegex(out, r"resumed from \S+ckpt_000000000100\.dtck at step 100")
                self.assertEqual(self.sha(out), self.undisturbed(config))

    def test_a_failed_job_persists_its_newest_copy_and_removes_every_segment(self):
        for config in (DDP, FSDP):
            with self.subTest(config=os.path.basename(config)):
                ckpt = os.path.join(self.tmp.name, "failed" + os.path.basename(config))
                rc, out, err, _ = self.run_job(
                    config, [*MEMORY, "fault.kill_rank=1", "fault.kill_at_step=130"],
                    restarts=0, ckpt=ckpt)
                self.assertNotEqual(rc, 0)
                self.assertIn("ckpt_000000000120.dtck", os.listdir(ckpt))
                rc, out, err, _ = self.run_job(config, MEMORY, restarts=0, ckpt=ckpt)
                self.assertEqual(rc, 0, err)
                self.assertRegex(out, r"resumed from \S+ckpt_000000000120\.dtck at step 120")
                self.assertEqual(self.sha(out), self.undisturbed(config))

    def start_slow(self, config, ckpt, new_session):
        """A job slowed down (rank 0's compute 10 times as long: same bits),
        read until its checkpoint of step 130 is taken."""
        sets = [*MEMORY, "checkpoint.every=10", "train.log_every=10", "fault.slow_rank=0",
                "fault.slow_factor=10"]
        p = subprocess.Popen(command(config, ckpt, sets, 0), stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True, start_new_session=new_session)
        seen = []
        for line in p.stdout:
            seen.append(line)
            if line.startswith("checkpoint step 130: training waited"):
                return p
        p.wait()
        self.fail("no checkpoint at step 130:\n" + "".join(seen))

    def test_sigterm_persists_the_newest_copy_and_removes_every_segment(self):
        for config in (DDP, FSDP):
            with self.subTest(config=os.path.basename(config)):
                ckpt = os.path.join(self.tmp.name, "term" + os.path.basename(config))
                p = self.start_slow(config, ckpt, new_session=False)
                try:
                    time.sleep(0.3)  # step 130's copy in memory; disk's newest is 120
                    p.send_signal(signal.SIGTERM)
                    p.communicate(timeout=60)
                finally:
                    if p.poll() is None:
                        p.kill()
                        p.wait()
                self.assertEqual(segments(p.pid), [])
                steps = sorted(f for f in os.listdir(ckpt)
                               if f.startswith("ckpt_") and ".shard_" not in f)
                self.assertGreaterEqual(steps[-1], "ckpt_000000000130.dtck", steps)
                rc, out, err, _ = self.run_job(config, MEMORY, restarts=0, ckpt=ckpt)
                self.assertEqual(rc, 0, err)
                self.assertEqual(self.sha(out), self.undisturbed(config))

    def test_a_node_killed_whole_loses_only_what_was_not_on_disk(self):
        # dtrun and its workers SIGKILLed together: the copies of steps 130
        # (and maybe 140) die with the node's memory as far as the job goes;
        # the next dtrun on the node removes them and resumes from disk.
        for config in (DDP, FSDP):
            with self.subTest(config=os.path.basename(config)):
                ckpt = os.path.join(self.tmp.name, "node" + os.path.basename(config))
                p = self.start_slow(config, ckpt, new_session=True)
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
                p.stdout.close()
                left = segments(p.pid)
                self.assertNotEqual(left, [])
                # Any dtrun starting on this machine sweeps the copies of
                # dtruns that are gone: this job, or a test's beside it
                # (then this job's log does not say so). Gone, either way.
                rc, out, err, _ = self.run_job(config, MEMORY, restarts=0, ckpt=ckpt)
                self.assertEqual(rc, 0, err)
                said = [path for path in left
                        if f"removed {path}: a checkpoint copy of a dtrun that is gone" in err]
                self.assertEqual(segments(p.pid), [], err)
                if not said:
                    print(f"the copies of pid {p.pid} were swept by another dtrun",
                          file=sys.stderr)
                m = re.search(r"resumed from \S+ckpt_0*(\d+)\.dtck at step (\d+)", out)
                self.assertIsNotNone(m, out)
                self.assertIn(int(m.group(2)), (120, 160), out)  # a persisted one
                self.assertEqual(self.sha(out), self.undisturbed(config))


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]] + REST, verbosity=2)
