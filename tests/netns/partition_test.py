"""Partitions, in network namespaces (tests/netns/up.sh): two dtrun nodes of
one train_cfg rank each, checkpoints in memory and on a shared folder. One
node's switch port goes down mid-training. The other declares it dead and
goes on alone; the cut node stops its workers within the bound
apps/dtrun/README.md states (fenced) and waits; when the port comes back it
rejoins as a new node, and the job ends bitwise where an undisturbed run
with the same changes of world size (stopped and resumed at the same steps)
does. On c10d (the rendezvous store hosted by node 0) and on etcd (a member
in a third namespace), the cut node hosting the workers' store or not.
Exit 77 (skip) without root, ip or etcd."""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from dtrun_proc import wait_for  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--dtrun", required=True)
p.add_argument("--train-cfg", required=True)
p.add_argument("--etcd", default=shutil.which("etcd") or "")
ARGS, REST = p.parse_known_args()
HERE = os.path.dirname(os.path.abspath(__file__))
DIGITS = os.path.join(HERE, "..", "..", "examples", "configs", "digits_ddp.toml")
# Dead after 2 s of silence: a loaded 2-core machine never stays silent
# that long, and the job is long enough to see the cut, the fence and the
# rejoin.
CONF = "keep_alive_interval=0.5,keep_alive_max_attempt=4,last_call_timeout=1,join_timeout=60"
SETS = ["train.steps=1500", "checkpoint.every=20", 'checkpoint.mode="memory"',
        "checkpoint.persist_every=1", "train.eval_every=1500", "train.log_every=500",
        "fault.slow_rank=0", "fault.slow_factor=12"]
DONE = re.compile(r"params_sha256=([0-9a-f]{64})")
RESUMED = re.compile(r"resumed from \S+ at step (\d+)")
# The bound apps/dtrun/README.md states for a fence: the silent limit and
# two store operations' deadlines (c10d 1 s each here, etcd 2 s) after the
# last answered check (half a second before the cut at most), then the
# workers' stop; 3 s more for a loaded machine.
FENCE_BOUND_S = 2 + 2 * 2 + 0.5 + 3


class Node:
    """One dtrun in namespace `ns`, its output in files."""

    def __init__(self, folder, name, ns, args):
        self.out_path = os.path.join(folder, name + ".out")
        self.err_path = os.path.join(folder, name + ".err")
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            # ip netns exec execs the command: the pid is dtrun's.
            # gloo binds where the host name resolves (loopback in a
            # namespace) unless told the interface.
            self.proc = subprocess.Popen(["ip", "netns", "exec", ns, ARGS.dtrun] + args,
                                         stdout=out, stderr=err,
                                         env=dict(os.environ, GLOO_SOCKET_IFNAME="eth0"))

    def read(self, path):
        with open(path) as f:
            return f.read()

    def out(self):
        return self.read(self.out_path)

    def err(self):
        return self.read(self.err_path)

    def wait(self, timeout):
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError("node timed out; stderr:\n" + self.err()[-3000:])

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class Partition(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tag = "dtp%d" % (os.getpid() % 10000)
        cls.net = "10.202.%d" % (os.getpid() % 250)
        subprocess.run(["bash", os.path.join(HERE, "up.sh"), cls.tag, "3", cls.net],
                       check=True)

    @classmethod
    def tearDownClass(cls):
        subprocess.run(["bash", os.path.join(HERE, "down.sh"), cls.tag])

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="dtrun-partition-")
        self.procs = []

    def tearDown(self):
        for n in self.procs:
            n.kill()
        for i in range(3):
            self.port(i, "up")
        shutil.rmtree(self.dir, ignore_errors=True)

    def addr(self, i):
        return "%s.%d" % (self.net, i + 1)

    def port(self, i, state):
        subprocess.run(["ip", "-n", self.tag + "-sw", "link", "set", "p%d" % i, state],
                       check=True)

    def start_etcd(self):
        if not ARGS.etcd:
            self.skipTest("etcd is not installed")
        a = self.addr(2)
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.tag + "-h2", ARGS.etcd, "--name", "m0",
             "--data-dir", os.path.join(self.dir, "etcd"),
             "--listen-client-urls", "http://%s:2379" % a,
             "--advertise-client-urls", "http://%s:2379" % a,
             "--listen-peer-urls", "http://%s:2380" % a,
             "--initial-advertise-peer-urls", "http://%s:2380" % a,
             "--initial-cluster", "m0=http://%s:2380" % a, "--log-level", "error"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.etcd = proc
        self.addCleanup(lambda: (proc.kill(), proc.wait()))
        ok = wait_for(lambda: subprocess.run(
            ["ip", "netns", "exec", self.tag + "-h0", "etcdctl",
             "--endpoints=http://%s:2379" % a, "endpoint", "health"],
            capture_output=True).returncode == 0, 30, 0.3)
        self.assertTrue(ok, "etcd did not come up")
        return "--rdzv-backend=etcd-v2", "%s:2379" % a

    def job(self, backend, store_host_cut):
        """Nodes 0 and 1; node 1 is cut. With store_host_cut, node 1 is the
        round's group rank 0 (it hosts the workers' store)."""
        if backend == "etcd":
            flag, endpoint = self.start_etcd()
        else:
            flag, endpoint = "--rdzv-backend=c10d", self.addr(0) + ":29400"
        ckpt = os.path.join(self.dir, "ckpt")
        nodes = []
        for i in range(2):
            rank = (1 - i) if store_host_cut else i
            args = ["--nnodes=1:2", "--nproc-per-node=1", "--max-restarts=3", flag,
                    "--rdzv-endpoint=" + endpoint, "--rdzv-id=part", "--rdzv-conf=" + CONF,
                    "--node-rank=%d" % rank, "--local-addr=" + self.addr(i),
                    ARGS.train_cfg, DIGITS, "--set", 'checkpoint.dir="%s"' % ckpt]
            for s in SETS:
                args += ["--set", s]
            nodes.append(Node(self.dir, "node%d" % i, "%s-h%d" % (self.tag, i), args))
            self.procs.append(nodes[-1])
            time.sleep(0.3)
        return nodes, ckpt

    def partition(self, backend, store_host_cut):
        (a, b), ckpt = self.job(backend, store_host_cut)
        both = lambda: all(re.search(r"round 0: group rank \d of 2", n.err()) for n in (a, b))
        self.assertTrue(wait_for(both, 60), a.err()[-2000:] + b.err()[-2000:])
        want = "round 0: group rank %d of 2" % (0 if store_host_cut else 1)
        self.assertIn(want, b.err())
        self.assertTrue(wait_for(lambda: glob.glob(os.path.join(ckpt, "ckpt_*.dtck")), 60),
                        a.err()[-2000:])
        cut_at = time.monotonic()
        self.port(1, "down")
        fenced = wait_for(lambda: "fenced: workers stopped" in b.err(), FENCE_BOUND_S + 5)
        fence_s = time.monotonic() - cut_at
        self.assertTrue(fenced, b.err()[-3000:])
        self.assertIn("cut off from the rendezvous store", b.err())
        self.assertLess(fence_s, FENCE_BOUND_S, b.err()[-3000:])
        # The other went on alone, from a checkpoint.
        self.assertTrue(wait_for(lambda: re.search(r"round \d+: group rank 0 of 1", a.err()), 30),
                        a.err()[-3000:])
        self.assertTrue(wait_for(lambda: RESUMED.search(a.out()), 30), a.out()[-2000:])
        # It trains alone to its next checkpoint before the cut node is back.
        first = int(RESUMED.search(a.out()).group(1))
        alone = re.compile(r"checkpoint step %d:" % (first + 20))
        self.assertTrue(wait_for(lambda: alone.search(a.out()), 30), a.out()[-2000:])
        self.port(1, "up")
        # The cut node comes back as a new node: a round of two again.
        back = lambda: len(re.findall(r"round \d+: group rank \d of 2", b.err())) >= 2
        self.assertTrue(wait_for(back, 60), b.err()[-3000:])
        for n in (a, b):
            self.assertEqual(n.wait(180), 0, n.err()[-3000:])
        out = a.out() + b.out()
        sha = DONE.search(out).group(1)
        steps = sorted(int(s) for s in RESUMED.findall(out))
        self.assertEqual(len(steps), 2, out)
        print("%s, store host cut=%s: fenced in %.2f s; resumed at steps %s"
              % (backend, store_host_cut, fence_s, steps), file=sys.stderr)
        self.assertLess(steps[0], steps[1])
        self.assertEqual(sha, self.reference(steps))

    def reference(self, steps):
        """Two ranks to the first resume step, one to the second, then two,
        undisturbed, on one host."""
        ckpt = os.path.join(self.dir, "ref")
        sha = None
        for nproc, stop in ((2, steps[0]), (1, steps[1]), (2, None)):
            cmd = [ARGS.dtrun, "--nproc-per-node=%d" % nproc, ARGS.train_cfg, DIGITS,
                   "--set", 'checkpoint.dir="%s"' % ckpt]
            for s in SETS + (["train.stop_after_step=%d" % stop] if stop else []):
                cmd += ["--set", s.replace("fault.slow_factor=12", "fault.slow_factor=1")]
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            self.assertEqual(p.returncode, 0, p.stderr[-3000:])
            m = DONE.search(p.stdout)
            sha = m.group(1) if m else None
        return sha

    def test_c10d_node_cut_off(self):
        self.partition("c10d", store_host_cut=False)

    def test_c10d_workers_store_host_cut_off(self):
        self.partition("c10d", store_host_cut=True)

    def test_etcd_node_cut_off(self):
        self.partition("etcd", store_host_cut=False)

    def test_etcd_workers_store_host_cut_off(self):
        self.partition("etcd", store_host_cut=True)


if __name__ == "__main__":
    if os.geteuid() != 0 or not shutil.which("ip"):
        print("SKIP: network namespaces need root and iproute2")
        sys.exit(77)
    unittest.main(argv=[sys.argv[0]] + REST, verbosity=2)
