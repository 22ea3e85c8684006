"""--rdzv-backend=etcd-v2 against a real 3-member etcd cluster on 127.0.0.2-4
(tests/integration/etcd_cluster.py): torch gloo jobs, nodes killed with
SIGKILL mid-training (train_cfg ends bitwise where an undisturbed run at the
final world size does), members killed and stopped (one: nothing happens;
two: quorum lost, said, recovered), TLS with client certificates, and the
errors for a bad endpoint or setting."""
import argparse
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dtrun_proc import wait_for  # noqa: E402
from etcd_cluster import EtcdCluster, free_port  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--dtrun", required=True)
p.add_argument("--fake-worker", required=True)
p.add_argument("--python", default="/usr/bin/python3")
p.add_argument("--train-cfg", default="")
ARGS, REST = p.parse_known_args()
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
ALLREDUCE = os.path.join(ROOT, "examples", "allreduce_check.py")
DIGITS = os.path.join(ROOT, "examples", "configs", "digits_ddp.toml")
# A node is dead after 2 s of silence: well above an etcd leader election
# (0.5 s here), so a member's death never looks like a node's.
FAST = "keep_alive_interval=0.5,keep_alive_max_attempt=4,last_call_timeout=1,join_timeout=60"
DONE = re.compile(r"params_sha256=([0-9a-f]{64})")
RESUMED = re.compile(r"resumed from \S+ at step (\d+)")


class Node:
    """One dtrun node, its output in files (read while it runs)."""

    def __init__(self, folder, name, args, env=None):
        self.out_path = os.path.join(folder, f"{name}.out")
        self.err_path = os.path.join(folder, f"{name}.err")
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            self.proc = subprocess.Popen([ARGS.dtrun] + args, stdout=out, stderr=err,
                                         env=dict(os.environ, **(env or {})))

    def err(self):
        with open(self.err_path) as f:
            return f.read()

    def out(self):
        with open(self.out_path) as f:
            return f.read()

    def wait(self, timeout=120):
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"node timed out; stderr:\n{self.err()[-3000:]}")

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()



class EtcdCase(unittest.TestCase):
    tls = False

    @classmethod
    def setUpClass(cls):
        cls.etcd = EtcdCluster(tls=cls.tls).start()

    @classmethod
    def tearDownClass(cls):
        cls.etcd.close()

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="dtrun-etcd-test-")
        self.nodes = []
        self.run_id = f"t{os.getpid()}_{self.id().rsplit('.', 1)[-1][:40]}"

    def tearDown(self):
        for n in self.nodes:
            n.kill()
        # Members a test stopped or killed come back for the next test.
        for i in range(len(self.etcd.hosts)):
            if not self.etcd.alive(i):
                self.etcd.start_member(i)
            else:
                self.etcd.resume(i)
        self.assertTrue(self.etcd.wait_healthy(30), "etcd did not recover")
        shutil.rmtree(self.dir, ignore_errors=True)

    def etcd_flags(self, run_id=None, conf=FAST, endpoints=None):
        return ["--rdzv-backend=etcd-v2",
                f"--rdzv-endpoint={endpoints or self.etcd.endpoints()}",
                f"--rdzv-id={run_id or self.run_id}", f"--rdzv-conf={conf}"]

    def node(self, i, args, **kw):
        n = Node(self.dir, f"node{len(self.nodes)}",
                 [f"--local-addr=127.0.0.{10 + i}"] + args, **kw)
        self.nodes.append(n)
        return n


class TorchJobs(EtcdCase):
    def test_two_nodes_gloo_all_reduce(self):
        flags = self.etcd_flags() + ["--nnodes=2", "--nproc-per-node=2",
                                     f"--python={ARGS.python}", ALLREDUCE]
        a, b = self.node(0, flags), self.node(1, flags)
        self.assertEqual(a.wait(), 0, a.err())
        self.assertEqual(b.wait(), 0, b.err())
        out = a.out() + b.out()
        self.assertIn("all_reduce over 4 ranks: sum=10 expected=10 OK", out)


class MemberFaults(EtcdCase):
    def sleeping_job(self, nodes, sleep_ms, conf=FAST):
        pid_dir = os.path.join(self.dir, "pids")
        os.makedirs(pid_dir, exist_ok=True)
        flags = self.etcd_flags(conf=conf) + [f"--nnodes={nodes}", "--nproc-per-node=1",
                                     "--max-restarts=0", "--no-python", ARGS.fake_worker,
                                     "--pid-dir", pid_dir, "--sleep-ms", str(sleep_ms)]
        started = [self.node(i, flags) for i in range(nodes)]
        self.assertTrue(wait_for(lambda: len(os.listdir(pid_dir)) == nodes, 30),
                        started[0].err())
        return started, pid_dir

    def test_one_member_killed_changes_nothing(self):
        # A member some node talks to (each picks one at random); maybe the
        # leader.
        nodes, pid_dir = self.sleeping_job(2, 6000)
        leader = self.etcd.leader()
        self.etcd.kill(0)
        if leader not in (None, 0):
            time.sleep(1)
        for n in nodes:
            self.assertEqual(n.wait(), 0, n.err())
            self.assertNotIn("declared dead", n.err())
            self.assertNotIn("round 1", n.err())
        self.assertEqual(sorted(os.listdir(pid_dir)), ["pid_0_0", "pid_1_0"])

    def test_leader_killed_changes_nothing(self):
        nodes, pid_dir = self.sleeping_job(2, 6000)
        leader = self.etcd.leader()
        self.assertIsNotNone(leader)
        self.etcd.kill(leader)
        for n in nodes:
            self.assertEqual(n.wait(), 0, n.err())
            self.assertNotIn("declared dead", n.err())
        self.assertEqual(sorted(os.listdir(pid_dir)), ["pid_0_0", "pid_1_0"])

    def test_two_members_lost_is_said_and_the_job_recovers(self):
        nodes, pid_dir = self.sleeping_job(2, 12000)
        lost_at = time.monotonic()
        self.etcd.kill(1)
        self.etcd.kill(2)
        said = wait_for(lambda: all("etcd has lost quorum" in n.err() for n in nodes), 40)
        self.assertTrue(said, nodes[0].err())
        self.assertIn("no new round can start", nodes[0].err())
        self.assertIn("the workers keep running", nodes[0].err())
        # The workers ran on through it.
        self.assertTrue(all(n.proc.poll() is None for n in nodes))
        self.etcd.start_member(1)
        self.etcd.start_member(2)
        for n in nodes:
            self.assertEqual(n.wait(), 0, n.err())
            self.assertIn("etcd answers again", n.err())
            self.assertNotIn("declared dead", n.err())
        self.assertGreater(time.monotonic() - lost_at, 5)
        self.assertEqual(sorted(os.listdir(pid_dir)), ["pid_0_0", "pid_1_0"])

    def test_stopped_members_are_passed_over(self):
        # SIGSTOP: the member takes connections and never answers.
        # A request stuck on the stopped member waits its share of the
        # operation bound (a third) before the next member, and the two
        # live members may elect a leader first: a silent limit of 10 s
        # leaves room for that on a loaded machine (5 s restarted the round
        # once in a full suite's run).
        slow = FAST.replace("keep_alive_interval=0.5,keep_alive_max_attempt=4",
                            "keep_alive_interval=2,keep_alive_max_attempt=5")
        nodes, pid_dir = self.sleeping_job(2, 8000, conf=slow)
        self.etcd.pause(0)
        for n in nodes:
            self.assertEqual(n.wait(), 0, n.err())
        self.assertEqual(sorted(os.listdir(pid_dir)), ["pid_0_0", "pid_1_0"],
                         "\n".join(n.err()[-4000:] for n in nodes))


class StatusAndStacks(EtcdCase):
    """dtrun --status and --stacks of a job whose rendezvous is on etcd: by
    run id (the host's registry names the cluster) and by the cluster's
    address (another host's job: the run that published last)."""

    def query(self, *args):
        env = dict(os.environ, XDG_RUNTIME_DIR=self.dir)
        p = subprocess.run([ARGS.dtrun, *args], capture_output=True, text=True,
                           env=env, timeout=90)
        return p.returncode, p.stdout, p.stderr

    def nodes_json(self, target):
        rc, out, _ = self.query("--status", target, "--json")
        if rc != 0:
            return None
        import json
        nodes = json.loads(out)["nodes"]
        return nodes if len(nodes) == 2 else None

    def test_status_and_stacks_by_run_id_and_by_the_cluster(self):
        import shutil as sh
        flags = self.etcd_flags() + ["--nnodes=2", "--nproc-per-node=1",
                                     "--no-python", ARGS.fake_worker, "--hang"]
        env = {"XDG_RUNTIME_DIR": self.dir}
        a, b = self.node(0, flags, env=env), self.node(1, flags, env=env)
        self.assertTrue(wait_for(lambda: self.nodes_json(self.run_id), 60),
                        a.err()[-2000:] + b.err()[-2000:])
        rc, out, err = self.query("--status")
        self.assertEqual(rc, 0, err)
        self.assertIn(self.etcd.endpoints().split(",")[0], out)  # the store column
        rc, out, err = self.query("--status", self.run_id)
        self.assertEqual(rc, 0, err)
        self.assertIn("node 0 of 2", out)
        self.assertIn("node 1 of 2", out)
        cluster = "http://" + self.etcd.endpoints()
        self.assertTrue(wait_for(lambda: self.nodes_json(cluster), 30),
                        self.query("--status", cluster)[2])
        if sh.which("eu-stack") or sh.which("gdb"):
            rc, out, err = self.query("--stacks", self.run_id)
            self.assertEqual(rc, 0, err)
            self.assertIn("=== rank 0 on ", out)
            self.assertIn("=== rank 1 on ", out)
        self.assertIsNone(a.proc.poll())  # the queries do not stop the job
        self.assertIsNone(b.proc.poll())


class SilentNodeLoss(EtcdCase):
    def test_store_host_killed_is_declared_dead_and_the_rest_go_on(self):
        # Workers that never talk to each other: only the heartbeats in etcd
        # tell that a node is gone.
        pid_dir = os.path.join(self.dir, "pids")
        os.makedirs(pid_dir)
        flags = self.etcd_flags() + ["--nnodes=2:3", "--nproc-per-node=1", "--max-restarts=1",
                                     "--no-python", ARGS.fake_worker, "--pid-dir", pid_dir,
                                     "--sleep-ms", "4000"]
        nodes = [self.node(i, flags) for i in range(3)]
        self.assertTrue(wait_for(lambda: len(os.listdir(pid_dir)) == 3, 30), nodes[0].err())
        host = next(n for n in nodes if "round 0: group rank 0 of 3" in n.err())
        killed_at = time.monotonic()
        host.kill()
        rest = [n for n in nodes if n is not host]
        self.assertTrue(wait_for(lambda: "pid_0_1" in os.listdir(pid_dir), 20),
                        rest[0].err())
        detected = time.monotonic() - killed_at
        for n in rest:
            self.assertEqual(n.wait(), 0, n.err())
            self.assertRegex(n.err(), r"round 1: group rank \d of 2")
        self.assertIn("declared dead", "".join(n.err() for n in rest))
        # The silent limit (2 s) and a round, with room for a loaded 2-core
        # machine (6.1 s seen there beside a parallel suite); the default
        # limit (5 s x 3) would take 15 s or more.
        self.assertLess(detected, 2 + 8)
        self.assertNotIn("pid_2_1", os.listdir(pid_dir))


class LeaseEnds(EtcdCase):
    """At the default keep-alive (1 s x 3) each node keeps its key under a
    lease of 3 s and writes no heartbeats: a node killed or stopped is
    declared dead when etcd ends its lease, the others go on in a new round."""

    def lose_a_node(self, sig):
        pid_dir = os.path.join(self.dir, "pids")
        os.makedirs(pid_dir)
        flags = self.etcd_flags(conf="last_call_timeout=1,join_timeout=60") + [
            "--nnodes=2:3", "--nproc-per-node=1", "--max-restarts=1", "--no-python",
            ARGS.fake_worker, "--pid-dir", pid_dir, "--sleep-ms", "8000"]
        nodes = [self.node(i, flags) for i in range(3)]
        self.assertTrue(wait_for(lambda: len(os.listdir(pid_dir)) == 3, 30), nodes[0].err())
        victim = next(n for n in nodes if "round 0: group rank 1 of 3" in n.err())
        rest = [n for n in nodes if n is not victim]
        try:
            lost_at = time.monotonic()
            victim.proc.send_signal(sig)
            self.assertTrue(wait_for(lambda: any("declared dead" in n.err() for n in rest), 20),
                            rest[0].err())
            detected = time.monotonic() - lost_at
            err = "".join(n.err() for n in rest)
            self.assertIn("lease in the store ended", err)
            # The TTL, etcd's expiry sweep (0.5 s), a check and slack for 2 cores.
            self.assertLess(detected, 3 + 0.5 + 3)
            for n in rest:
                self.assertEqual(n.wait(), 0, n.err())
                self.assertRegex(n.err(), r"round 1: group rank \d of 2")
            self.assertNotIn("heartbeat", err)
        finally:
            if victim.proc.poll() is None:
                victim.proc.send_signal(signal.SIGCONT)
            victim.kill()

    def test_a_killed_nodes_lease_ends_and_it_is_declared_dead(self):
        self.lose_a_node(signal.SIGKILL)

    def test_a_stopped_nodes_lease_ends_and_it_is_declared_dead(self):
        self.lose_a_node(signal.SIGSTOP)


@unittest.skipUnless(ARGS.train_cfg, "needs --train-cfg (a build with libtorch)")
class NodeLoss(EtcdCase):
    """Three nodes of one rank each train digits; one is SIGKILLed after the
    first checkpoint. The other two go on in a new round from the newest
    checkpoint; the result equals a run that stopped at that step on three
    nodes and resumed on two, undisturbed."""

    SETS = ["train.steps=300", "checkpoint.every=50", "train.eval_every=300",
            "fault.slow_rank=0", "fault.slow_factor=12"]

    def train(self, nodes, ckpt, run_id, extra=(), nnodes=None):
        flags = self.etcd_flags(run_id) + [
            f"--nnodes={nnodes or nodes}", "--nproc-per-node=1", "--max-restarts=3",
            ARGS.train_cfg, DIGITS, "--set", f'checkpoint.dir="{ckpt}"']
        for s in self.SETS + list(extra):
            flags += ["--set", s]
        return [self.node(i, flags) for i in range(nodes)]

    def group_rank(self, node):
        m = re.search(r"round 0: group rank (\d+) of", node.err())
        return int(m.group(1)) if m else None

    def finish(self, nodes, done=True):
        sha = None
        for n in nodes:
            self.assertEqual(n.wait(180), 0, n.err()[-4000:])
            m = DONE.search(n.out())
            if m:
                sha = m.group(1)
        if done:
            self.assertIsNotNone(sha, [n.out() for n in nodes])
        return sha, "".join(n.out() for n in nodes)

    def kill_group_rank(self, victim):
        ckpt = os.path.join(self.dir, "ckpt")
        nodes = self.train(3, ckpt, self.run_id, nnodes="2:3")
        self.assertTrue(wait_for(lambda: all(self.group_rank(n) is not None for n in nodes), 60),
                        nodes[0].err())
        target = next(n for n in nodes if self.group_rank(n) == victim)
        first = os.path.join(ckpt, "ckpt_*.dtck")  # complete, not a .tmp
        self.assertTrue(wait_for(lambda: glob.glob(first), 60), nodes[0].err())
        target.kill()
        rest = [n for n in nodes if n is not target]
        sha, out = self.finish(rest)
        resumed = [int(k) for k in RESUMED.findall(out)]
        self.assertTrue(resumed, out)
        err = "".join(n.err() for n in rest)
        # Found dead by its lease or by its peers' failing collectives,
        # whichever comes first; the survivors time their way back.
        self.assertRegex(err, r"round \d+: group rank \d of 2")
        self.assertRegex(err, r"recovered in [\d.]+ s: detect [\d.]+, regroup")
        # The same path without the kill: three nodes up to that step, then two.
        step = resumed[-1]
        ref = os.path.join(self.dir, "ref")
        self.finish(self.train(3, ref, self.run_id + "_a",
                               extra=[f"train.stop_after_step={step}"]), done=False)
        want, _ = self.finish(self.train(2, ref, self.run_id + "_b"))
        self.assertEqual(sha, want)

    def test_store_host_killed(self):
        self.kill_group_rank(0)

    def test_middle_node_killed(self):
        self.kill_group_rank(1)

    def test_last_node_killed(self):
        self.kill_group_rank(2)


class Tls(EtcdCase):
    tls = True

    def conf(self, cert="cert", key="key"):
        c = self.etcd.certs
        parts = [FAST, "protocol=https", f"cacert={c['cacert']}"]
        if cert:
            parts += [f"cert={c[cert]}", f"key={c[key]}"]
        return ",".join(parts)

    def one_node(self, conf):
        flags = self.etcd_flags(conf=conf) + ["--nnodes=1", "--no-python", ARGS.fake_worker]
        n = self.node(0, flags)
        return n.wait(60), n.err()

    def test_client_certificate_is_accepted(self):
        rc, err = self.one_node(self.conf())
        self.assertEqual(rc, 0, err)

    def test_no_client_certificate_is_refused(self):
        t0 = time.monotonic()
        rc, err = self.one_node(self.conf(cert=None))
        self.assertEqual(rc, 3, err)
        self.assertIn("cannot reach etcd at " + self.etcd.endpoint(0), err)
        self.assertIn("TLS", err)
        self.assertLess(time.monotonic() - t0, 20)

    def test_certificate_of_another_ca_is_refused(self):
        rc, err = self.one_node(self.conf(cert="stranger_cert", key="stranger_key"))
        self.assertEqual(rc, 3, err)
        self.assertIn("TLS", err)

    def test_https_scheme_in_the_endpoint(self):
        eps = ",".join(f"https://{e}" for e in self.etcd.endpoints().split(","))
        c = self.etcd.certs
        conf = f"{FAST},cacert={c['cacert']},cert={c['cert']},key={c['key']}"
        n = self.node(0, self.etcd_flags(conf=conf, endpoints=eps) +
                      ["--nnodes=1", "--no-python", ARGS.fake_worker])
        self.assertEqual(n.wait(60), 0, n.err())


class Auth(EtcdCase):
    """etcd's user/password authentication, on one member (whose tokens a
    restart forgets)."""

    @classmethod
    def setUpClass(cls):
        cls.etcd = EtcdCluster(size=1).start()
        cls.etcd.enable_auth("root", "s3cret")

    def conf(self, password="s3cret"):
        path = os.path.join(self.dir, "password")
        with open(path, "w") as f:
            f.write(password + "\n")
        return f"{FAST},user=root,password_file={path}"

    def test_user_and_password_are_accepted(self):
        n = self.node(0, self.etcd_flags(conf=self.conf()) +
                      ["--nnodes=1", "--no-python", ARGS.fake_worker])
        self.assertEqual(n.wait(60), 0, n.err())

    def test_a_wrong_password_is_refused_naming_the_user(self):
        t0 = time.monotonic()
        n = self.node(0, self.etcd_flags(conf=self.conf("wrong")) +
                      ["--nnodes=1", "--no-python", ARGS.fake_worker])
        self.assertEqual(n.wait(60), 2, n.err())  # a setting to fix: no requeue
        self.assertIn("etcd refused user 'root'", n.err())
        self.assertLess(time.monotonic() - t0, 20)

    def test_without_credentials_the_node_is_told_to_give_them(self):
        t0 = time.monotonic()
        n = self.node(0, self.etcd_flags() + ["--nnodes=1", "--no-python", ARGS.fake_worker])
        self.assertEqual(n.wait(60), 2, n.err())
        self.assertIn("it has authentication on; give --rdzv-conf user=", n.err())
        self.assertLess(time.monotonic() - t0, 20)

    def test_the_token_is_renewed_when_the_member_forgets_it(self):
        pid_dir = os.path.join(self.dir, "pids")
        os.makedirs(pid_dir)
        n = self.node(0, self.etcd_flags(conf=self.conf()) + [
            "--nnodes=1", "--max-restarts=0", "--no-python", ARGS.fake_worker,
            "--pid-dir", pid_dir, "--sleep-ms", "6000"])
        self.assertTrue(wait_for(lambda: os.listdir(pid_dir), 30), n.err())
        self.etcd.kill(0)  # a restarted member knows no token it gave
        self.etcd.start_member(0)
        self.assertEqual(n.wait(60), 0, n.err())


class Errors(unittest.TestCase):
    def run_dtrun(self, *args):
        p = subprocess.run([ARGS.dtrun, *args, "--no-python", ARGS.fake_worker],
                           capture_output=True, text=True, timeout=60)
        return p.returncode, p.stderr

    def test_unreachable_etcd_exits_3_naming_every_endpoint(self):
        ports = [free_port("127.0.0.2"), free_port("127.0.0.3")]
        eps = f"127.0.0.2:{ports[0]},127.0.0.3:{ports[1]}"
        t0 = time.monotonic()
        rc, err = self.run_dtrun("--nnodes=2", "--rdzv-backend=etcd", f"--rdzv-endpoint={eps}")
        self.assertEqual(rc, 3, err)
        self.assertIn(f"cannot reach etcd at {eps}", err)
        self.assertIn("no etcd member reachable", err)
        self.assertLess(time.monotonic() - t0, 15)

    def test_bad_settings_exit_2_naming_them(self):
        cases = [
            (["--rdzv-conf=protocol=ftp"], "protocol='ftp'"),
            (["--rdzv-conf=protocol=https,cacert=/nonexistent.pem"], "cacert='/nonexistent.pem'"),
            (["--rdzv-conf=cacert=" + ALLREDUCE], "need protocol=https"),
            (["--rdzv-conf=user=root"], "user and password_file go together"),
            ([], "needs --rdzv-endpoint"),
        ]
        for extra, words in cases:
            endpoint = [] if not extra else ["--rdzv-endpoint=127.0.0.2:2379"]
            rc, err = self.run_dtrun("--nnodes=2", "--rdzv-backend=etcd-v2", *endpoint, *extra)
            self.assertEqual(rc, 2, (extra, err))
            self.assertIn(words, err, extra)
        rc, err = self.run_dtrun("--nnodes=2", "--rdzv-backend=etcd",
                                 "--rdzv-endpoint=127.0.0.2:2379,:x")
        self.assertEqual(rc, 2, err)
        self.assertIn("--rdzv-endpoint", err)
        rc, err = self.run_dtrun("--nnodes=2", "--rdzv-backend=c10d",
                                 "--rdzv-endpoint=127.0.0.2:2379", "--rdzv-conf=protocol=https")
        self.assertEqual(rc, 2, err)
        self.assertIn("for --rdzv-backend=etcd-v2", err)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]] + REST)
