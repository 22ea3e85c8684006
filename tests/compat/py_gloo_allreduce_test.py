"""4 Python ranks (Debian's torch, gloo) rendezvous through dtstore exactly as
under torchrun's agent store, then all_reduce; the sum must be right."""
import os
import subprocess
import sys
import unittest

from dtstore_proc import DtStore, parse_args

ARGS, REST = parse_args()
HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "..", "..", "examples", "allreduce_check.py")


class GlooAllReduceThroughDtStore(unittest.TestCase):
    def test_four_ranks_all_reduce(self):
        server = DtStore(ARGS.dtstore)
        procs = []
        try:
            for rank in range(4):
                env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank),
                           WORLD_SIZE="4", MASTER_ADDR="127.0.0.1",
                           MASTER_PORT=str(server.port),
                           TORCHELASTIC_USE_AGENT_STORE="True",
                           TORCHELASTIC_RESTART_COUNT="0", OMP_NUM_THREADS="1")
                procs.append(subprocess.Popen([sys.executable, WORKER], env=env,
                                              stdout=subprocess.PIPE, text=True))
            outputs = [p.communicate(timeout=90)[0] for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            rc = server.stop()
        self.assertEqual([p.returncode for p in procs], [0, 0, 0, 0])
        self.assertIn("sum=10 expected=10 OK", outputs[0])
        self.assertEqual(rc, 0)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]] + REST, verbosity=2)
