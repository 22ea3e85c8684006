"""4 Python gloo ranks (Debian's torch: 1.13 on the host, 2.6 in the trixie
root) meet through dtstore, as under torchrun's agent store (env://, 1.13)
and through an explicit client (store=, both); the collectives must be
right."""
import os
import signal
import subprocess
import sys
import unittest

from dtstore_proc import DtStore, parse_args, torch_major

ARGS, REST = parse_args()
HERE = os.path.dirname(os.path.abspath(__file__))
ENV_WORKER = os.path.join(HERE, "..", "..", "examples", "allreduce_check.py")
STORE_WORKER = os.path.join(HERE, "gloo_store_rank.py")


class GlooThroughDtStore(unittest.TestCase):
    def run_ranks(self, worker, world=4):
        """Runs `world` ranks of `worker` against dtstore (a fresh one per
        try on the host; one for the whole script in the torch 2.6 root);
        their outputs, after checking every rank and dtstore exited 0. Ranks
        that hang are shown (their Python stacks) and run once more: a rare
        hang of torch 2.6's gloo ranks, seen with an older dtstore too, is
        not yet understood; a second hang fails the test. The last one
        seen (CI, 2026-11-25) was one rank left in ProcessGroupGloo's
        teardown after destroy_process_group, its peers gone. Each try has
        keys of its own: the torch 2.6 run shares one dtstore for the whole
        script, and gloo ranks that read the first try's addresses fail."""
        for attempt in (1, 2):
            outputs = self.run_once(worker, world, f"try{attempt}-{os.getpid()}")
            if outputs is not None:
                return outputs
            print(f"attempt {attempt}: the ranks hung for 60 s (stacks above)",
                  file=sys.stderr, flush=True)
        self.fail("the ranks hung twice (stacks above)")

    def run_once(self, worker, world, prefix):
        server = DtStore.from_args(ARGS)
        procs = []
        try:
            for rank in range(world):
                env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank),
                           WORLD_SIZE=str(world), MASTER_ADDR=server.host,
                           MASTER_PORT=str(server.port),
                           TORCHELASTIC_USE_AGENT_STORE="True",
                           TORCHELASTIC_RESTART_COUNT="0", OMP_NUM_THREADS="1",
                           GLOO_STORE_PREFIX=f"gloo_store_rank/{prefix}",
                           PYTHONFAULTHANDLER="1")
                procs.append(subprocess.Popen([sys.executable, worker], env=env,
                                              stdout=subprocess.PIPE, text=True))
            try:
                outputs = [p.communicate(timeout=60)[0] for p in procs]
            except subprocess.TimeoutExpired:
                for p in procs:  # the fault handler prints each one's stacks
                    if p.poll() is None:
                        p.send_signal(signal.SIGABRT)
                for p in procs:
                    p.communicate(timeout=10)
                return None
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            rc = server.stop()
        self.assertEqual([p.returncode for p in procs], [0] * world)
        self.assertEqual(rc, 0)
        return outputs

    def test_four_ranks_all_reduce_env_rendezvous(self):
        if torch_major() >= 2:
            self.skipTest("Debian's torch 2.6 env:// client for the agent store "
                          "asks for libuv, which that build lacks (use store=)")
        outputs = self.run_ranks(ENV_WORKER)
        self.assertIn("sum=10 expected=10 OK", outputs[0])

    def test_four_ranks_gather_and_broadcast_through_store(self):
        outputs = self.run_ranks(STORE_WORKER)
        for rank, out in enumerate(outputs):
            self.assertIn(f"rank {rank}: gathered [0, 1, 2, 3] OK", out)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]] + REST, verbosity=2)
