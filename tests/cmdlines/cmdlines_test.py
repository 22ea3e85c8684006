"""Real torchrun command lines (corpus.ini) run unchanged through dtrun.

Each line runs with a stand-in worker (stand_in.py) under every script and
module name it names. A line passes when dtrun exits 0, every rank of the
job reports a consistent torchrun environment with a reachable store, and
every worker's argv is the line's `argv`. That expectation is also checked
against torchrun's own parser where one is given (--torchrun-python: a
Python whose torch.distributed.run accepts the line), so the corpus cannot
drift from what torchrun does.

Usage: cmdlines_test.py --dtrun PATH [--torchrun-python PYTHON] [--only NAME]
"""
import argparse
import configparser
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus.ini")
STAND_IN = os.path.join(HERE, "stand_in.py")

# torchrun's parser on a list of command lines: one JSON answer per line,
# the script and its arguments, or why it refused the line.
PARSER_PROBE = r"""
import contextlib, io, json, sys
from torch.distributed.run import get_args_parser
out = []
for args in json.load(sys.stdin):
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            a = get_args_parser().parse_args(args)
        out.append({"script": a.training_script, "args": a.training_script_args,
                    "module": bool(a.module)})
    except SystemExit:
        out.append({"refused": err.getvalue().strip().splitlines()[-1:]})
print(json.dumps(out))
"""


def load_corpus():
    parser = configparser.RawConfigParser()
    with open(CORPUS) as f:
        parser.read_file(f)
    return {name: dict(parser[name]) for name in parser.sections()}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def plant_stand_ins(words, root):
    """A stand-in for every .py file and every -m module the line names."""
    for i, w in enumerate(words):
        target = None
        if w.endswith(".py") and not w.startswith("-"):
            target = w
        elif w in ("-m", "--module") and i + 1 < len(words):
            target = words[i + 1].replace(".", "/") + ".py"
        if not target or target.startswith("/"):
            continue
        path = os.path.normpath(os.path.join(root, target))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        shutil.copy(STAND_IN, path)


class Corpus(unittest.TestCase):
    dtrun = None
    entries = {}
    torchrun_view = {}  # name -> torchrun's parse of the line

    def run_entry(self, name, entry):
        port = str(free_port())
        words = shlex.split(entry["line"].replace("{port}", port))
        node1 = shlex.split(entry.get("node1", "").replace("{port}", port))
        root = tempfile.mkdtemp(prefix=f"cmdline-{name}-")
        try:
            cwd = os.path.join(root, entry.get("cwd", "."))
            os.makedirs(cwd, exist_ok=True)
            plant_stand_ins(words, cwd)
            record = os.path.join(root, "record")
            os.makedirs(record)
            env = dict(os.environ, CMDLINE_RECORD=record, PYTHONPATH=cwd,
                       PYTHON_EXEC="/usr/bin/python3")
            for kv in shlex.split(entry.get("env", "")):
                k, v = kv.split("=", 1)
                env[k] = v
            procs = [subprocess.Popen([self.dtrun] + w, cwd=cwd, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True)
                     for w in ([words, node1] if node1 else [words])]
            outputs = []
            for p in procs:
                try:
                    out, err = p.communicate(timeout=120)
                except subprocess.TimeoutExpired:
                    for q in procs:
                        q.kill()
                        q.communicate()
                    self.fail(f"{name}: dtrun did not finish in 120 s")
                outputs.append((p.returncode, out, err))
            for rc, out, err in outputs:
                self.assertEqual(rc, 0, f"{name}: dtrun {' '.join(words)}\n{out}\n{err}")
            records = {}
            for f in os.listdir(record):
                if f.endswith(".json"):
                    with open(os.path.join(record, f)) as fh:
                        records[int(f[:-5])] = json.load(fh)
            return records
        finally:
            shutil.rmtree(root, ignore_errors=True)

    def check_entry(self, name, entry):
        records = self.run_entry(name, entry)
        ranks = int(entry.get("ranks", "2"))
        self.assertEqual(sorted(records), list(range(ranks)), f"{name}: ranks that ran")
        expected = shlex.split(entry["argv"])
        first = records[0]["env"]
        for rank, rec in records.items():
            env = rec["env"]
            self.assertEqual(rec["argv"], expected, f"{name}: rank {rank}'s argv")
            self.assertTrue(rec["store"], f"{name}: rank {rank} cannot reach its store")
            self.assertEqual(env["RANK"], str(rank))
            self.assertEqual(env["WORLD_SIZE"], str(ranks))
            lws = int(env["LOCAL_WORLD_SIZE"])
            self.assertEqual(int(env["LOCAL_RANK"]), rank % lws, name)
            self.assertEqual(int(env["GROUP_RANK"]), rank // lws, name)
            self.assertEqual(env["ROLE_NAME"], entry.get("role", "default"), name)
            self.assertEqual(env["ROLE_RANK"], str(rank), name)
            self.assertEqual(env["TORCHELASTIC_RESTART_COUNT"], "0", name)
            self.assertEqual(env["TORCHELASTIC_USE_AGENT_STORE"], "True", name)
            for key in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
                        "GROUP_WORLD_SIZE"):
                self.assertEqual(env[key], first[key], f"{name}: {key} differs by rank")
            if "run_id" in entry:
                self.assertEqual(env["TORCHELASTIC_RUN_ID"], entry["run_id"], name)
        view = self.torchrun_view.get(name)
        if view and "args" in view:
            self.assertEqual(view["args"], expected,
                             f"{name}: torchrun's own parser gives another argv")


def add_tests(names):
    for name in names:
        def test(self, name=name):
            self.check_entry(name, self.entries[name])
        setattr(Corpus, "test_" + name.replace("-", "_"), test)


def torchrun_parse(python, entries):
    """torchrun's parse of each line, where `python` has torch."""
    lines = [shlex.split(e["line"].replace("{port}", "29500")) for e in entries.values()]
    p = subprocess.run([python, "-c", PARSER_PROBE], input=json.dumps(lines),
                       capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise RuntimeError(f"torchrun's parser failed to run: {p.stderr}")
    return dict(zip(entries, json.loads(p.stdout)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtrun", required=True)
    ap.add_argument("--torchrun-python", default="")
    ap.add_argument("--only", default="")
    args, rest = ap.parse_known_args()
    Corpus.dtrun = os.path.abspath(args.dtrun)
    Corpus.entries = load_corpus()
    if args.only:
        Corpus.entries = {args.only: Corpus.entries[args.only]}
    if len(Corpus.entries) < 40 and not args.only:
        sys.exit(f"corpus.ini holds {len(Corpus.entries)} lines; at least 40 expected")
    if args.torchrun_python:
        Corpus.torchrun_view = torchrun_parse(args.torchrun_python, Corpus.entries)
        agreed = sum("args" in v for v in Corpus.torchrun_view.values())
        print(f"torchrun's parser ({args.torchrun_python}) accepts {agreed} of "
              f"{len(Corpus.entries)} lines; their argv is checked against it")
    add_tests(Corpus.entries)
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=1)


if __name__ == "__main__":
    main()
