"""train_cfg under the real dtrun: accuracy on digits, bitwise resume, a
worker killed with SIGKILL and recovered from its checkpoint, bad configs."""
import os
import re
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
CONFIG = os.path.join(HERE, "..", "..", "examples", "configs", "digits_ddp.toml")
DONE = re.compile(r"done: steps=(\d+) loss=(\S+) eval_accuracy=(\S+) params_sha256=([0-9a-f]{64})")


def train(nproc, *sets, restarts=0):
    cmd = [ARGS.dtrun, f"--nproc-per-node={nproc}", f"--max-restarts={restarts}",
           ARGS.train_cfg, CONFIG]
    for s in sets:
        cmd += ["--set", s]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    return p.returncode, p.stdout, p.stderr


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

    def test_bad_config_exits_2_naming_the_key(self):
        rc, _, err = train(1, "train.stepz=3")
        self.assertNotEqual(rc, 0)
        self.assertIn("unknown key 'train.stepz'", err)
        p = subprocess.run([ARGS.train_cfg, "/nonexistent.toml"], capture_output=True, text=True)
        self.assertEqual(p.returncode, 2)
        self.assertIn("/nonexistent.toml", p.stderr)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]] + REST, verbosity=2)
