"""train_cfg under the real dtrun: accuracy on digits, bitwise resume, a
worker killed with SIGKILL and recovered from its checkpoint, bad configs."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

import argparse

p = argparse.ArgumentParser()
p.add_argument("--dtrun", required=True)
p.add_argument("--train-cfg", required=True)
ARGS, REST = p.parse_known_args()
HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = os.path.join(HERE, "..", "..", "examples", "configs")
CONFIG = os.path.join(CONFIGS, "digits_ddp.toml")
FSDP = os.path.join(CONFIGS, "digits_fsdp.toml")
DONE = re.compile(r"done: steps=(\d+) loss=(\S+) eval_accuracy=(\S+) params_sha256=([0-9a-f]{64})")


def train(nproc, *sets, restarts=0, config=CONFIG, flags=()):
    cmd = [ARGS.dtrun, f"--nproc-per-node={nproc}", f"--max-restarts={restarts}", *flags,
           ARGS.train_cfg, config]
    for s in sets:
        cmd += ["--set", s]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    return p.returncode, p.stdout, p.stderr


def train_on_two_nodes(dirs, *sets):
    """Two dtrun nodes of one rank each (static rendezvous on loopback),
    node i checkpointing into dirs[i]; both nodes' (returncode, out, err)."""
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    procs = []
    for node, folder in enumerate(dirs):
        cmd = [ARGS.dtrun, "--nnodes=2", "--nproc-per-node=1", f"--node-rank={node}",
               "--master-addr=127.0.0.1", f"--master-port={port}", f"--local-addr=127.0.0.{2 + node}",
               ARGS.train_cfg, CONFIG, "--set", f'checkpoint.dir="{folder}"']
        for s in sets:
            cmd += ["--set", s]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    results = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=240)
            results.append((proc.returncode, out, err))
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results


class TrainCfg(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.tmp.cleanup()

    def ckpt(self, name):
        return f'checkpoint.dir="{os.path.join(self.tmp.name, name)}"'

    def done(self, out):
        m = DONE.search(out)
        self.assertIsNotNone(m, out)
        return m.groups()

    def test_digits_reaches_95_percent(self):
        rc, out, err = train(2, self.ckpt("acc"))
        self.assertEqual(rc, 0, err)
        steps, _, acc, _ = self.done(out)
        self.assertEqual(steps, "400")
        self.assertGreaterEqual(float(acc), 0.95)

    def test_resume_is_bitwise_equal_to_an_unbroken_run(self):
        short = ["train.steps=20", "checkpoint.every=5", "train.log_every=5"]
        rc, out, err = train(2, self.ckpt("whole"), *short)
        self.assertEqual(rc, 0, err)
        whole = self.done(out)
        rc, out, err = train(2, self.ckpt("split"), *short, "train.stop_after_step=10")
        self.assertEqual(rc, 0, err)
        self.assertIn("stopped after step 10", out)
        rc, out, err = train(2, self.ckpt("split"), *short)
        self.assertEqual(rc, 0, err)
        self.assertIn("resumed from", out)
        self.assertEqual(self.done(out), whole)

    def test_ranks_whose_folders_differ_resume_from_one_step(self):
        # One folder per node, node 1's missing the newest checkpoint (a node
        # replaced, a copy still being persisted): every rank resumes from
        # the newest step all hold, bitwise where an unbroken run is.
        short = ["train.steps=20", "checkpoint.every=5", "train.log_every=5"]
        whole = os.path.join(self.tmp.name, "whole")
        results = train_on_two_nodes([whole, whole], *short)
        for rc, out, err in results:
            self.assertEqual(rc, 0, err[-3000:])
        want = self.done(results[0][1])
        a, b = os.path.join(self.tmp.name, "a"), os.path.join(self.tmp.name, "b")
        results = train_on_two_nodes([a, a], *short, "train.stop_after_step=10")
        self.assertEqual([r[0] for r in results], [0, 0], results[0][2][-3000:])
        shutil.copytree(a, b)
        newest = [f for f in os.listdir(b) if f.startswith("ckpt_") and f.endswith("10.dtck")]
        self.assertEqual(len(newest), 1, os.listdir(b))
        os.remove(os.path.join(b, newest[0]))
        results = train_on_two_nodes([a, b], *short)
        self.assertEqual([r[0] for r in results], [0, 0], results[0][2][-3000:])
        out, err = results[0][1], results[0][2]
        self.assertIn("the ranks' newest checkpoints differ (steps 5 to 10)", err)
        self.assertRegex(out, r"resumed from \S+ at step 5 ")
        self.assertEqual(self.done(out), want)

    def test_checkpoints_of_the_format_before_resume_in_the_raw_one(self):
        # The first half writes torch's archives framed with SHA-256 (what
        # every file written before the raw format holds); the second half
        # resumes from them with the defaults, writes raw + XXH3, and ends
        # where an unbroken run does. Both frames are on disk at the end.
        short = ["train.steps=20", "checkpoint.every=5", "train.log_every=5",
                 "checkpoint.keep=10"]
        rc, out, err = train(2, self.ckpt("whole"), *short)
        self.assertEqual(rc, 0, err)
        whole = self.done(out)
        old = ['checkpoint.payload="torch"', 'checkpoint.checksum="sha256"']
        rc, out, err = train(2, self.ckpt("split"), *short, *old, "train.stop_after_step=10")
        self.assertEqual(rc, 0, err)
        rc, out, err = train(2, self.ckpt("split"), *short)
        self.assertEqual(rc, 0, err)
        self.assertIn("at step 10", out)
        self.assertEqual(self.done(out), whole)
        folder = os.path.join(self.tmp.name, "split")
        heads = {}
        for step in (10, 20):
            with open(os.path.join(folder, f"ckpt_{step:012d}.dtck"), "rb") as f:
                heads[step] = f.read(8)
        self.assertEqual(heads, {10: b"DTCKPT1\n", 20: b"DTCKPT2\n"})

    def test_a_file_of_a_given_up_history_is_set_aside(self):
        # A node cut off from the job persists step 20 of a history the
        # others gave up (here: a run with another learning rate) after they
        # began again. It looks newest; it must not load, and the next write
        # sets it aside.
        short = ["train.steps=30", "checkpoint.every=5", "train.log_every=5"]
        rc, out, err = train(2, self.ckpt("whole"), *short)
        self.assertEqual(rc, 0, err)
        whole = self.done(out)
        folder = os.path.join(self.tmp.name, "split")
        rc, out, err = train(2, self.ckpt("split"), *short, "optimizer.lr=0.05",
                             "train.stop_after_step=20")
        self.assertEqual(rc, 0, err)
        name = "ckpt_000000000020.dtck"
        stale = os.path.join(self.tmp.name, name)
        shutil.move(os.path.join(folder, name), stale)
        for f in os.listdir(folder):  # the others begin again from scratch
            if f.startswith("ckpt_"):
                os.remove(os.path.join(folder, f))
        rc, out, err = train(2, self.ckpt("split"), *short, "train.stop_after_step=10")
        self.assertEqual(rc, 0, err)
        shutil.copy(stale, os.path.join(folder, name))  # the cut-off node's write
        rc, out, err = train(2, self.ckpt("split"), *short)
        self.assertEqual(rc, 0, err)
        self.assertRegex(err, r"checkpoint skipped: \S+ckpt_000000000020\.dtck: written in "
                              r"epoch 1, but epoch 2 resumed from step 0")
        self.assertRegex(out, r"resumed from \S+ckpt_000000000010\.dtck at step 10")
        self.assertEqual(self.done(out), whole)
        self.assertTrue(os.path.exists(os.path.join(folder, name + ".abandoned")))

    def test_worker_killed_midway_recovers_bitwise(self):
        rc, out, err = train(2, self.ckpt("clean"))
        self.assertEqual(rc, 0, err)
        clean = self.done(out)
        rc, out, err = train(2, self.ckpt("killed"), "fault.kill_rank=1", "fault.kill_at_step=170",
                             restarts=1)
        self.assertEqual(rc, 0, err)
        self.assertIn("SIGKILL", err)
        self.assertIn("resumed from", out)
        self.assertEqual(self.done(out), clean)

    def test_a_restart_with_nothing_to_resume_draws_the_first_weights(self):
        # The kill lands before the first checkpoint: the restarted workers,
        # made without their initial draws (a restart nearly always
        # resumes), draw them once the folder holds nothing, and the run
        # ends bitwise where an unbroken one does. FSDP's shard the blank
        # model first and then load the drawn one into their shards.
        for strategy in ("ddp", "fsdp"):
            with self.subTest(strategy=strategy):
                kind = f'strategy.type="{strategy}"'
                rc, out, err = train(2, self.ckpt(f"clean-{strategy}"), kind)
                self.assertEqual(rc, 0, err)
                clean = self.done(out)
                rc, out, err = train(2, self.ckpt(f"early-{strategy}"), kind,
                                     "fault.kill_rank=1", "fault.kill_at_step=5", restarts=1)
                self.assertEqual(rc, 0, err)
                self.assertIn("SIGKILL", err)
                self.assertNotIn("resumed from", out)
                self.assertEqual(self.done(out), clean)

    def test_restarted_workers_forked_from_the_standby_resume_bitwise(self):
        # --standby: the program's own standby (libtorch loaded) forks the
        # restarted workers; the run ends where an unbroken one does.
        rc, out, err = train(2, self.ckpt("clean"))
        self.assertEqual(rc, 0, err)
        clean = self.done(out)
        rc, out, err = train(2, self.ckpt("warm"), "fault.kill_rank=1", "fault.kill_at_step=170",
                             restarts=1, flags=["--standby"])
        self.assertEqual(rc, 0, err)
        self.assertRegex(err, r"--standby: the standby is ready \(its start took [\d.]+ s\)")
        self.assertRegex(err, r"attempt 1: started 2 worker\(s\), pids \d+,\d+ \(2 from the standby\)")
        self.assertIn("resumed from", out)
        self.assertEqual(self.done(out), clean)

    def test_a_recovery_is_measured_and_reported(self):
        # The failure to the next step of every new worker, phase by phase:
        # the log line, the run's table, the dtrun.recovery event.
        events = os.path.join(self.tmp.name, "events.jsonl")
        rc, out, err = train(2, self.ckpt("rec"), "fault.kill_rank=1",
                             "fault.kill_at_step=170", 'checkpoint.mode="memory"',
                             restarts=1, flags=[f"--event-log-handler=file:{events}"])
        self.assertEqual(rc, 0, err)
        m = re.search(r"recovered in ([\d.]+) s: detect ([\d.]+), regroup ([\d.]+), "
                      r"start ([\d.]+), init ([\d.]+), load ([\d.]+), first step "
                      r"([\d.]+) \(from step 150, memory\)", err)
        self.assertIsNotNone(m, err)
        total, *phases = (float(v) for v in m.groups())
        self.assertGreater(total, 0)
        self.assertAlmostEqual(sum(phases), total, delta=0.02)  # printed rounded
        self.assertRegex(err, r"recoveries \(seconds.*\n.*attempt.*\n +1 +[\d.]+ ")
        with open(events) as f:
            recs = [json.loads(line) for line in f if "dtrun.recovery" in line]
        self.assertEqual(len(recs), 1)
        md = recs[0]["metadata"]
        self.assertEqual((md["step"], md["source"], md["attempt"]), (150, "memory", 1))
        self.assertAlmostEqual(md["total"], sum(md[k] for k in (
            "detect", "regroup", "start", "init", "load", "first_step")), delta=1e-6)
        # The time lost: back past where the job stood when rank 1 died (its
        # step 170 or the one before), 20 steps redone from the copy of 150,
        # so more than the recovery itself. The step is the first beat dtrun
        # read past it: beats are read every 10 ms, so on a fast loop it may
        # be a few steps on (each step is then set against its own time).
        lost = re.search(r"; time lost ([\d.]+) s \(back at step (\d+)\)", err)
        self.assertIsNotNone(lost, err)
        self.assertGreaterEqual(int(lost.group(2)), 170)
        self.assertGreater(float(lost.group(1)), total - 0.02)
        self.assertAlmostEqual(md["lost"], float(lost.group(1)), delta=0.006)

    def test_hang_at_step_170_is_detected_and_resumes_bitwise(self):
        rc, out, err = train(2, self.ckpt("clean"))
        self.assertEqual(rc, 0, err)
        clean = self.done(out)
        rc, out, err = train(2, self.ckpt("hung"), "fault.hang_rank=1", "fault.hang_at_step=170",
                             restarts=1, flags=["--hang-timeout=5"])
        self.assertEqual(rc, 0, err)
        self.assertIn("fault injection: rank 1 hangs after step 170", err)
        self.assertIn("Root cause (stopped first / lowest step): rank 1", err)
        self.assertIn("last step 169", err)
        if shutil.which("eu-stack") or shutil.which("gdb"):  # native stacks of both ranks
            self.assertIn("HangForever", err)
            self.assertIn("SyncGradients", err)
        self.assertIn("resumed from", out)
        self.assertEqual(self.done(out), clean)

    def test_dropout_resume_restores_every_ranks_rng(self):
        # Dropout draws from each rank's generator: only restoring every
        # rank's RNG state makes the resumed run bitwise equal.
        short = ["train.steps=20", "checkpoint.every=5", "model.dropout=0.2"]
        rc, out, err = train(2, self.ckpt("whole"), *short)
        self.assertEqual(rc, 0, err)
        whole = self.done(out)
        rc, out, err = train(2, self.ckpt("split"), *short, "train.stop_after_step=10")
        self.assertEqual(rc, 0, err)
        rc, out, err = train(2, self.ckpt("split"), *short)
        self.assertEqual(rc, 0, err)
        self.assertIn("resumed from", out)
        self.assertEqual(self.done(out), whole)

    def test_fsdp_digits_reaches_95_percent_like_ddp(self):
        rc, out, err = train(2, self.ckpt("fsdp"), config=FSDP)
        self.assertEqual(rc, 0, err)
        steps, _, acc, _ = self.done(out)
        self.assertEqual(steps, "400")
        self.assertGreaterEqual(float(acc), 0.95)

    def test_bf16_trains_alike_under_ddp_and_fsdp_and_resumes_bitwise(self):
        # Autocast in bfloat16 (the weights stay float32): both strategies
        # end on the same bits, not fp32's, as accurate; an FSDP run killed
        # midway resumes onto them.
        bf16 = 'train.precision="bf16"'
        rc, out, err = train(2, self.ckpt("ddp"), bf16)
        self.assertEqual(rc, 0, err)
        ddp = self.done(out)
        self.assertGreaterEqual(float(ddp[2]), 0.95)
        rc, out, err = train(2, self.ckpt("fp32"), 'checkpoint.dir=""', "train.eval_every=0")
        self.assertEqual(rc, 0, err)
        self.assertNotEqual(self.done(out)[3], ddp[3])
        rc, out, err = train(2, self.ckpt("fsdp"), bf16, "fault.kill_rank=1",
                             "fault.kill_at_step=170", restarts=1, config=FSDP)
        self.assertEqual(rc, 0, err)
        self.assertIn("resumed from", out)
        self.assertEqual(self.done(out)[3], ddp[3])

    def test_fsdp_worker_killed_midway_recovers_bitwise(self):
        sets = ["train.steps=120", "model.dropout=0.1"]
        rc, out, err = train(2, self.ckpt("clean"), *sets, config=FSDP)
        self.assertEqual(rc, 0, err)
        clean = self.done(out)
        rc, out, err = train(2, self.ckpt("killed"), *sets, "fault.kill_rank=0",
                             "fault.kill_at_step=70", restarts=1, config=FSDP)
        self.assertEqual(rc, 0, err)
        self.assertIn("SIGKILL", err)
        self.assertIn("resumed from", out)
        self.assertEqual(self.done(out), clean)

    def test_async_checkpoints_end_where_sync_ones_do(self):
        # A write slower than two checkpoints apart is waited for and said.
        sets = ["train.steps=120", "checkpoint.every=20", "train.log_every=20"]
        for config in (CONFIG, FSDP):
            with self.subTest(config=os.path.basename(config)):
                rc, out, err = train(2, self.ckpt("sync"), *sets, config=config)
                self.assertEqual(rc, 0, err)
                clean = self.done(out)
                self.assertIn("checkpoint step 20: training waited", out)
                self.assertIn("(sync)", out)
                # A write of 1 s outlasts 20 steps even on an idle machine
                # (where they take ~0.2 s); at 0.4 s a loaded one ran them
                # slower than the write and waited for none.
                rc, out, err = train(2, self.ckpt("async"), *sets, 'checkpoint.mode="async"',
                                     "fault.save_delay_ms=1000", config=config)
                self.assertEqual(rc, 0, err)
                self.assertEqual(self.done(out), clean)
                self.assertIn("(async: the copy; written in the background)", out)
                self.assertRegex(out, r"checkpoint step \d+: still being written when step \d+ "
                                      r"was due; training waited [\d.]+ ms for it")
                self.assertRegex(out, r"checkpoint step 120: still being written when the run "
                                      r"ended")
                steps = sorted(os.listdir(os.path.join(self.tmp.name, "async")))
                self.assertIn("ckpt_000000000120.dtck", steps)
                shutil.rmtree(os.path.join(self.tmp.name, "sync"))
                shutil.rmtree(os.path.join(self.tmp.name, "async"))

    def test_async_write_killed_in_flight_resumes_from_the_last_durable_one(self):
        # The writing rank dies while step 100's write sleeps (a slow disk):
        # step 100 never lands, the restart resumes from step 50, and the
        # run ends bitwise where an undisturbed one does.
        sets = ["train.steps=150", "checkpoint.every=50", 'checkpoint.mode="async"']
        for config, rank in ((CONFIG, 0), (FSDP, 1)):
            with self.subTest(config=os.path.basename(config), killed=rank):
                rc, out, err = train(2, self.ckpt("clean"), *sets, config=config)
                self.assertEqual(rc, 0, err)
                clean = self.done(out)
                rc, out, err = train(2, self.ckpt("killed"), *sets, "fault.save_delay_ms=3000",
                                     f"fault.kill_rank={rank}", "fault.kill_at_step=100",
                                     restarts=1, config=config)
                self.assertEqual(rc, 0, err)
                self.assertIn("SIGKILL", err)
                self.assertRegex(out, r"resumed from \S+ckpt_000000000050\.dtck at step 50")
                self.assertEqual(self.done(out), clean)
                shutil.rmtree(os.path.join(self.tmp.name, "clean"))
                shutil.rmtree(os.path.join(self.tmp.name, "killed"))

    def losses(self, path):
        import json
        with open(path) as f:
            rows = [json.loads(line) for line in f]
        return {r["step"]: r["loss"] for r in rows if "loss" in r}

    def test_fsdp_sharded_checkpoint_from_4_ranks_resumes_on_2(self):
        # Same global batch (4 x 16 = 2 x 32), so the continuation is the same.
        # AdamW: its sharded state (two moments, step) is resharded too.
        sets = ["train.steps=40", "checkpoint.every=20", "train.log_every=1",
                'optimizer.type="adamw"', "optimizer.lr=0.005", "optimizer.weight_decay=0.01"]
        rc, out, err = train(4, self.ckpt("four"), *sets, "train.batch_size=16",
                             "train.stop_after_step=20", config=FSDP)
        self.assertEqual(rc, 0, err)
        shards = sorted(f for f in os.listdir(os.path.join(self.tmp.name, "four")) if "shard" in f)
        self.assertEqual(len(shards), 4, shards)
        shutil.copytree(os.path.join(self.tmp.name, "four"), os.path.join(self.tmp.name, "two"))
        on4 = os.path.join(self.tmp.name, "on4.jsonl")
        on2 = os.path.join(self.tmp.name, "on2.jsonl")
        rc, out, err = train(4, self.ckpt("four"), *sets, "train.batch_size=16",
                             f'metrics.path="{on4}"', config=FSDP)
        self.assertEqual(rc, 0, err)
        rc, out, err = train(2, self.ckpt("two"), *sets, "train.batch_size=32",
                             f'metrics.path="{on2}"', config=FSDP)
        self.assertEqual(rc, 0, err)
        self.assertIn("at step 20 (saved on 4 ranks;", out)
        a, b = self.losses(on4), self.losses(on2)
        self.assertEqual(sorted(a), list(range(21, 41)))
        self.assertEqual(sorted(a), sorted(b))
        for step in a:
            self.assertAlmostEqual(a[step], b[step], delta=1e-5 * max(1.0, abs(a[step])),
                                   msg=f"step {step}")

    def test_fsdp_full_checkpoint_resumes_bitwise(self):
        sets = ["train.steps=20", "checkpoint.every=5", 'checkpoint.format="full"']
        rc, out, err = train(2, self.ckpt("whole"), *sets, config=FSDP)
        self.assertEqual(rc, 0, err)
        whole = self.done(out)
        rc, out, err = train(2, self.ckpt("split"), *sets, "train.stop_after_step=10", config=FSDP)
        self.assertEqual(rc, 0, err)
        self.assertFalse([f for f in os.listdir(os.path.join(self.tmp.name, "split")) if "shard" in f])
        rc, out, err = train(2, self.ckpt("split"), *sets, config=FSDP)
        self.assertEqual(rc, 0, err)
        self.assertIn("resumed from", out)
        self.assertEqual(self.done(out), whole)

    def test_fsdp_missing_shard_falls_back_to_the_previous_checkpoint(self):
        sets = ["train.steps=20", "checkpoint.every=5", "checkpoint.keep=3"]
        rc, out, err = train(2, self.ckpt("c"), *sets, "train.stop_after_step=10", config=FSDP)
        self.assertEqual(rc, 0, err)
        os.unlink(os.path.join(self.tmp.name, "c", "ckpt_000000000010.shard_1.dtck"))
        rc, out, err = train(2, self.ckpt("c"), *sets, config=FSDP)
        self.assertEqual(rc, 0, err)
        self.assertIn("shard_1.dtck does not load", err)
        self.assertIn("at step 5 ", out)

    def test_strategy_mismatch_refuses_instead_of_starting_over(self):
        sets = ["train.steps=10", "checkpoint.every=5"]
        rc, out, err = train(1, self.ckpt("d"), *sets)
        self.assertEqual(rc, 0, err)
        rc, out, err = train(1, self.ckpt("d"), *sets, "train.steps=20", config=FSDP)
        self.assertNotEqual(rc, 0)
        self.assertIn("holds checkpoints of a DDP run", err)

    def test_clipping_takes_the_global_norm_under_ddp_and_fsdp(self):
        # The norm of every rank's gradients, before clipping: DDP's (each
        # rank holds it all) and FSDP's (one all-reduce of the shards'
        # squares) agree; clipped to 0.3, both runs end on the same loss.
        norm = re.compile(r"step (\d+) loss (\S+) .* grad_norm (\S+)")
        runs = []
        for config in (CONFIG, FSDP):
            rc, out, err = train(2, "optimizer.max_grad_norm=0.3", "train.steps=30",
                                 "train.log_every=5", 'checkpoint.dir=""', "train.eval_every=0",
                                 config=config)
            self.assertEqual(rc, 0, err)
            runs.append(norm.findall(out))
            self.assertIn("skipped_steps=0", out)
        ddp, fsdp = runs
        self.assertEqual(len(ddp), 6, ddp)
        self.assertEqual([s for s, _, _ in ddp], [s for s, _, _ in fsdp])
        for (_, dl, dn), (_, fl, fn) in zip(ddp, fsdp):
            self.assertAlmostEqual(float(dn), float(fn), delta=1e-3 * float(dn))
            self.assertAlmostEqual(float(dl), float(fl), delta=1e-5)
        self.assertTrue(any(float(n) > 0.3 for _, _, n in ddp), ddp)  # it did clip
        # A learning rate that blows the weights up: the first step is
        # clipped, every later gradient is nan: skipped and counted, and
        # the run ends.
        rc, out, err = train(2, "optimizer.max_grad_norm=1", "optimizer.lr=1e30",
                             "train.steps=6", 'checkpoint.dir=""', "train.eval_every=0")
        self.assertEqual(rc, 0, err)
        self.assertIn("step 2: gradient norm", out)
        self.assertIn("step skipped, not applied", out)
        self.assertIn("skipped_steps=5", out)
        # The count is part of the state: resumed from step 4 after a
        # kill, the run counts steps 5 and 6 on top of step 4's count.
        rc, out, err = train(2, "optimizer.max_grad_norm=1", "optimizer.lr=1e30",
                             "train.steps=6", self.ckpt("skips"), "checkpoint.every=2",
                             "train.eval_every=0", "fault.kill_rank=1",
                             "fault.kill_at_step=5", restarts=1)
        self.assertEqual(rc, 0, err)
        self.assertIn("resumed from", out)
        self.assertIn("skipped_steps=5", out)

    def test_bad_values_exit_2_naming_them(self):
        for bad, says in [("strategy.type=zero", "strategy.type 'zero': use \"ddp\" or \"fsdp\""),
                          ('strategy.param_dtype="fp8"', "strategy.param_dtype 'fp8'"),
                          ('train.steps="ten"', "train.steps must be an integer"),
                          ("model.dropout=1.5", "model.dropout must be in [0, 1)"),
                          ("optimizer.max_grad_norm=-1", "optimizer.max_grad_norm must be >= 0"),
                          ('train.precision="fp8"',
                           "train.precision 'fp8': use \"fp32\" or \"bf16\""),
                          ("strategy.prefetch=3", "strategy.prefetch must be true or false"),
                          ('checkpoint.mode="flash"',
                           "checkpoint.mode 'flash': use \"sync\" or \"async\" or \"memory\""),
                          ("fault.save_delay_ms=500",
                           "fault.save_delay_ms delays background writes"),
                          ("fault.damage_copy_at_step=20",
                           "fault.damage_copy_at_step damages a memory copy"),
                          ("checkpoint.persist_every=0", "checkpoint.persist_every must be >= 1"),
                          ("checkpoint.persist_every=2",
                           "checkpoint.persist_every applies to checkpoint.mode = \"memory\""),
                          ('fault.kill_in="flush"', "fault.kill_in 'flush': use \"step\""),
                          ('fault.kill_in="copy"', "fault.kill_in = \"copy\" or \"write\" needs"),
                          ('checkpoint.mode="memory"', "use format = \"sharded\" with it"),
                          ('checkpoint.checksum="md5"',
                           "checkpoint.checksum 'md5': use \"xxh3\" or \"sha256\""),
                          ('checkpoint.payload="pickle"',
                           "checkpoint.payload 'pickle': use \"raw\" or \"torch\""),
                          ('strategy.device="gpu"',
                           "strategy.device 'gpu': use \"auto\" or \"cpu\" or \"cuda\""),
                          ('strategy.backend="nccl"',
                           "strategy.device = \"cpu\" with backend \"nccl\"")]:
            extra = ["--set", 'checkpoint.format="full"'] if "sharded" in says else []
            if bad == "checkpoint.persist_every=0":
                extra = ["--set", 'checkpoint.mode="memory"']
            if bad == 'strategy.backend="nccl"':
                extra = ["--set", 'strategy.device="cpu"']
            p = subprocess.run([ARGS.train_cfg, FSDP, "--set", bad, *extra], capture_output=True,
                               text=True)
            self.assertEqual(p.returncode, 2, bad)
            self.assertIn(says, p.stderr)

    def test_device_cuda_without_a_gpu_says_so_and_where_it_trains_otherwise(self):
        # Debian's torch has no CUDA: "cuda" cannot be met, and says why
        rc, out, err = train(2, self.ckpt("d"), 'strategy.device="cuda"', "train.steps=5")
        self.assertNotEqual(rc, 0)
        self.assertIn('strategy.device = "cuda", but no GPU is visible', err)
        rc, out, err = train(2, self.ckpt("d"), 'strategy.device="cpu"', "train.steps=5")
        self.assertEqual(rc, 0, err)
        self.assertIn("training on cpu (backend gloo, 2 ranks)", out)

    def test_bad_config_exits_2_naming_the_key(self):
        rc, _, err = train(1, "train.stepz=3")
        self.assertNotEqual(rc, 0)
        self.assertIn("unknown key 'train.stepz'", err)
        # beyond ASCII (toml++ 3.3 mis-reads some such bytes): refused, line named
        bad = os.path.join(self.tmp.name, "bad.toml")
        with open(bad, "w", encoding="utf-8") as f:
            f.write('[model]\ntype = "mlp"\n[train]\nsteps = 3 \u0361\n')
        p = subprocess.run([ARGS.train_cfg, bad], capture_output=True, text=True)
        self.assertEqual(p.returncode, 2)
        self.assertIn("bad.toml line 4: a character beyond ASCII", p.stderr)
        p = subprocess.run([ARGS.train_cfg, "/nonexistent.toml"], capture_output=True, text=True)
        self.assertEqual(p.returncode, 2)
        self.assertIn("/nonexistent.toml", p.stderr)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]] + REST, verbosity=2)
