"""Stragglers under the real dtrun: train_cfg's [fault] slow_rank makes one
rank compute 3 times as long; dtrun names it within 400 steps, from the
beats alone (the rule asks for persistence over 40 steps and 5 s, and a
burst of the host's noise starts them again), and in undisturbed runs of
300 steps names nobody at a score under 0.5. A score between 0.5 and the
threshold can be the host's truth: on a VM whose virtual cores share
physical ones with other guests, one core ran a rank 1.5 times slower for
seconds with no wait the guest could see (scores 0.61 and 0.67 in two CI
runs); that rank did hold the job back. Timing-sensitive: the test runs
alone (RUN_SERIAL). The rule takes the host's noise out (each rank's wait for a
core) and asks for persistence; its false alarms with a whole suite beside
it are measured in tests/bench/straggler_bench.py."""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import unittest

p = argparse.ArgumentParser()
p.add_argument("--dtrun", required=True)
p.add_argument("--train-cfg", required=True)
ARGS, REST = p.parse_known_args()
HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG = os.path.join(HERE, "..", "..", "examples", "configs", "digits_ddp.toml")
# A 256-wide MLP on batches of 256: ~20 ms of compute a step, so that the
# window of 20 steps spans ~0.4 s and a hiccup of the host's (another
# program on a core for a tenth of a second) cannot fill it; with steps of
# ~3 ms it did, once in some tens of undisturbed runs. 300 steps (~9 s)
# leave each undisturbed run seconds past the rule's 5 s in which a false
# alarm would show; the slow rank's 400 (12-23 s) leave room for a streak
# that a noisy read started again (in the forky root, 240 steps of 9 s
# once named nobody).
SHORT = ["train.steps=300", "model.hidden=[256, 256]", "train.batch_size=256",
         "train.eval_every=0"]


class Stragglers(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.tmp.cleanup()

    def train(self, name, *sets, flags=()):
        cmd = [ARGS.dtrun, "--nproc-per-node=2", *flags, ARGS.train_cfg, CONFIG, "--set",
               f'checkpoint.dir="{os.path.join(self.tmp.name, name)}"']
        for s in list(SHORT) + list(sets):
            cmd += ["--set", s]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
        self.assertEqual(p.returncode, 0, p.stderr)
        return re.findall(r"straggler: rank (\d+) computes .*\(score ([\d.]+),",
                          p.stderr), p.stderr

    def test_a_slow_rank_is_named_within_400_steps(self):
        logs = os.path.join(self.tmp.name, "logs")
        named, err = self.train("slow", "fault.slow_rank=1", "fault.slow_factor=3",
                                "train.steps=400", flags=["--log-dir", logs])
        self.assertEqual([rank for rank, _ in named[:1]], ["1"], err)
        # The run's picture names it too.
        (run,) = os.listdir(logs)
        with open(os.path.join(logs, run, "report.html")) as f:
            html = f.read()
        self.assertIn("<svg", html)
        self.assertIn("straggler: rank 1", html)
        self.assertIn("the job succeeded", html)

    def test_nobody_in_5_undisturbed_runs(self):
        for run in range(5):
            named, err = self.train(f"even{run}")
            self.assertEqual([n for n in named if float(n[1]) < 0.5], [], err)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]] + REST)
