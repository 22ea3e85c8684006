"""The Jupyter extension of `dtrun --interactive` in a real kernel: notebooks
executed headless with nbclient (outputs and output types asserted) and a
kernel driven through jupyter_client (interrupts, completion). Real
workers, real gloo, real store. The kernel stops its dtrun (PDEATHSIG) and
the clients stop their kernels."""
import argparse
import os
import queue
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import unittest

from dtrun_proc import rank_ordered

p = argparse.ArgumentParser()
p.add_argument("--dtrun", required=True)
p.add_argument("--python", default="/usr/bin/python3",
               help="the workers' Python (scripts/torch2-python: torch 2.6 workers)")
ARGS, REST = p.parse_known_args()
ARGS.dtrun = os.path.abspath(ARGS.dtrun)
INIT = f"%dist_init --num-processes 2 --python {ARGS.python}"
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
SESSIONS = tempfile.TemporaryDirectory(prefix="dtrun-notebook-test-")
# The kernel (started by these clients) inherits this environment.
os.environ.update(PATH="/usr/bin:" + os.environ.get("PATH", ""), TMPDIR=SESSIONS.name,
                  PYTHONPATH=os.path.join(ROOT, "apps", "dtrun", "python"), DTRUN=ARGS.dtrun,
                  PYDEVD_DISABLE_FILE_VALIDATION="1")

try:
    import jupyter_client
    import nbformat
    from nbclient import NotebookClient
except ImportError:
    jupyter_client = None


def run_notebook(sources, timeout=180):
    """Executes cells (errors allowed); returns the executed cells."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    NotebookClient(nb, timeout=timeout, allow_errors=True, kernel_name="python3").execute()
    return nb.cells


def stream_text(cell, name="stdout"):
    return "".join(o.get("text", "") for o in cell.outputs
                   if o.output_type == "stream" and o.name == name)


def errors(cell):
    """IPython shows a magic's UsageError as one stderr line, not as an error output."""
    return [line for line in stream_text(cell, "stderr").splitlines()
            if line.startswith("UsageError: ")]


@unittest.skipUnless(jupyter_client and shutil.which("jupyter"),
                     "jupyter (python3-nbclient, python3-ipykernel) is not installed")
class Magics(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cells = run_notebook([
            "%load_ext dtrun",                                                     # 0
            INIT,                                                                  # 1
            "%dist_mode off",                                                      # 2
            "local_only = 42\nprint('kernel has', local_only)",                    # 3
            "%%distributed\nprint('has local_only:', 'local_only' in dir())",      # 4
            "%%rank [0] --local\nboth = 7\nprint('both set')",                     # 5
            "print('kernel both', both)",                                          # 6
            "import torch\nt = torch.arange(4.)\n%dist_push t --ranks 1",          # 7
            "%%rank [1]\nt2 = t * 10\nt2",                                         # 8
            "%dist_pull t2 --rank 1\nprint(t2.tolist(), torch.cuda.is_initialized())",  # 9
            "%dist_pull nothing_here --rank 1",                                    # 10
            "%%rank 0-1 --show 1\nprint('from', rank)\n"
            "if rank == 0:\n    raise ValueError('zero fails')",                   # 11
            "%%distributed\nimport matplotlib.pyplot as plt\nif rank == 1:\n"
            "    plt.plot([1, 2, 3])\n    plt.show()",                             # 12
            "%%rank [0]\nfrom IPython.display import HTML\nHTML('<b>bold on zero</b>')",  # 13
            "%sync",                                                               # 14
            "%dist_mode on",                                                       # 15
            "x = rank + 1\nx",                                                     # 16
            "%dist_stream off\n%dist_timeout 1",                                   # 17
            "while True: pass",                                                    # 18
            "%dist_timeout off",                                                   # 19
            "x * 100",                                                             # 20
            "%dist_status",                                                        # 21
            "%dist_restart",                                                       # 22
            "'x' in dir()",                                                        # 23
            "%dist_mode maybe",                                                    # 24
            "%%rank 7\n1",                                                         # 25
            "%dist_timeout soon",                                                  # 26
            "%%rank 0 --show 1\n1",                                                # 27
            "%dist_push not_in_kernel",                                            # 28
            "%dist_shutdown",                                                      # 29
        ])

    def test_mode_off_runs_plain_cells_in_the_kernel(self):
        c = self.cells
        self.assertIn("dtrun: 2 rank(s) ready", stream_text(c[1]))
        self.assertIn("dist_mode off", stream_text(c[2]))
        self.assertEqual(stream_text(c[3]), "kernel has 42\n")
        self.assertEqual(rank_ordered(stream_text(c[4])),
                         "[rank 0] has local_only: False\n[rank 1] has local_only: False\n")
        self.assertEqual(stream_text(c[5]), "[rank 0] both set\nboth set\n")
        self.assertEqual(stream_text(c[6]), "kernel both 7\n")

    def test_push_and_pull_a_tensor(self):
        c = self.cells
        self.assertIn("pushed t to rank(s) 1", stream_text(c[7]))
        self.assertIn("[rank 1] tensor([ 0., 10., 20., 30.])", stream_text(c[8]))
        self.assertEqual(stream_text(c[9]), "pulled t2 from rank 1\n[0.0, 10.0, 20.0, 30.0] False\n")
        self.assertEqual(errors(c[10]), ["UsageError: rank 1 has no variable 'nothing_here'"])
        self.assertEqual(errors(c[28]), ["UsageError: the kernel has no variable 'not_in_kernel'"])

    def test_show_keeps_one_ranks_output_and_every_error(self):
        out = stream_text(self.cells[11])
        self.assertIn("[rank 1] from 1", out)
        self.assertNotIn("[rank 0] from 0", out)
        self.assertIn("[rank 0] ValueError: zero fails", out)

    def test_rich_output_arrives_as_its_type_labelled(self):
        [html] = [o for o in self.cells[13].outputs if o.output_type == "display_data"]
        self.assertIn("<b>bold on zero</b>", html.data["text/html"])
        self.assertIn("[rank 0]", html.data["text/html"])
        if "No module named 'matplotlib'" in stream_text(self.cells[12]):
            self.skipTest(f"{ARGS.python} has no matplotlib (the HTML output was checked)")
        [png] = [o for o in self.cells[12].outputs if o.output_type == "display_data"]
        self.assertIn("image/png", png.data)
        self.assertTrue(png.data["text/plain"].startswith("[rank 1] <Figure"), png.data)
        self.assertEqual(png.metadata["dtrun"]["rank"], 1)
        self.assertGreater(len(png.data["image/png"]), 1000)

    def test_sync_timeout_status_restart(self):
        c = self.cells
        self.assertEqual(stream_text(c[14]), "all 2 ranks reached the barrier\n")
        self.assertEqual(stream_text(c[16]), "[rank 0] 1\n[rank 1] 2\n")
        self.assertIn("[rank 0] timed out after 1 s\n[rank 1] timed out after 1 s",
                      stream_text(c[18]))
        self.assertIn("[rank 0] 100\n[rank 1] 200", stream_text(c[20]))
        status = stream_text(c[21])
        self.assertRegex(status, r"rank 0: host \S+, pid \d+, alive, idle")
        self.assertRegex(status, r"rank 1: host \S+, pid \d+, alive, idle")
        self.assertIn("2 fresh worker(s) ready (attempt 1)", stream_text(c[22]))
        self.assertEqual(stream_text(c[23]), "[rank 0] False\n[rank 1] False\n")
        self.assertEqual(stream_text(c[29]), "dtrun: workers stopped\n")

    def test_bad_magics_are_usage_errors(self):
        c = self.cells
        self.assertEqual(errors(c[24]), ["UsageError: usage: %dist_mode on|off (no argument: "
                                                        "show it)"])
        self.assertEqual(errors(c[25]), ["UsageError: rank 7 is out of range: this session "
                                                        "has ranks 0-1"])
        self.assertEqual(errors(c[26]), ["UsageError: usage: %dist_timeout SECONDS (> 0) | off"])
        self.assertEqual(errors(c[27]), ["UsageError: --show 1: rank 1 does not run this cell (0)"])


@unittest.skipUnless(jupyter_client and shutil.which("jupyter"),
                     "jupyter (python3-nbclient, python3-ipykernel) is not installed")
class IPythonCells(unittest.TestCase):
    """Cells through the ranks' IPython, non-blocking cells, --local alike for
    %%rank and %%distributed, the per-rank timeline."""

    @classmethod
    def setUpClass(cls):
        kernel = "%dist_mode off\n{}\n%dist_mode on"  # a cell run in the kernel
        cls.cells = run_notebook([
            "%load_ext dtrun",                                                     # 0
            INIT,                                                                  # 1
            "!echo shell on $rank",                                                # 2
            "%%distributed\n%time y = sum(range(rank + 3))\ny",                    # 3
            "y?",                                                                  # 4
            "%dist_status",                                                        # 5
            "%%distributed --noblock\nimport time\nprint('begin', rank, flush=True)\n"
            "time.sleep(4 if rank == 1 else 0.2)\nprint('end', rank)\nrank * 11",    # 6
            kernel.format("import time\ntime.sleep(1.5)\n%dist_result c1"),         # 7
            "%dist_result c1 --wait",                                              # 8
            "%dist_result c1",                                                     # 9
            "%%rank 0 --noblock\nimport time\ntime.sleep(6)",                      # 10
            "%dist_timeout 2",                                                     # 11
            "%%distributed --noblock\nwhile True: pass",                           # 12
            kernel.format("time.sleep(3)\n%dist_result c3"),                       # 13
            "%dist_result c3 --wait",                                              # 14
            "%dist_timeout off",                                                   # 15
            "%%distributed --local\nshared = 5\nprint('set')",                     # 16
            kernel.format("print('kernel shared', shared)"),                       # 17
            "%%rank [1] --local --noblock\nboth_nb = 3",                            # 18
            kernel.format("print('kernel both_nb', both_nb)"),                     # 19
            "%%rank [0]\nimport time\ntime.sleep(0.3)",                             # 20
            "%dist_timeline 20",                                                   # 21
            "%dist_result c9",                                                     # 22
            "%dist_result",                                                        # 23
            "%dist_timeline x",                                                    # 24
            "%%distributed 0\n1",                                                 # 25
            "%dist_shutdown",                                                      # 26
        ], timeout=240)

    def test_shell_magics_and_help_run_through_ipython_on_each_rank(self):
        c = self.cells
        self.assertEqual(rank_ordered(stream_text(c[2])),
                         "[rank 0] shell on 0\n[rank 1] shell on 1\n")
        out = stream_text(c[3])
        self.assertRegex(out, r"\[rank 0\] Wall time: .*\n")
        self.assertRegex(out, r"\[rank 1\] CPU times: .*\n")
        self.assertIn("[rank 0] 3\n[rank 1] 6\n", out)
        self.assertIn("[rank 0] Type:", stream_text(c[4]))
        self.assertIn("[rank 1] String form: 6", stream_text(c[4]))
        self.assertRegex(stream_text(c[5]).splitlines()[-1],
                         r"^cells run through IPython \d+\.\d+\.\d+ on every rank")

    def test_noblock_returns_at_once_and_shows_what_arrived(self):
        c = self.cells
        self.assertRegex(stream_text(c[6]), r"^c1: running on rank\(s\) 0-1; %dist_result c1")
        so_far = stream_text(c[7])
        self.assertIn("[rank 0] begin 0\n[rank 0] end 0\n[rank 0] 0\n", so_far)
        self.assertRegex(so_far, r"\[rank 1\] begin 1\n\[rank 1\] \.\.\. still running "
                                 r"\(\d+\.\d s so far\)")
        self.assertNotIn("end 1", so_far)
        self.assertIn("[rank 1] end 1\n", stream_text(c[8]))
        self.assertIn("[rank 1] 11", stream_text(c[8]))
        self.assertIn("[rank 0] 0\n", stream_text(c[9]))
        self.assertIn("[rank 1] end 1\n[rank 1] 11\n", stream_text(c[9]))

    def test_timeout_on_a_noblock_cell_and_one_queued_behind_another(self):
        c = self.cells
        self.assertRegex(stream_text(c[12]), r"c3: running on rank\(s\) 0-1")
        so_far = stream_text(c[13])
        self.assertIn("[rank 0] ... waiting behind c2\n", so_far)
        self.assertIn("[rank 1] timed out after 2 s\n", so_far)
        self.assertEqual(stream_text(c[14]),
                         "[rank 0] timed out after 2 s\n[rank 1] timed out after 2 s\n")

    def test_local_means_ranks_and_kernel_for_both_magics(self):
        c = self.cells
        self.assertEqual(rank_ordered(stream_text(c[16])), "[rank 0] set\n[rank 1] set\nset\n")
        self.assertIn("kernel shared 5", stream_text(c[17]))
        self.assertIn("kernel both_nb 3", stream_text(c[19]))

    def test_timeline_marks_the_slowest_rank(self):
        lines = stream_text(self.cells[21]).splitlines()
        self.assertRegex(lines[0], r"^ *cell +code +rank 0 +rank 1 +slowest$")
        # c1: rank 0 slept 0.2 s, rank 1 4 s.
        [c1] = [line for line in lines if "[c1]" in line]
        self.assertRegex(c1, r"\[c1\] import time +\d+\.\d+ m?s +4\.\d\d s\* +"
                             r"rank 1 \(\+3\.\d\d s\)$")
        [c3] = [line for line in lines if "[c3]" in line]
        self.assertRegex(c3, r"\[c3\] while True: pass +2\.\d\d s\*? +2\.\d\d s\*? +rank")
        self.assertRegex(lines[-2], r"\[c4\] both_nb = 3 +- +\d+\.\d ms +$")
        self.assertRegex(lines[-1], r"import time +\d+\.\d+ m?s +- +$")

    def test_bad_input(self):
        c = self.cells
        self.assertEqual(errors(c[22]), ["UsageError: no non-blocking cell named 'c9' "
                                         "(this session has: c1, c2, c3, c4)"])
        self.assertEqual(errors(c[23]), ["UsageError: usage: %dist_result NAME [--wait]"])
        self.assertEqual(errors(c[24]), ["UsageError: usage: %dist_timeline [N] (the last N "
                                         "cells, default 10)"])
        self.assertEqual(errors(c[25]), ["UsageError: %%distributed runs on every rank "
                                         "('0'?): %%rank SPEC picks ranks"])


@unittest.skipUnless(jupyter_client and shutil.which("jupyter"),
                     "jupyter (python3-nbclient, python3-ipykernel) is not installed")
class Kernel(unittest.TestCase):
    """A kernel driven as a notebook front end drives it."""

    @classmethod
    def setUpClass(cls):
        cls.km, cls.kc = jupyter_client.manager.start_new_kernel(kernel_name="python3")

    @classmethod
    def tearDownClass(cls):
        cls.execute("%dist_shutdown")
        cls.kc.stop_channels()
        cls.km.shutdown_kernel(now=True)

    @classmethod
    def execute(cls, code, until=None, then=None, timeout=180):
        """Runs code; calls then() once a stream output contains `until`;
        returns the text of the stream outputs."""
        msg_id = cls.kc.execute(code)
        text, deadline, fired = "", time.monotonic() + timeout, False
        while True:
            try:
                msg = cls.kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no end of {code!r} in {timeout} s; so far:\n{text}")
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                text += content["text"]
                if until and not fired and until in text:
                    fired = True
                    then()
            elif kind == "error":
                text += f"{content['ename']}: {content['evalue']}\n"
            elif kind == "status" and content["execution_state"] == "idle":
                return text

    def test_a_session(self):
        self.execute("%load_ext dtrun")
        self.assertIn("2 rank(s) ready", self.execute(INIT))
        # Completion from rank 0's namespace, no copy to the kernel.
        self.execute("%%rank [0]\nmodel = torch.nn.Linear(2, 2)")
        reply = self.kc.complete("model.we", 8, reply=True, timeout=60)["content"]
        self.assertIn("model.weight", reply["matches"])
        self.assertNotIn("'model'", self.execute("%dist_mode off\nprint(sorted(dir()))"))
        self.execute("%dist_mode on")
        # The interrupt button: Python code and a collective only rank 0 entered.
        self.execute("kept = rank * 5")
        out = self.execute("print('looping', flush=True)\nwhile True: pass",
                           until="[rank 1] looping", then=self.km.interrupt_kernel)
        self.assertIn("[rank 0] interrupted\n[rank 1] interrupted", out)
        out = self.execute("%%rank [0]\nprint('entering', flush=True)\n"
                           "dist.all_reduce(torch.ones(1))",
                           until="[rank 0] entering", then=self.km.interrupt_kernel)
        self.assertIn("interrupted; it was blocked in native code", out)
        self.assertIn("[rank 0] 0\n[rank 1] 5", self.execute("kept"))
        out = self.execute("y = torch.ones(1)\ndist.all_reduce(y)\ny")
        self.assertIn("[rank 0] tensor([2.])\n[rank 1] tensor([2.])", out)
        # A non-blocking cell; a cell queued behind it, cancelled by the
        # interrupt button; the non-blocking cell interrupted while waited on.
        out = self.execute("%%rank [0] --noblock\nimport time\nprint('nb start', flush=True)\n"
                           "time.sleep(120)")
        self.assertRegex(out, r"^c1: running on rank\(s\) 0;")
        out = self.execute("print('queued ran')", until="(waiting for c1",
                           then=self.km.interrupt_kernel, timeout=60)
        self.assertIn("[rank 0] cancelled: it was waiting behind c1, which still runs there", out)
        self.assertIn("[rank 1] queued ran", out)
        out = self.execute("%dist_result c1 --wait", until="[rank 0] nb start",
                           then=self.km.interrupt_kernel, timeout=60)
        self.assertIn("[rank 0] interrupted", out)
        self.assertEqual(rank_ordered(self.execute("print('after', rank)")),
                         "[rank 0] after 0\n[rank 1] after 1\n")


class TwoNodes(Kernel):
    """%dist_init of a session across two loopback hosts: the kernel's node
    0 and a node 1 started by hand with --no-console."""

    @classmethod
    def setUpClass(cls):
        with socket.socket() as s:
            s.bind(("127.0.0.2", 0))
            port = s.getsockname()[1]
        cls.flags = ["--nnodes=2", "--master-addr=127.0.0.2", f"--master-port={port}"]
        cls.node1 = subprocess.Popen(
            [ARGS.dtrun, "--interactive", "--no-console", "--nproc-per-node=2",
             f"--python={ARGS.python}", "--node-rank=1", "--local-addr=127.0.0.3"] + cls.flags,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        super().setUpClass()

    @classmethod
    def tearDownClass(cls):
        super().tearDownClass()
        try:
            cls.node1.wait(timeout=60)
        finally:
            if cls.node1.poll() is None:
                cls.node1.kill()
                cls.node1.wait()

    def test_a_session_across_two_nodes(self):
        self.execute("%load_ext dtrun")
        out = self.execute(f"{INIT} --node-rank 0 --local-addr 127.0.0.2 " +
                           " ".join(f.replace("=", " ") for f in self.flags))
        self.assertIn("4 rank(s) ready", out)
        out = rank_ordered(self.execute("y = torch.ones(1) * rank\ndist.all_reduce(y)\n"
                                        "print(dist.get_world_size(), y.item())"))
        self.assertIn("[rank 0] 4 6.0\n[rank 1] 4 6.0\n[rank 2] 4 6.0\n[rank 3] 4 6.0", out)
        status = self.execute("%dist_status")
        self.assertRegex(status, r"rank 3: host \S+ \(127\.0\.0\.3\), pid \d+, alive")
        self.assertRegex(status, r"rank 0: host \S+ \(127\.0\.0\.2\), pid \d+, alive")
        # A rank that dies on node 1: named with its host, how, and its last
        # stderr lines; every rank starts afresh and the session goes on.
        out = self.execute("%%rank 2\nimport os, signal\nos.write(2, b'last words of 2\\n')\n"
                           "os.kill(os.getpid(), signal.SIGKILL)")
        self.assertIn(f"[rank 2] worker died on {socket.gethostname()} (127.0.0.3) (SIGKILL); "
                      "dtrun started a new round on every node: every rank has fresh state\n"
                      "[rank 2] its last stderr lines (", out)
        self.assertIn("[rank 2]   last words of 2\n", out)
        out = rank_ordered(self.execute("print(dist.get_world_size(), 'y' in dir())"))
        self.assertIn("[rank 0] 4 False\n[rank 1] 4 False\n[rank 2] 4 False\n[rank 3] 4 False", out)
        self.execute("%dist_shutdown")
        self.assertEqual(self.node1.wait(timeout=60), 0, self.node1.stderr.read())


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]] + REST, verbosity=2)
