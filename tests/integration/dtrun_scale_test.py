"""64 real dtrun agents (one fake worker each) at a standalone dtstore: a
round of 64 nodes, one agent killed (-9) while its worker runs, and a new
round of the 63 survivors, who then finish."""
import os
import subprocess
import sys
import time
import unittest

from dtrun_proc import NodesTestCase, parse_args, read_pids, start, wait_for

ARGS, REST = parse_args()
DTRUN, FAKE = ARGS.dtrun, ARGS.fake_worker
NODES = 64
CONF = ("is_host=0,keep_alive_interval=0.5,keep_alive_max_attempt=3,last_call_timeout=5,"
        "join_timeout=60")


class Scale(NodesTestCase):
    def agent(self, i, port):
        # Output to files: 64 pipes nobody reads would fill and block.
        err = open(os.path.join(self.dir, f"agent_{i}.err"), "w")
        p = subprocess.Popen(
            [DTRUN, f"--nnodes={NODES - 1}:{NODES}", "--nproc-per-node=1",
             "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=scale",
             f"--rdzv-conf={CONF}", FAKE, "--pid-dir", self.dir, "--sleep-ms", "4000"],
            stdout=subprocess.DEVNULL, stderr=err)
        err.close()
        self.procs.append(p)
        return p

    def stderr_of(self, i):
        with open(os.path.join(self.dir, f"agent_{i}.err")) as f:
            return f.read()

    def test_64_agents_round_failure_and_new_round(self):
        dtstore = os.path.join(os.path.dirname(DTRUN), "dtstore")
        store = start(dtstore, ["--host", "127.0.0.1", "--port", "0"])
        self.procs.append(store)
        port = int(store.stdout.readline().strip().rsplit(":", 1)[1])
        started = time.monotonic()
        agents = [self.agent(i, port) for i in range(NODES)]
        first = lambda: [r for (r, a) in read_pids(self.dir) if a == 0]
        self.assertTrue(wait_for(lambda: len(first()) == NODES, 40),
                        f"{len(first())} of {NODES} workers started in round 0")
        self.assertEqual(sorted(first()), list(range(NODES)))
        victim = agents[10]
        victim.kill()  # kill -9 the agent; PDEATHSIG takes its worker
        victim.wait()
        killed = time.monotonic()
        declared = lambda: any("declared dead" in self.stderr_of(i) for i in range(NODES))
        self.assertTrue(wait_for(declared, 20, step=0.1), "no survivor declared the node dead")
        detected = time.monotonic() - killed
        survivors = [p for p in agents if p is not victim]
        for p in survivors:
            p.wait(timeout=max(1, 60 - (time.monotonic() - started)))
        codes = [p.returncode for p in survivors]
        self.assertEqual(codes, [0] * (NODES - 1),
                         self.stderr_of(agents.index(survivors[codes.index(max(codes))])))
        # keep-alive x attempts, a check tick, and 64 files read per poll
        self.assertLess(detected, 0.5 * 3 + 2)
        last = max(a for (_, a) in read_pids(self.dir))
        self.assertEqual(sorted(r for (r, a) in read_pids(self.dir) if a == last),
                         list(range(NODES - 1)))
        self.assertIsNone(store.poll())
        self.assertLess(time.monotonic() - started, 60)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]] + REST, verbosity=2)
