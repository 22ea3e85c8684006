"""examples/consumer/trainer.cc under the real dtrun: a model of its own
(not a Sequential) through the library's trainer, with its own batches,
loss, metric and checkpointed state. A rank SIGKILLed midway resumes onto
the bits of an unbroken run, its own state (an average of the loss) too, in
the async and the memory checkpoint modes."""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import unittest

p = argparse.ArgumentParser()
p.add_argument("--dtrun", required=True)
p.add_argument("--trainer", required=True)
ARGS, REST = p.parse_known_args()
END = re.compile(r"(done: steps=120 loss=\S+ val_mse=\S+ params_sha256=[0-9a-f]{64})\n"
                 r"consumer_trainer: loss_ema=(\S+)")


def run(folder, *extra, restarts=0):
    p = subprocess.run([ARGS.dtrun, "--nproc-per-node=2", f"--max-restarts={restarts}",
                        ARGS.trainer, folder, *extra], capture_output=True, text=True,
                       timeout=240)
    return p.returncode, p.stdout, p.stderr


class ConsumerTrainer(unittest.TestCase):
    def test_a_killed_rank_resumes_onto_an_unbroken_runs_bits_and_state(self):
        with tempfile.TemporaryDirectory() as tmp:
            rc, out, err = run(os.path.join(tmp, "clean"))
            self.assertEqual(rc, 0, err)
            clean = END.search(out)
            self.assertIsNotNone(clean, out)
            for mode in ("async", "memory"):
                rc, out, err = run(os.path.join(tmp, mode), "60", mode, restarts=1)
                self.assertEqual(rc, 0, err)
                self.assertIn("SIGKILL", err)
                self.assertIn("resumed from", out)
                got = END.search(out)
                self.assertIsNotNone(got, out)
                self.assertEqual(got.groups(), clean.groups(), mode)

    def test_a_bad_mode_exits_2_naming_it(self):
        with tempfile.TemporaryDirectory() as tmp:
            p = subprocess.run([ARGS.trainer, tmp, "10", "flash"], capture_output=True, text=True)
            self.assertEqual(p.returncode, 2)
            self.assertIn("checkpoint.mode 'flash'", p.stderr)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]] + REST)
