"""dtrun beside torchrun 2.6 (Debian trixie's, in the root scripts/torch2.sh
makes) on the same worker: the console's bytes with and without --tee and
under TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE, and the stop signal reaching
the worker. Debian's 2.6 lacks libuv, so torchrun itself runs with dtrun's
torch shim on PYTHONPATH (apps/dtrun/README.md, Torch 2.x workers); that changes only the
store's constructor default.

Usage: side_by_side_test.py --dtrun PATH --torch2 scripts/torch2.sh
"""
import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

ARGS = None
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SHIM = os.path.join(ROOT, "apps", "dtrun", "python", "dtrun_torch_shim")

WORKER = r'''
import os, signal, sys, time
rank = os.environ["RANK"]
if len(sys.argv) > 1 and sys.argv[1] == "wait-term":
    def on_term(signo, frame):
        with open(os.path.join(sys.argv[2], "term_" + rank), "w") as f:
            f.write(str(signo))
        sys.exit(0)
    signal.signal(signal.SIGTERM, on_term)
    open(os.path.join(sys.argv[2], "ready_" + rank), "w").close()
    time.sleep(60)
# One write(2) per line: two workers sharing a console (torchrun's plain
# stderr) then interleave whole lines only, whatever Python's buffering.
for i in range(3):
    os.write(1, f"out {i} from rank {rank} of {os.environ['WORLD_SIZE']}\n".encode())
os.write(2, f"err from rank {rank}\n".encode())
'''


class SideBySide(unittest.TestCase):
    def setUp(self):
        # Under /tmp: the root sees the host's /tmp at the same path.
        self.dir = tempfile.mkdtemp(prefix="dtrun-side-", dir="/tmp")
        self.worker = os.path.join(self.dir, "worker.py")
        with open(self.worker, "w") as f:
            f.write(WORKER)
        self.procs = []

    def tearDown(self):
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
        shutil.rmtree(self.dir, ignore_errors=True)

    def torchrun(self, flags, args=(), env=None, wait=True):
        cmd = [ARGS.torch2, "run", "env", f"PYTHONPATH={SHIM}", "TORCH_CPP_LOG_LEVEL=ERROR"]
        cmd += [f"{k}={v}" for k, v in (env or {}).items()]
        cmd += ["/usr/bin/torchrun"] + flags + [self.worker] + list(args)
        return self.launch(cmd, wait)

    def dtrun(self, flags, args=(), env=None, wait=True):
        e = dict(os.environ, PYTHON_EXEC="/usr/bin/python3", **(env or {}))
        return self.launch([ARGS.dtrun] + flags + [self.worker] + list(args), wait, e)

    def launch(self, cmd, wait, env=None):
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             cwd=self.dir, env=env, start_new_session=True)
        self.procs.append(p)
        if not wait:
            return p
        out, err = p.communicate(timeout=180)
        return p.returncode, out, err

    @staticmethod
    def worker_lines(text):
        """The workers' lines of a stream, without either launcher's own log."""
        return [l for l in text.splitlines()
                if re.search(r"(out \d|err) from rank", l)]

    def compare(self, flags, env=None, nproc=1):
        flags = [f"--nproc-per-node={nproc}"] + flags
        rc_t, out_t, err_t = self.torchrun(flags, env=env)
        rc_d, out_d, err_d = self.dtrun(flags, env=env)
        self.assertEqual(rc_t, 0, err_t)
        self.assertEqual(rc_d, 0, err_d)
        if nproc == 1:
            self.assertEqual(out_d, out_t)  # byte for byte
        self.assertEqual(sorted(out_d.splitlines()), sorted(out_t.splitlines()))
        self.assertEqual(sorted(self.worker_lines(err_d)), sorted(self.worker_lines(err_t)))
        return out_d, err_d

    def test_plain_console_is_the_workers_own_bytes(self):
        out, _ = self.compare([])
        self.assertEqual(out, "out 0 from rank 0 of 1\nout 1 from rank 0 of 1\n"
                              "out 2 from rank 0 of 1\n")
        self.compare([], nproc=2)

    def test_tee_prefixes_as_torchrun(self):
        out, _ = self.compare(["--tee=3", "--role=trainer"])
        self.assertTrue(out.startswith("[trainer0]:out 0"), out)
        self.compare(["--tee=1"], nproc=2)

    def test_template_variable_as_torchrun(self):
        env = {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "${role_name}/${rank}/${local_rank}| "}
        out, _ = self.compare(["--tee=3"], env=env, nproc=2)
        self.assertIn("default/1/1| out 2 from rank 1 of 2", out)

    def test_redirects_and_filter_as_torchrun(self):
        self.compare(["--redirects=1", "--tee=2"], nproc=2)
        self.compare(["--local-ranks-filter=1", "--tee=3"], nproc=2)

    def test_sigterm_reaches_the_worker_under_both(self):
        for name, launch in (("torchrun", self.torchrun), ("dtrun", self.dtrun)):
            with self.subTest(launcher=name):
                marks = os.path.join(self.dir, name)
                os.makedirs(marks)
                p = launch(["--nproc-per-node=2"], ["wait-term", marks], wait=False)
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline and len(
                        [f for f in os.listdir(marks) if f.startswith("ready_")]) < 2:
                    time.sleep(0.05)
                # torchrun runs under `chroot` in the root: signal its group.
                os.killpg(p.pid, signal.SIGTERM) if name == "torchrun" else p.send_signal(
                    signal.SIGTERM)
                out, err = p.communicate(timeout=120)
                for rank in (0, 1):
                    with open(os.path.join(marks, f"term_{rank}")) as f:
                        self.assertEqual(f.read(), str(int(signal.SIGTERM)), err)
                print(f"{name}: exit code {p.returncode} after SIGTERM", file=sys.stderr)


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtrun", required=True)
    ap.add_argument("--torch2", required=True)
    ARGS, rest = ap.parse_known_args()
    ARGS.dtrun = os.path.abspath(ARGS.dtrun)
    ARGS.torch2 = os.path.abspath(ARGS.torch2)
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
