"""An etcd endpoint whose name the name server never answers: dtrun gives
up within its own deadlines (join_timeout), not after getaddrinfo's
timeout x attempts. The name server is a UDP socket of this test on
127.0.0.9:53 that reads and never replies; dtrun runs in a mount namespace
of its own whose /etc/resolv.conf names it (timeout 10 s, 3 attempts: an
unbounded lookup would take 30 s and more). Needs root."""
import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
import unittest

p = argparse.ArgumentParser()
p.add_argument("--dtrun", required=True)
ARGS, REST = p.parse_known_args()


class ResolveDeadline(unittest.TestCase):
    def test_a_silent_name_server_does_not_outlast_the_join_timeout(self):
        silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.addCleanup(silent.close)
        silent.bind(("127.0.0.9", 53))
        with tempfile.NamedTemporaryFile("w", suffix=".conf", delete=False) as f:
            f.write("nameserver 127.0.0.9\noptions timeout:10 attempts:3\n")
            resolv = f.name
        self.addCleanup(os.remove, resolv)
        cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
               'mount --bind "$0" /etc/resolv.conf && exec "$@"', resolv,
               ARGS.dtrun, "--nnodes=1", "--nproc-per-node=1", "--rdzv-backend=etcd-v2",
               "--rdzv-endpoint=etcd.unanswered.test:2379", "--rdzv-id=resolve",
               "--rdzv-conf=join_timeout=4,read_timeout=2", "--no-python", "/bin/true"]
        start = time.monotonic()
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        took = time.monotonic() - start
        self.assertNotEqual(p.returncode, 0, p.stderr)
        self.assertIn("etcd.unanswered.test", p.stderr)
        self.assertLess(took, 15, p.stderr)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]] + REST, verbosity=2)
