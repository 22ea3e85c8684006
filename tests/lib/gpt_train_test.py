"""train_cfg's GPT (model.type = "gpt", data.source = "text") under the real
dtrun, on a small corpus made here (Debian's license texts): FSDP with one
unit per block and the tied embedding in the root ends on DDP's bits; a rank
SIGKILLed midway resumes onto an unbroken run's bits (DDP sync, FSDP async
and memory); bf16 with two micro-batches a step is the same under both;
nanoGPT's prepared folder (train.bin, val.bin and a meta.pkl that pickle
wrote) trains, and --sample prints text in its vocabulary; FSDP stopped on
2 ranks resumes on 4 as DDP does; fp16's loss scale skips overflowing steps,
halves, and comes back with a resume."""
import argparse
import os
import pickle
import re
import subprocess
import sys
import tempfile
import unittest

import numpy as np

p = argparse.ArgumentParser()
p.add_argument("--dtrun", required=True)
p.add_argument("--train-cfg", required=True)
ARGS, REST = p.parse_known_args()
HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG = os.path.join(HERE, "..", "..", "examples", "configs", "shakespeare_char_cpu.toml")
DONE = re.compile(r"done: steps=40 .*val_loss=(\S+) params_sha256=([0-9a-f]{64})")
SMALL = ["model.n_layer=2", "model.n_head=2", "model.n_embd=32", "model.block_size=32",
         "train.batch_size=4", "train.steps=40", "train.eval_every=20", "train.eval_iters=2",
         "train.log_every=10", "schedule.warmup_steps=5", "schedule.decay_steps=40",
         "checkpoint.every=10"]


def corpus(folder):
    path = os.path.join(folder, "licenses.txt")
    with open(path, "wb") as out:
        for name in ("GPL-3", "Apache-2.0", "Artistic"):
            with open(os.path.join("/usr/share/common-licenses", name), "rb") as f:
                out.write(f.read())
    return path


def train(data, ckpt, *sets, restarts=0, extra=(), nproc=2, flags=()):
    cmd = [ARGS.dtrun, f"--nproc-per-node={nproc}", f"--max-restarts={restarts}", *flags,
           ARGS.train_cfg,
           CONFIG, "--set", f'data.path="{data}"', "--set", f'checkpoint.dir="{ckpt}"']
    for s in SMALL + list(sets):
        cmd += ["--set", s]
    p = subprocess.run(cmd + list(extra), capture_output=True, text=True, timeout=240)
    return p.returncode, p.stdout, p.stderr


class GptTrain(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.data = corpus(cls.tmp.name)
        rc, out, err = train(cls.data, os.path.join(cls.tmp.name, "ddp"))
        assert rc == 0, err
        cls.ddp = DONE.search(out)
        assert cls.ddp, out

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_it_learns(self):
        self.assertLess(float(self.ddp.group(1)), 4.0)  # ln(vocab 91) = 4.5 at the start

    def test_fsdp_with_a_unit_per_block_ends_on_ddps_bits(self):
        rc, out, err = train(self.data, os.path.join(self.tmp.name, "fsdp"),
                             'strategy.type="fsdp"')
        self.assertEqual(rc, 0, err)
        got = DONE.search(out)
        self.assertIsNotNone(got, out)
        self.assertEqual(got.group(2), self.ddp.group(2))

    def test_bf16_with_accumulation_fsdp_ends_on_ddps_bits(self):
        done = []
        for strategy in ("ddp", "fsdp"):
            rc, out, err = train(self.data, os.path.join(self.tmp.name, f"bf16-{strategy}"),
                                 f'strategy.type="{strategy}"', 'train.precision="bf16"',
                                 "train.accumulate=2", "train.batch_size=2")
            self.assertEqual(rc, 0, err)
            got = DONE.search(out)
            self.assertIsNotNone(got, out)
            done.append(got.groups())
        self.assertEqual(done[0], done[1])
        self.assertNotEqual(done[0][1], self.ddp.group(2))

    def test_a_killed_rank_resumes_onto_the_unbroken_bits(self):
        for strategy, mode in (("ddp", "sync"), ("fsdp", "async"), ("fsdp", "memory")):
            folder = os.path.join(self.tmp.name, f"kill-{strategy}-{mode}")
            rc, out, err = train(self.data, folder, f'strategy.type="{strategy}"',
                                 f'checkpoint.mode="{mode}"', "fault.kill_rank=1",
                                 "fault.kill_at_step=25", restarts=1)
            self.assertEqual(rc, 0, err)
            self.assertIn("resumed from", out)
            got = DONE.search(out)
            self.assertIsNotNone(got, out)
            self.assertEqual(got.group(2), self.ddp.group(2), strategy)

    def test_fsdp_in_place_goes_back_to_its_memory_copy_onto_the_unbroken_bits(self):
        # The survivors keep their processes; every rank, the replacement
        # too, goes back to step 20 (the tied head and embedding in the
        # root unit, a unit per block).
        folder = os.path.join(self.tmp.name, "in-place-fsdp")
        rc, out, err = train(self.data, folder, 'strategy.type="fsdp"',
                             'checkpoint.mode="memory"', "fault.kill_rank=1",
                             "fault.kill_at_step=25", restarts=1, flags=["--restart=in-place"])
        self.assertEqual(rc, 0, err)
        self.assertIn("replacing worker local_rank 1 (rank 1) in place", err)
        self.assertIn("in place: back to step 20 from memory", out)
        got = DONE.search(out)
        self.assertIsNotNone(got, out)
        self.assertEqual(got.group(2), self.ddp.group(2))

    def test_fsdp_resumes_on_another_number_of_ranks_as_ddp_does(self):
        # Stopped after step 20 on 2 ranks, resumed on 4: FSDP's sharded
        # checkpoint re-split, DDP's whole one, the same bits at the end.
        done = []
        for strategy in ("ddp", "fsdp"):
            folder = os.path.join(self.tmp.name, f"n-to-m-{strategy}")
            rc, out, err = train(self.data, folder, f'strategy.type="{strategy}"',
                                 "train.stop_after_step=20")
            self.assertEqual(rc, 0, err)
            self.assertIn("stopped after step 20", out)
            rc, out, err = train(self.data, folder, f'strategy.type="{strategy}"', nproc=4)
            self.assertEqual(rc, 0, err)
            self.assertIn("resumed from", out)
            got = DONE.search(out)
            self.assertIsNotNone(got, out)
            done.append(got.group(2))
        self.assertEqual(done[0], done[1])
        self.assertNotEqual(done[0], self.ddp.group(2))

    def test_fp16_scales_the_loss_and_resumes_with_its_scale(self):
        # 2^24 overflows float16's gradients at first: those steps are
        # skipped and the scale halves until they fit.
        import torch
        sets = ['train.precision="fp16"', "train.init_scale=16777216",
                "train.growth_interval=5"]
        folder = os.path.join(self.tmp.name, "fp16")
        rc, out, err = train(self.data, folder, *sets)
        if tuple(int(v) for v in torch.__version__.split(".")[:2]) < (2, 4):
            self.assertNotEqual(rc, 0)
            self.assertIn('fp16" on the CPU needs libtorch 2.4', err)
            return
        self.assertEqual(rc, 0, err)
        got = DONE.search(out)
        self.assertIsNotNone(got, out)
        self.assertLess(float(got.group(1)), 4.0)
        self.assertRegex(out, r"step 40 loss \S+ lr .* loss_scale \S+ skipped [1-9]")
        self.assertIn("the loss scale halves", out)
        rc, out, err = train(self.data, os.path.join(self.tmp.name, "fp16-kill"), *sets,
                             "fault.kill_rank=1", "fault.kill_at_step=25", restarts=1)
        self.assertEqual(rc, 0, err)
        self.assertIn("resumed from", out)
        self.assertEqual(DONE.search(out).groups(), got.groups())

    def test_nanogpts_prepared_folder_trains_and_samples(self):
        with open(self.data, encoding="utf-8") as f:
            text = f.read()
        chars = sorted(set(text))
        stoi = {c: i for i, c in enumerate(chars)}
        folder = os.path.join(self.tmp.name, "prepared")
        os.makedirs(folder)
        ids = np.array([stoi[c] for c in text], dtype=np.uint16)
        n = int(len(ids) * 0.9)
        ids[:n].tofile(os.path.join(folder, "train.bin"))
        ids[n:].tofile(os.path.join(folder, "val.bin"))
        with open(os.path.join(folder, "meta.pkl"), "wb") as f:
            pickle.dump({"vocab_size": len(chars), "itos": dict(enumerate(chars)),
                         "stoi": stoi}, f)
        ckpt = os.path.join(self.tmp.name, "prepared-ckpt")
        rc, out, err = train(folder, ckpt)
        self.assertEqual(rc, 0, err)
        self.assertIsNotNone(DONE.search(out), out)
        p = subprocess.run([ARGS.train_cfg, CONFIG, "--set", f'data.path="{folder}"',
                            "--set", f'checkpoint.dir="{ckpt}"', "--set", 'sample.prompt="The "',
                            "--sample", "80"] + [a for s in SMALL for a in ("--set", s)],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertTrue(p.stdout.startswith("The "), p.stdout)
        self.assertGreaterEqual(len(p.stdout), 84)
        self.assertTrue(set(p.stdout.rstrip("\n")) <= set(chars), p.stdout)

    def test_bad_keys_exit_2_naming_them(self):
        for sets, says in ((["model.n_embd=30", "model.n_head=4"], "model.n_embd (30)"),
                           (['data.path="/nonexistent"'], "/nonexistent"),
                           (['optimizer.decay="some"'], "optimizer.decay 'some'"),
                           (['data.source="digits"'], 'model.type = "gpt"'),
                           (["train.init_scale=1024"], "train.init_scale")):
            cmd = [ARGS.train_cfg, CONFIG, "--set", f'data.path="{self.data}"']
            for s in sets:
                cmd += ["--set", s]
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
            self.assertIn(says, p.stderr, sets)
            self.assertIn(p.returncode, (1, 2) if "nonexistent" in says else (2,), p.stderr)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]] + REST)
