"""`dtrun --interactive` end to end: the console driven through a pipe and
through tmux (a real terminal, real Ctrl-C), and the Jupyter extension in a
notebook executed headless. Real workers, real gloo, real store.

Every process a test starts is stopped by pid: the console (or the tmux
server) it started; the launcher dies with the console (PDEATHSIG) and the
workers with the launcher."""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

from dtrun_proc import rank_ordered

p = argparse.ArgumentParser()
p.add_argument("--dtrun", required=True)
ARGS, REST = p.parse_known_args()
ARGS.dtrun = os.path.abspath(ARGS.dtrun)
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
# Session folders (kept by dtrun when a session fails) go under a folder of
# this test's own, removed at the end.
SESSIONS = tempfile.TemporaryDirectory(prefix="dtrun-interactive-test-")
ENV = dict(os.environ, PATH="/usr/bin:" + os.environ.get("PATH", ""), TMPDIR=SESSIONS.name)


def stop(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class Console:
    """A console on pipes; lines of its stdout collected with arrival times."""

    def __init__(self, nproc=2, *flags):
        self.p = subprocess.Popen(
            [ARGS.dtrun, "--interactive", f"--nproc-per-node={nproc}", *flags],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, env=ENV)
        self.lines = []
        self.cv = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.p.stdout:
            with self.cv:
                self.lines.append((time.monotonic(), line.rstrip("\n")))
                self.cv.notify_all()

    def send(self, text):
        self.p.stdin.write(text)
        self.p.stdin.flush()

    def expect(self, fragment, timeout=120):
        """Waits for a line containing `fragment`; returns its arrival time."""
        deadline = time.monotonic() + timeout
        with self.cv:
            while True:
                for t, line in self.lines:
                    if fragment in line:
                        return t
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no line with {fragment!r} in:\n" + self.text())
                self.cv.wait(left)

    def text(self):
        return "\n".join(line for _, line in self.lines)

    def finish(self, timeout=180):
        self.p.stdin.close()
        rc = self.p.wait(timeout)
        time.sleep(0.1)
        return rc

    def kill(self):
        stop(self.p.pid)
        self.p.wait()


class PipeConsole(unittest.TestCase):
    def setUp(self):
        self.c = None

    def tearDown(self):
        if self.c and self.c.p.poll() is None:
            self.c.kill()

    def with_python(self, script):
        """A session whose --python is a shell script; the console's exit code."""
        with tempfile.TemporaryDirectory() as tmp:
            python = os.path.join(tmp, "python3")
            with open(python, "w") as f:
                f.write("#!/bin/sh\n" + script + "\n")
            os.chmod(python, 0o755)
            self.c = Console(2, f"--python={python}")
            return self.c.finish()

    def test_cells_on_all_and_chosen_ranks_keep_per_rank_state(self):
        self.c = Console(2)
        self.c.send("x = torch.ones(2) * (rank + 1)\ndist.all_reduce(x)\nprint(x)\n"
                    "%rank 0\nprint('only', rank, world_size, device)\n"
                    "%rank 1 y = 5\n"
                    "%rank 1-1 y * 2\n"
                    "for i in range(2):\n    print('loop', i)\n\n"
                    "%rank 0,1 x\n")
        self.assertEqual(self.c.finish(), 0, self.c.text())
        out = self.c.text()
        self.assertIn("[rank 0] tensor([3., 3.])\n[rank 1] tensor([3., 3.])", out)
        self.assertIn("[rank 0] only 0 2 cpu", out)
        self.assertNotIn("[rank 1] only", out)
        self.assertIn("[rank 1] 10", out)
        self.assertIn("[rank 0] loop 0\n[rank 0] loop 1\n[rank 1] loop 0\n[rank 1] loop 1", out)

    def test_exception_on_one_rank_leaves_every_rank_alive_with_its_state(self):
        self.c = Console(2)
        self.c.send("v = rank * 10\n%rank 1 raise ValueError('bad on one')\nv\n")
        self.assertEqual(self.c.finish(), 0, self.c.text())
        out = self.c.text()
        self.assertIn("[rank 1] ValueError: bad on one", out)
        self.assertRegex(out, r"\[rank 1\]   Cell In ?\[\d+\], line 1\n")  # IPython's frames
        self.assertNotIn("worker.py", out)  # the user's frames only
        self.assertIn("[rank 0] 0\n[rank 1] 10", out)

    def test_ctrl_c_interrupts_a_collective_only_one_rank_entered(self):
        self.c = Console(2)
        self.c.send("kept = 'still here'; print('ready')\n")
        self.c.expect("[rank 1] ready", timeout=120)  # the console runs cells now
        self.c.send("%rank 0 dist.all_reduce(torch.ones(1))\n")
        time.sleep(2)  # rank 0 is now blocked in gloo
        os.kill(self.c.p.pid, signal.SIGINT)
        self.c.expect("interrupted; it was blocked in native code")
        self.c.send("x = torch.ones(1); dist.all_reduce(x); x\nkept\n")
        self.assertEqual(self.c.finish(), 0, self.c.text())
        out = self.c.text()
        self.assertIn("[rank 0] tensor([2.])\n[rank 1] tensor([2.])", out)
        self.assertIn("[rank 0] 'still here'\n[rank 1] 'still here'", out)

    def test_ctrl_c_and_timeout_reach_noblock_cells(self):
        self.c = Console(2)
        self.c.send("%rank 0 --noblock import time; kept = 1; time.sleep(120)\n")
        self.c.expect("c1: running on rank(s) 0;")
        self.c.send("%result c1 --wait\n")
        time.sleep(1.5)  # the console waits for c1
        os.kill(self.c.p.pid, signal.SIGINT)
        self.c.expect("[rank 0] interrupted")
        self.c.send("%timeout 1\n%rank all --noblock while True: pass\n")
        self.c.expect("c2: running on rank(s) 0-1;")
        self.c.send("%result c2 --wait\n%timeout off\nkept\n")
        self.assertEqual(self.c.finish(), 0, self.c.text())
        out = self.c.text()
        self.assertIn("[rank 0] timed out after 1 s\n[rank 1] timed out after 1 s", out)
        self.assertIn("[rank 0] 1\n", out)  # rank 0 kept its variables
        self.assertIn("[rank 1] NameError: name 'kept' is not defined", out)

    def test_timeout_interrupts_python_code(self):
        self.c = Console(2)
        self.c.send("%timeout 1\nwhile True: pass\n\n%timeout off\nrank\n")
        self.assertEqual(self.c.finish(), 0, self.c.text())
        out = self.c.text()
        self.assertIn("[rank 0] timed out after 1 s\n[rank 1] timed out after 1 s", out)
        self.assertIn("[rank 0] 0\n[rank 1] 1", out)

    def test_stream_shows_output_as_it_is_printed(self):
        self.c = Console(2)
        self.c.send("%stream on\nimport time; print('first', flush=True); time.sleep(2); "
                    "print('second')\n")
        first = self.c.expect("[rank 1] first")
        second = self.c.expect("[rank 1] second")
        self.assertGreater(second - first, 1.0)
        self.assertEqual(self.c.finish(), 0, self.c.text())

    def test_restart_clears_state_and_a_dead_worker_restarts_the_group(self):
        self.c = Console(2)
        self.c.send("a = 1\n%status\n%restart\n'a' in dir()\n"
                    "%rank 1 import os; os.write(2, b'last words\\n'); os._exit(3)\nrank\n")
        self.assertEqual(self.c.finish(), 0, self.c.text())
        out = self.c.text()
        self.assertRegex(out, r"rank  host +pid  alive  state")
        self.assertIn("2 fresh worker(s) ready (attempt 1)", out)
        self.assertIn("[rank 0] False\n[rank 1] False", out)
        self.assertRegex(out, r"\[rank 1\] worker died on \S+ \(exit code 3\); dtrun restarted "
                              r"the group: every rank has fresh state\n"
                              r"\[rank 1\] its last stderr lines \(\S+/stderr.log\):\n"
                              r"(\[rank 1\]   .*\n)*\[rank 1\]   last words\n")
        self.assertIn("[rank 0] 0\n[rank 1] 1", out)

    def test_ipython_cells_noblock_results_and_timeline(self):
        self.c = Console(2)
        self.c.send("x = rank + 1\n!echo shell says $x\n%time y = x * 2\ny\nx?\n"
                    "%%timeit -n 2 -r 1\nz = x + 1\n\n"
                    "%rank all --noblock import time; print('nb', rank, flush=True); "
                    "time.sleep(3 if rank else 0.1); rank * 7\n")
        self.c.expect("c1: running on rank(s) 0-1; %result c1")
        self.c.send("%rank 0 print('rank 0 is free')\n")  # after c1 there
        self.c.expect("[rank 0] rank 0 is free")
        self.c.send("%result c1\n")
        self.c.send("%result c1 --wait\n%timeline 3\n%status\n")
        self.assertEqual(self.c.finish(), 0, self.c.text())
        out = self.c.text()
        self.assertIn("[rank 0] shell says 1\n[rank 1] shell says 2\n", out)
        self.assertRegex(out, r"\[rank 1\] Wall time: ")
        self.assertIn("[rank 0] 2\n[rank 1] 4\n", out)  # y = x * 2, each rank's own x
        self.assertIn("[rank 1] String form: 2", out)
        self.assertRegex(out, r"\[rank 0\] \d+(\.\d+)? \S?s \+- \d")
        self.assertRegex(out, r"\[rank 0\] nb 0\n\[rank 0\] 0\n\[rank 1\] nb 1\n"
                              r"\[rank 1\] \.\.\. still running \(\d\.\d s so far\)")
        self.assertIn("[rank 1] nb 1\n[rank 1] 7", out)
        self.assertRegex(out, r"\[c1\] import time; print\S* +\d+\.\d ms +3\.\d\d s\* +"
                              r"rank 1 \(\+\d\.\d\d s\)")
        self.assertRegex(out, r"cells run through IPython \d+\.\d+\.\d+ on every rank")

    def test_bad_input_gets_a_message_and_the_session_goes_on(self):
        self.c = Console(2)
        self.c.send("def broken(:\n%bogus\n%rank 5 1\n%rank x 1\n%timeout soon\n%stream maybe\n"
                    "%result\n%result c9\n%timeline x\n%help\nrank + 100\n")
        self.assertEqual(self.c.finish(), 0, self.c.text())
        out = self.c.text()
        self.assertIn("SyntaxError: ", out)
        self.assertIn("nothing was run", out)
        self.assertIn("[rank 0] UsageError: Line magic function `%bogus` not found.", out)
        self.assertIn("error: rank 5 is out of range: this session has ranks 0-1", out)
        self.assertIn("error: rank list 'x': 'x' is not a rank or a range like 1-3", out)
        self.assertIn("usage: %timeout SECONDS (> 0) | off", out)
        self.assertIn("usage: %stream on|off", out)
        self.assertIn("usage: %result NAME [--wait]", out)
        self.assertIn("error: no non-blocking cell named 'c9' (this session has: none)", out)
        self.assertIn("usage: %timeline [N] (the last N cells, default 10)", out)
        self.assertIn("%restart", out)
        self.assertIn("[rank 0] 100\n[rank 1] 101", out)

    def test_workers_that_cannot_start_are_named_not_restarted_forever(self):
        # An interpreter whose workers die at once (as one without torch would).
        rc = self.with_python('case "$*" in *dtrun.worker*) '
                              'echo "ModuleNotFoundError: no torch in this python" >&2; exit 1;; esac\n'
                              'exec /usr/bin/python3 "$@"')
        self.assertEqual(rc, 1, self.c.text())
        out = self.c.text()
        self.assertIn("error: the workers keep failing before they serve cells", out)
        self.assertIn("ModuleNotFoundError: no torch in this python", out)

    def test_a_python_without_torch_is_named(self):
        rc = self.with_python('exec /usr/bin/python3 -S "$@"')  # no site: no torch
        self.assertEqual(rc, 1, self.c.text())
        self.assertIn("cannot import what a session needs (No module named 'torch'); pass "
                      "--python with a Python that has PyTorch", self.c.text())

    def test_bad_flags_exit_2(self):
        for argv, says in [(["--interactive", "train.py"], "drop the program 'train.py'"),
                           (["--no-console", "true"], "--no-console goes with --interactive"),
                           (["--gpu-ids=0", "true"], "--gpu-ids goes with --interactive")]:
            p = subprocess.run([ARGS.dtrun, *argv], capture_output=True, text=True, env=ENV)
            self.assertEqual(p.returncode, 2, p.stderr)
            self.assertIn(says, p.stderr)

    def test_bad_gpu_ids_exit_2(self):
        # Checked against CUDA_VISIBLE_DEVICES (ids index into it), so no GPU is needed.
        env = dict(ENV, CUDA_VISIBLE_DEVICES="0,1,2")
        for ids, says in [("0,5", "unknown GPU 5: this host shows 3 GPU(s) (ids 0-2) through "
                                  "CUDA_VISIBLE_DEVICES"),
                          ("1,1", "GPU 1 is listed twice; give each rank its own"),
                          ("2", "1 id(s) for 2 ranks; give one GPU per rank"),
                          ("0,x", "'x' is not a GPU id; give ids like 0,2")]:
            p = subprocess.run([ARGS.dtrun, "--interactive", "--nproc-per-node=2",
                                f"--gpu-ids={ids}"], capture_output=True, text=True, env=env,
                               stdin=subprocess.DEVNULL, timeout=60)
            self.assertEqual(p.returncode, 2, p.stderr)
            self.assertIn(f"dtrun: --gpu-ids: {says}", p.stderr)

    def test_gpu_ids_reach_the_workers(self):
        global ENV
        saved = ENV
        ENV = dict(ENV, CUDA_VISIBLE_DEVICES="0,1,2")
        try:
            self.c = Console(2, "--gpu-ids=2,0")
        finally:
            ENV = saved
        self.c.send("import os; os.environ['DTRUN_GPU_IDS']\n")
        self.assertEqual(self.c.finish(), 0, self.c.text())
        self.assertIn("[rank 0] '2,0'\n[rank 1] '2,0'", self.c.text())

    def test_push_pull_show_sync_and_rich_output_as_text(self):
        self.c = Console(2)
        self.c.send("%push w=torch.arange(3.) * 2\n"
                    "%rank 1 w = w + rank\n"
                    "%pull w --rank 1\n"
                    "%pull nope --rank 1\n"
                    "%rank 0,1 --show 0 print('line from', rank)\n"
                    "%rank 0,1 --show 0 1 / rank\n"
                    "%sync\n"
                    "%rank 1 from IPython.display import HTML; HTML('<i>x</i>')\n"
                    "%push bad\n%pull\n%rank 0 --show 1 1\n"
                    "%rank 0 d = {'a': torch.arange(3, dtype=torch.int16), "
                    "'b': [torch.ones(2, dtype=torch.bfloat16)], 'c': 'text'}\n"
                    "%pull d\n")
        self.assertEqual(self.c.finish(), 0, self.c.text())
        out = self.c.text()
        self.assertIn("pushed w to rank(s) 0, 1", out)
        self.assertIn("[rank 1] w = tensor([1., 3., 5.])", out)
        self.assertIn("error: rank 1 has no variable 'nope'", out)
        self.assertIn("[rank 0] line from 0", out)
        self.assertNotIn("[rank 1] line from 1", out)
        self.assertIn("[rank 0] ZeroDivisionError: division by zero", out)
        self.assertNotIn("[rank 1] 1.0", out)
        self.assertIn("all 2 ranks reached the barrier", out)
        self.assertIn("[rank 1] <IPython.core.display.HTML object> (text/html: shown in a "
                      "notebook)", out)
        self.assertIn("usage: %push NAME=EXPR [--ranks SPEC]", out)
        self.assertIn("usage: %pull NAME [--rank R]", out)
        self.assertIn("error: --show 1: name one of the ranks that run the cell", out)
        self.assertIn("[rank 0] d = {'a': tensor([0, 1, 2], dtype=torch.int16), "
                      "'b': [tensor([1., 1.], dtype=torch.bfloat16)], 'c': 'text'}", out)


@unittest.skipUnless(shutil.which("tmux"), "tmux is not installed")
class ExecCells(unittest.TestCase):
    """Workers whose Python cannot import IPython run cells through exec,
    and say so."""

    def test_plain_python_without_ipython(self):
        with tempfile.TemporaryDirectory() as tmp:
            # Debian's Python and torch, with every package but IPython.
            farm = os.path.join(tmp, "site")
            os.mkdir(farm)
            dist = "/usr/lib/python3/dist-packages"
            for name in os.listdir(dist):
                if not name.startswith(("IPython", "ipython")):
                    os.symlink(os.path.join(dist, name), os.path.join(farm, name))
            python = os.path.join(tmp, "python3")
            with open(python, "w") as f:
                f.write(f'#!/bin/sh\nPYTHONPATH="$PYTHONPATH:{farm}" '
                        'exec /usr/bin/python3 -S "$@"\n')
            os.chmod(python, 0o755)
            c = Console(2, f"--python={python}")
            try:
                c.send("%status\nv = rank\n!ls\n%bogus\n%rank 1 raise ValueError('plain')\nv\n")
                self.assertEqual(c.finish(), 0, c.text())
            finally:
                if c.p.poll() is None:
                    c.kill()
        out = c.text()
        self.assertIn("cells run through exec on every rank (no IPython in the workers' "
                      "Python: no magics, !cmd or obj?)", out)
        self.assertIn("SyntaxError: invalid syntax (line 1); nothing was run", out)
        self.assertIn("unknown magic %bogus; %help lists them", out)
        self.assertIn('[rank 1]   File "<cell>", line 1, in <module>', out)
        self.assertIn("[rank 1] ValueError: plain", out)
        self.assertIn("[rank 0] 0\n[rank 1] 1", out)


class TmuxConsole(unittest.TestCase):
    """The console in a real terminal: line editing, Ctrl-C from the keyboard."""

    def setUp(self):
        self.sock = f"dtrun-test-{os.getpid()}"
        self.tmux = ["tmux", "-L", self.sock, "-f", "/dev/null"]
        subprocess.run(self.tmux + ["new-session", "-d", "-x", "160", "-y", "50",
                                    f"{ARGS.dtrun} --interactive --nproc-per-node=2"],
                       check=True, env=ENV)
        self.server = int(subprocess.run(self.tmux + ["display-message", "-p", "#{pid}"],
                                         capture_output=True, text=True, check=True).stdout)

    def tearDown(self):
        stop(self.server)

    def screen(self):
        return subprocess.run(self.tmux + ["capture-pane", "-p", "-J", "-S", "-200"],
                              capture_output=True, text=True).stdout

    def keys(self, *keys):
        subprocess.run(self.tmux + ["send-keys", *keys], check=True)

    def wait_for(self, fragment, timeout=120):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if fragment in self.screen():
                return
            time.sleep(0.2)
        self.fail(f"no {fragment!r} on the screen:\n{self.screen()}")

    def test_terminal_session(self):
        self.wait_for("2 rank(s) ready")
        self.keys("t = torch.arange(3) + rank", "Enter")
        self.keys("dist.all_reduce(t); t", "Enter")
        self.wait_for("[rank 1] tensor([1, 3, 5])")
        # Line editing: type, step back over ")", insert, run ("rank+100").
        self.keys("%rank 0 print(rank+10)", "Left", "0", "Enter")
        self.wait_for("[rank 0] 100\n")
        # Tab completes from rank 0's namespace.
        self.keys("model = torch.nn.Linear(2, 2)", "Enter")
        self.keys("model.we", "Tab")
        self.wait_for(">>> model.weight")
        self.keys(".shape", "Enter")
        self.wait_for("[rank 1] torch.Size([2, 2])")
        self.keys("%rank 0 dist.all_reduce(torch.ones(1))", "Enter")
        time.sleep(3)
        self.keys("C-c")
        self.wait_for("process group was re-created on every rank")
        self.keys("t", "Enter")
        self.wait_for("[rank 0] tensor([1, 3, 5])")
        self.keys("%shutdown", "Enter")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and subprocess.run(
                self.tmux + ["has-session"], capture_output=True).returncode == 0:
            time.sleep(0.2)
        self.assertNotEqual(subprocess.run(self.tmux + ["has-session"],
                                           capture_output=True).returncode, 0,
                            "the console did not leave on %shutdown")


class Notebook(unittest.TestCase):
    def test_example_notebook_runs_headless(self):
        jupyter = shutil.which("jupyter", path=ENV["PATH"])
        if not jupyter:
            self.skipTest("jupyter (jupyter-nbconvert, python3-ipykernel) is not installed")
        with tempfile.TemporaryDirectory() as tmp:
            env = dict(ENV, PYTHONPATH=os.path.join(ROOT, "apps", "dtrun", "python"),
                       DTRUN=ARGS.dtrun, PYDEVD_DISABLE_FILE_VALIDATION="1")
            p = subprocess.run([jupyter, "nbconvert", "--to", "notebook", "--execute",
                                "--ExecutePreprocessor.timeout=120", "--output-dir", tmp,
                                "--output", "out.ipynb",
                                os.path.join(ROOT, "examples", "interactive.ipynb")],
                               capture_output=True, text=True, env=env, timeout=300)
            self.assertEqual(p.returncode, 0, p.stderr)
            with open(os.path.join(tmp, "out.ipynb")) as f:
                nb = json.load(f)
        # A cell's stream outputs joined (the kernel may split a stream in several).
        # Streamed: two ranks' lines may come either way round.
        outputs = [rank_ordered("".join("".join(o.get("text", "")) for o in c.get("outputs", [])
                                        if o["output_type"] == "stream"))
                   for c in nb["cells"]]
        self.assertIn("[rank 0] tensor([3., 3.])\n[rank 1] tensor([3., 3.])\n", outputs)
        self.assertIn("[rank 0] hello from rank 0 of 2\n", outputs)
        self.assertTrue(any("[rank 1] ValueError: a mistake on rank 1" in o for o in outputs))
        self.assertIn("[rank 1] kept on rank 1\n", outputs)
        self.assertTrue(any(o.startswith("[rank 0] final loss ") for o in outputs), outputs)
        self.assertTrue(any(o.startswith("c1: running on rank(s) 0-1;") for o in outputs))
        self.assertTrue(any("[rank 1] step 2\n" in o and "[rank 1] 1\n" in o for o in outputs))
        self.assertTrue(any(o.startswith("[rank 0] shell on rank 0\n") and "Wall time" in o
                            for o in outputs), outputs)
        self.assertTrue(any(re.search(r"\[c1\] import time .*\* +rank 1", o) for o in outputs),
                        outputs)
        images = [o for c in nb["cells"] for o in c.get("outputs", [])
                  if o["output_type"] == "display_data" and "image/png" in o["data"]]
        self.assertEqual([o["metadata"]["dtrun"]["rank"] for o in images], [0])
        self.assertIn("pushed scale to rank(s) 0, 1\n", outputs)
        self.assertIn("pulled scaled from rank 1\npulled from rank 1: torch.Size([3]) cpu\n",
                      outputs)
        self.assertIn("[rank 1] only rank 1 is shown; rank 1 ran too\n", outputs)
        self.assertIn("all 2 ranks reached the barrier\n", outputs)
        self.assertTrue(any(o.startswith("rank 0: host ") and "alive, idle" in o for o in outputs))
        self.assertIn("dtrun: workers stopped\n", outputs)

if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]] + REST, verbosity=2)
