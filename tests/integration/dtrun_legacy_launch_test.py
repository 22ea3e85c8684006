"""`python -m dtrun.launch` (the legacy torch.distributed.launch's rules)
and `python -m dtrun` (torchrun's), through the real dtrun: each worker's
argv is what torch's own launcher (the host's 1.13: its parse_args and
config_from_args) would give it, `--local_rank=N` before the script's own
arguments unless --use_env; a module entrypoint too."""
import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import unittest

p = argparse.ArgumentParser()
p.add_argument("--dtrun", required=True)
ARGS, REST = p.parse_known_args()
HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.join(HERE, "..", "..", "apps", "dtrun", "python")
PY = "/usr/bin/python3"

RECORD = """import json, os, sys
with open(os.path.join(os.environ["RECORD_DIR"], "argv_%s.json" % os.environ["RANK"]), "w") as f:
    json.dump(sys.argv[1:], f)
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torch_worker_args(line, local_rank):
    """What torch 1.13's own legacy launcher gives worker `local_rank`
    after its entrypoint."""
    from torch.distributed.launch import parse_args
    from torch.distributed.run import config_from_args
    args = parse_args(line)
    _, _, cmd_args = config_from_args(args)
    tail = cmd_args[cmd_args.index(args.training_script) + 1:]
    return [a.replace("${local_rank}", str(local_rank)) for a in tail]

class LegacyLaunch(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name
        self.script = os.path.join(self.dir, "train.py")
        with open(self.script, "w") as f:
            f.write(RECORD)
        os.makedirs(os.path.join(self.dir, "pkg"))
        open(os.path.join(self.dir, "pkg", "__init__.py"), "w").close()
        with open(os.path.join(self.dir, "pkg", "train.py"), "w") as f:
            f.write(RECORD)

    def tearDown(self):
        self.tmp.cleanup()

    def launch(self, module, line):
        env = dict(os.environ, PYTHONPATH=os.path.abspath(PACKAGE) + ":" + self.dir,
                   DTRUN=os.path.abspath(ARGS.dtrun), RECORD_DIR=self.dir)
        env.pop("PYTHON_EXEC", None)
        p = subprocess.run([PY, "-m", module] + line, env=env, capture_output=True,
                           text=True, timeout=120, cwd=self.dir)
        self.assertEqual(p.returncode, 0, p.stderr)
        got = {}
        for rank in range(2):
            with open(os.path.join(self.dir, f"argv_{rank}.json")) as f:
                got[rank] = json.load(f)
        return got

    def check(self, line, module="dtrun.launch"):
        got = self.launch(module, line)
        for rank in range(2):
            self.assertEqual(got[rank], torch_worker_args(line, rank), line)

    def test_local_rank_is_passed_before_the_scripts_arguments(self):
        self.check(["--nproc_per_node=2", self.script, "--lr", "0.1"])

    def test_flags_with_separate_values(self):
        self.check(["--nproc_per_node", "2", "--master_port", str(free_port()),
                    self.script, "--cfg", "a.yaml"])

    def test_use_env_passes_no_argument(self):
        self.check(["--use_env", "--nproc_per_node=2", self.script, "--x", "1"])

    def test_a_module_entrypoint(self):
        self.check(["--nproc_per_node=2", "-m", "pkg.train", "--y"])

    def test_python_m_dtrun_is_torchrun(self):
        got = self.launch("dtrun", ["--nproc-per-node=2", self.script, "--z", "3"])
        self.assertEqual(got[0], ["--z", "3"])  # torchrun: LOCAL_RANK only


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]] + REST)
