"""Several dtrun agents on one machine, as "hosts" on loopback addresses
(127.0.0.2, ...): static and elastic rendezvous, late joiners, a killed node,
failures counted across nodes, and the errors for bad setups."""
import glob
import os
import signal
import socket
import sys
import time
import unittest

from dtrun_proc import NodesTestCase, alive, parse_args, read_pids, run, start, wait_for

ARGS, REST = parse_args()
DTRUN, FAKE = ARGS.dtrun, ARGS.fake_worker
HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "torch_worker.py")
ALLREDUCE = os.path.join(HERE, "..", "..", "examples", "allreduce_check.py")
PY = ["--python", "/usr/bin/python3"]
FAST = "keep_alive_interval=0.2,keep_alive_max_attempt=3,last_call_timeout=0.5,join_timeout=30"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def envs(folder):
    """{RANK: env dict} from fake_worker --env-dir files."""
    out = {}
    for path in glob.glob(os.path.join(folder, "env_*")):
        with open(path) as f:
            env = dict(l.rstrip("\n").split("=", 1) for l in f if "=" in l)
        out[int(env["RANK"])] = env
    return out


class MultiNode(NodesTestCase):
    def node(self, args, env=None):
        p = start(DTRUN, args, env=env)
        self.procs.append(p)
        return p

    def finish(self, p, timeout=120):
        out, err = p.communicate(timeout=timeout)
        return p.returncode, out, err

    def test_static_two_nodes_two_workers_all_reduce(self):
        port = free_port()
        common = PY + ["--nnodes=2", "--nproc-per-node=2", "--master-addr=127.0.0.2",
                       f"--master-port={port}"]
        n1 = self.node(common + ["--node-rank=1", "--local-addr=127.0.0.3", ALLREDUCE])
        n0 = self.node(common + ["--node-rank=0", "--local-addr=127.0.0.2", ALLREDUCE])
        rc0, out0, err0 = self.finish(n0)
        rc1, _, err1 = self.finish(n1)
        self.assertEqual((rc0, rc1), (0, 0), err0 + err1)
        self.assertIn("all_reduce over 4 ranks: sum=10 expected=10 OK", out0)

    def test_a_stop_signal_while_joining_is_seen_within_its_wait(self):
        # One node of two, nobody else coming: its waits in the round have
        # grown to 2 s by the time SIGTERM comes; it stops within one.
        port = free_port()
        n = self.node(["--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
                       f"--rdzv-endpoint=127.0.0.2:{port}", "--local-addr=127.0.0.2",
                       "--rdzv-id=alone", FAKE])
        time.sleep(6)
        self.assertIsNone(n.poll())
        sent = time.monotonic()
        n.send_signal(signal.SIGTERM)
        rc, _, err = self.finish(n, timeout=30)
        took = time.monotonic() - sent
        self.assertEqual(rc, 128 + signal.SIGTERM, err)
        self.assertIn("stopped by SIGTERM while waiting for the rendezvous", err)
        self.assertLess(took, 4.0, err)  # a 2 s wait, and the machine's noise

    def test_dynamic_two_nodes_two_workers_all_reduce(self):
        port = free_port()
        common = PY + ["--nnodes=2", "--nproc-per-node=2", "--rdzv-backend=c10d",
                       f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=dyn", ALLREDUCE]
        nodes = [self.node(common) for _ in range(2)]
        results = [self.finish(p) for p in nodes]
        self.assertEqual([r[0] for r in results], [0, 0], results[0][2] + results[1][2])
        self.assertEqual(sum("sum=10 expected=10 OK" in r[1] for r in results), 1)

    def test_ranks_and_world_across_nodes(self):
        port = free_port()
        common = ["--nnodes=2", "--nproc-per-node=2", "--rdzv-backend=c10d",
                  f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=env", FAKE,
                  "--env-dir", self.dir]
        results = [self.finish(p) for p in [self.node(common), self.node(common)]]
        self.assertEqual([r[0] for r in results], [0, 0])
        e = envs(self.dir)
        self.assertEqual(sorted(e), [0, 1, 2, 3])
        self.assertEqual({v["WORLD_SIZE"] for v in e.values()}, {"4"})
        self.assertEqual({v["GROUP_WORLD_SIZE"] for v in e.values()}, {"2"})
        self.assertEqual(e[0]["GROUP_RANK"], "0")
        self.assertEqual(e[3]["GROUP_RANK"], "1")
        self.assertEqual(len({(v["MASTER_ADDR"], v["MASTER_PORT"]) for v in e.values()}), 1)

    def test_store_proxy_carries_the_other_nodes_workers_through_a_restart(self):
        """--store-proxy=on: node 1's workers reach the workers' store through
        their dtrun (MASTER_ADDR 127.0.0.1, its port), torch 1.13's gloo set-up
        works through it, and after a worker fails the next round's proxy
        carries the restarted group."""
        port = free_port()
        marks = os.path.join(self.dir, "marks")
        os.makedirs(marks)
        common = PY + ["--nnodes=2", "--nproc-per-node=2", "--master-addr=127.0.0.2",
                       f"--master-port={port}", "--max-restarts=1", "--store-proxy=on"]
        n1 = self.node(common + ["--node-rank=1", "--local-addr=127.0.0.3",
                                 WORKER, "fail-once", marks])
        n0 = self.node(common + ["--node-rank=0", "--local-addr=127.0.0.2",
                                 WORKER, "fail-once", marks])
        rc0, out0, err0 = self.finish(n0)
        rc1, _, err1 = self.finish(n1)
        self.assertEqual((rc0, rc1), (0, 0), err0 + err1)
        self.assertIn("sum=10 attempt=1 OK", out0)
        self.assertEqual(err1.count("(this node's proxy to it)"), 2, err1)
        self.assertRegex(err1, r"workers' store 127\.0\.0\.1:\d+ \(this node's proxy")
        self.assertNotIn("proxy", err0)
        self.assertNotIn("lost the workers' store", err1)

    def test_store_proxy_off_and_auto_keep_rank_zeros_address(self):
        port = free_port()
        for mode in ["off", "auto"]:
            out = os.path.join(self.dir, mode)
            os.makedirs(out)
            common = ["--nnodes=2", "--nproc-per-node=2", "--rdzv-backend=c10d",
                      f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id=p{mode}",
                      f"--store-proxy={mode}", FAKE, "--env-dir", out]
            results = [self.finish(p) for p in [self.node(common), self.node(common)]]
            self.assertEqual([r[0] for r in results], [0, 0], results[0][2] + results[1][2])
            e = envs(out)
            self.assertEqual(len({(v["MASTER_ADDR"], v["MASTER_PORT"]) for v in e.values()}), 1)

    def test_late_node_joins_a_running_job(self):
        port = free_port()
        common = ["--nnodes=1:2", "--nproc-per-node=2", "--rdzv-backend=c10d",
                  f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=late",
                  f"--rdzv-conf={FAST}", FAKE, "--env-dir", self.dir, "--sleep-ms", "1500"]
        first = self.node(common)
        self.assertTrue(wait_for(lambda: len(envs(self.dir)) == 2, 20))
        self.assertEqual(envs(self.dir)[0]["WORLD_SIZE"], "2")
        second = self.node(common)
        rc1, _, err1 = self.finish(first)
        rc2, _, err2 = self.finish(second)
        self.assertEqual((rc1, rc2), (0, 0), err1 + err2)
        e = envs(self.dir)
        self.assertEqual(sorted(e), [0, 1, 2, 3])
        self.assertEqual({v["WORLD_SIZE"] for v in e.values()}, {"4"})
        self.assertEqual({v["TORCHELASTIC_RESTART_COUNT"] for v in e.values()}, {"1"})
        self.assertIn("waiting to join", err1)

    def test_killed_node_is_dropped_and_the_survivor_finishes(self):
        port = free_port()
        common = ["--nnodes=1:2", "--nproc-per-node=2", "--rdzv-backend=c10d",
                  f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=kill",
                  f"--rdzv-conf={FAST}", FAKE, "--pid-dir", self.dir, "--sleep-ms", "3000"]
        host = self.node(common)
        time.sleep(0.1)  # the first one hosts the store
        victim = self.node(common)
        self.assertTrue(wait_for(lambda: len(read_pids(self.dir)) == 4, 20))
        victim_workers = [pid for (rank, _), pid in read_pids(self.dir).items() if rank >= 2]
        if not victim_workers or len(read_pids(self.dir)) != 4:
            self.fail(f"unexpected ranks {read_pids(self.dir)}")
        killed_at = time.monotonic()
        victim.kill()  # kill -9 the agent; PDEATHSIG takes its workers
        victim.communicate()
        self.assertTrue(wait_for(lambda: all(not alive(p) for p in victim_workers), 5))
        self.assertTrue(wait_for(lambda: (0, 1) in read_pids(self.dir), 20))
        detected = time.monotonic() - killed_at
        rc, _, err = self.finish(host)
        self.assertEqual(rc, 0, err)
        self.assertIn("declared dead", err)
        self.assertLess(detected, 0.2 * 3 + 3)  # keep-alive x attempts, + a restart
        self.assertNotIn((2, 1), read_pids(self.dir))  # the new world has 2 ranks

    def test_a_killed_nodes_closed_connection_is_its_death_at_once(self):
        # torchrun's keep-alive (5 s x 3): a killed dtrun's connection to the
        # store closes with it, which is news at once, not after 15 s.
        port = free_port()
        common = ["--nnodes=1:2", "--nproc-per-node=1", "--rdzv-backend=c10d",
                  f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=closed",
                  f"--log-dir={self.dir}/logs",
                  "--rdzv-conf=last_call_timeout=0.5,join_timeout=30", FAKE,
                  "--pid-dir", self.dir, "--sleep-ms", "8000"]
        host = self.node(common)
        time.sleep(0.1)
        victim = self.node(common)
        self.assertTrue(wait_for(lambda: len(read_pids(self.dir)) == 2, 20))
        killed_at = time.monotonic()
        victim.kill()
        victim.communicate()
        # the survivor's worker of the next round (rank 0 of a world of 1)
        first = read_pids(self.dir)[(0, 0)]
        self.assertTrue(wait_for(lambda: read_pids(self.dir).get((0, 1), first) != first, 10))
        detected = time.monotonic() - killed_at
        rc, _, err = self.finish(host)
        self.assertEqual(rc, 0, err)
        self.assertIn("connection to the store closed", err)
        self.assertIn("declared dead", err)
        self.assertLess(detected, 5)  # not the 15 s of the heartbeats

    def test_failure_restarts_every_node_with_the_same_count(self):
        port = free_port()
        common = ["--nnodes=2", "--nproc-per-node=2", "--rdzv-backend=c10d",
                  f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=fail", "--max-restarts=1",
                  f"--rdzv-conf={FAST}", FAKE, "--pid-dir", self.dir, "--sleep-ms", "200",
                  "--only-rank", "3", "--fail-once", self.dir]
        results = [self.finish(p) for p in [self.node(common), self.node(common)]]
        self.assertEqual([r[0] for r in results], [0, 0], results[0][2] + results[1][2])
        pids = read_pids(self.dir)
        self.assertEqual(sorted(pids), [(r, a) for r in range(4) for a in (0, 1)])

    def test_final_failure_ends_every_node(self):
        port = free_port()
        common = ["--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
                  f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=final", "--max-restarts=1",
                  f"--rdzv-conf={FAST}", FAKE, "--sleep-ms", "100", "--only-rank", "1",
                  "--exit", "9"]
        results = [self.finish(p) for p in [self.node(common), self.node(common)]]
        codes = sorted(r[0] for r in results)
        self.assertEqual(codes, [1, 9])
        failing = [r for r in results if r[0] == 9][0]
        self.assertIn("attempts", failing[2])
        other = [r for r in results if r[0] == 1][0]
        self.assertIn("the job failed: workers failed on node", other[2])

    def test_standalone_dtstore_as_the_endpoint(self):
        dtstore = os.path.join(os.path.dirname(DTRUN), "dtstore")
        store = start(dtstore, ["--host", "127.0.0.1", "--port", "0"])
        self.procs.append(store)
        port = int(store.stdout.readline().strip().rsplit(":", 1)[1])
        common = ["--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
                  f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=ext",
                  "--rdzv-conf=is_host=0", FAKE, "--env-dir", self.dir]
        results = [self.finish(p) for p in [self.node(common), self.node(common)]]
        self.assertEqual([r[0] for r in results], [0, 0], results[0][2])
        self.assertEqual(sorted(envs(self.dir)), [0, 1])
        self.assertIsNone(store.poll())  # the store outlives the nodes

    def test_unreachable_endpoint_exits_3_naming_it(self):
        port = free_port()
        t0 = time.monotonic()
        rc, _, err = run(DTRUN, ["--nnodes=2", "--rdzv-backend=c10d",
                                 f"--rdzv-endpoint=127.0.0.1:{port}",
                                 "--rdzv-conf=join_timeout=1,is_host=0", FAKE])
        self.assertEqual(rc, 3)
        self.assertIn(f"127.0.0.1:{port}", err)
        self.assertLess(time.monotonic() - t0, 10)

    def test_join_timeout_says_who_came(self):
        port = free_port()
        rc, _, err = run(DTRUN, ["--nnodes=2", "--rdzv-backend=c10d",
                                 f"--rdzv-endpoint=127.0.0.1:{port}",
                                 "--rdzv-conf=join_timeout=1", FAKE])
        self.assertEqual(rc, 3)
        self.assertIn("1 of min 2 nodes joined", err)

    def test_nodes_disagreeing_on_settings_get_a_clear_error(self):
        port = free_port()
        base = ["--nnodes=2", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
                "--rdzv-conf=join_timeout=20"]
        a = self.node(base + ["--nproc-per-node=2", FAKE])
        time.sleep(0.3)
        b = self.node(base + ["--nproc-per-node=1", FAKE])
        ra, rb = self.finish(a, 30), self.finish(b, 30)
        self.assertEqual((ra[0], rb[0]), (2, 2))
        for r in (ra, rb):
            self.assertIn("--nproc-per-node=1", r[2])
            self.assertIn("every node must pass the same values", r[2])


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]] + REST, verbosity=2)
