"""Both halves of the interactive protocol agree: the keys and the session
line dtrun (C++, apps/dtrun/interactive_protocol.h, dumped by
interactive_protocol_dump) writes are the ones the console, the notebook and
the workers (apps/dtrun/python/dtrun/protocol.py) read."""
import argparse
import json
import os
import subprocess
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "apps", "dtrun", "python"))
from dtrun import protocol  # noqa: E402

DUMP = None
CASES = [  # run id, round, world, store address, host, port, folder
    ("job7", 3, 16, "10.0.0.2:40123", "node0", 29500, "/tmp/dtrun-s1"),
    ("slurm-81234", 0, 1, "[::1]:5", "::1", 1, "/scratch/s-1"),
    ("a/b", 12, 4096, "h:65535", "127.0.0.2", 65535, "/x"),
]


def dump(case):
    out = subprocess.run([DUMP] + [str(v) for v in case], capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout)


class ProtocolAgreementTest(unittest.TestCase):
    def test_constants(self):
        c = dump(CASES[0])
        self.assertEqual(c["prefix"], protocol.PREFIX)
        self.assertEqual(c["crash"], protocol.CRASH)
        self.assertEqual(c["crash_count"], protocol.CRASH_COUNT)
        self.assertEqual(c["local_crash_prefix"], protocol.crash_prefix())
        self.assertEqual(c["session_line_tag"], protocol.SESSION_LINE_TAG)

    def test_keys_of_a_run(self):
        for case in CASES:
            run_id, rnd, world, addr = case[:4]
            c = dump(case)
            self.assertEqual(c["run_prefix"], protocol.run_prefix(run_id))
            self.assertEqual(c["current_round_key"], protocol.current_round_key(run_id))
            self.assertEqual(c["nodes_crash_prefix"], protocol.crash_prefix(run_id))
            self.assertEqual(protocol.run_id_of(c["current_round_key"]), run_id)
            self.assertEqual(protocol.parse_current_round(c["current_round_value"]),
                             (rnd, world, addr))

    def test_session_lines(self):
        for case in CASES:
            run_id, _, world, _, host, port, folder = case
            c = dump(case)
            want = {"host": host, "port": port, "world": world, "dir": folder, "key": None}
            self.assertEqual(protocol.parse_session_line(c["session_line"]), want)
            want["key"] = protocol.current_round_key(run_id)
            self.assertEqual(protocol.parse_session_line(c["session_line_nodes"]), want)

    def test_what_is_not_the_protocol_is_refused(self):
        for line in ["", "listening on h:1", "dtrun-interactive: host h port 1",
                     "dtrun-interactive: host h port x world 1 dir d"]:
            with self.assertRaises(ValueError, msg=line):
                protocol.parse_session_line(line)
        for key in ["dtrun/i/current", "rdzv/job7/current", "dtrun/i/job7/crash"]:
            with self.assertRaises(ValueError, msg=key):
                protocol.run_id_of(key)

    def test_worker_keys_stay_under_the_prefix(self):
        keys = [protocol.cell_key(3), protocol.result_key(3, 1), protocol.status_key(2),
                protocol.interrupt_key(0), protocol.restart_key(1),
                protocol.status_answers_key(4), protocol.has_status_key(0),
                protocol.stream_key(1, 2, 3), protocol.stream_count_key(1, 2),
                protocol.data_key(1, 0), protocol.data_key(1, 0, rank=5),
                protocol.pg_prefix(2), protocol.READY]
        for k in keys:
            self.assertTrue(k.startswith(protocol.PREFIX), k)
        self.assertEqual(len(set(keys)), len(keys))


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--dump", required=True)
    a, rest = p.parse_known_args()
    DUMP = a.dump
    unittest.main(argv=[sys.argv[0]] + rest)
