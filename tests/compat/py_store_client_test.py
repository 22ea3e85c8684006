"""Debian's Python torch (1.13) TCPStore client against dtstore."""
import sys
import time
import unittest
from datetime import timedelta

import torch.distributed as dist

from dtstore_proc import DtStore, parse_args

ARGS, REST = parse_args()


class PythonClientAgainstDtStore(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = DtStore(ARGS.dtstore)

    @classmethod
    def tearDownClass(cls):
        assert cls.server.stop() == 0, "dtstore did not exit 0 on SIGTERM"

    def client(self, timeout=5.0):
        return dist.TCPStore(self.server.host, self.server.port, is_master=False,
                             timeout=timedelta(seconds=timeout))

    def test_set_get_add(self):
        s = self.client()
        s.set("py/k", "value")
        self.assertEqual(s.get("py/k"), b"value")
        self.assertEqual(s.add("py/n", 5), 5)
        self.assertEqual(s.add("py/n", -8), -3)
        self.assertEqual(s.get("py/n"), b"-3")

    def test_compare_set_all_cases(self):
        s = self.client()
        self.assertEqual(s.compare_set("py/c", "", "x"), b"x")
        self.assertEqual(s.compare_set("py/c", "x", "y"), b"y")
        self.assertEqual(s.compare_set("py/c", "nope", "z"), b"y")
        self.assertEqual(s.compare_set("py/absent", "e", "z"), b"e")

    def test_check(self):
        s = self.client()
        if not hasattr(s, "check"):
            self.skipTest("torch 1.13's Python TCPStore has no check(); "
                          "the C++ client covers CHECK in compat_tests")
        s.set("py/chk", "1")
        self.assertTrue(s.check(["py/chk"]))
        self.assertFalse(s.check(["py/chk", "py/missing"]))

    def test_wait_with_timeout(self):
        s = self.client()
        start = time.monotonic()
        with self.assertRaises(RuntimeError):
            s.wait(["py/never"], timedelta(milliseconds=300))
        self.assertGreaterEqual(time.monotonic() - start, 0.25)
        other = self.client()
        other.set("py/ready", "1")
        s2 = self.client()
        s2.wait(["py/ready"], timedelta(seconds=2))

    def test_num_keys_and_delete(self):
        s = self.client()
        before = s.num_keys()
        s.set("py/del", "1")
        self.assertEqual(s.num_keys(), before + 1)
        self.assertTrue(s.delete_key("py/del"))
        self.assertFalse(s.delete_key("py/del"))
        self.assertEqual(s.num_keys(), before)

    def test_world_size_client_counts_in_init(self):
        # Each client with a world size ADDs the unprefixed key "init/" as it
        # starts (and needs the reply to get past its constructor); the
        # Python API cannot read that key back, but num_keys sees it appear.
        before = self.client().num_keys()
        a = dist.TCPStore(self.server.host, self.server.port, 2, False,
                          timedelta(seconds=5))
        b = dist.TCPStore(self.server.host, self.server.port, 2, False,
                          timedelta(seconds=5))
        self.assertEqual(self.client().num_keys(), before + 1)
        del a, b


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]] + REST, verbosity=2)
