"""Both ends of the standby protocol agree: the names and limits dtrun and
the native standby use (rendezvous/standby_protocol.h, dumped by
standby_protocol_dump) are the Python standby's
(apps/dtrun/python/dtrun_standby/dtrun_standby.py), and the Python standby,
started as dtrun starts it, answers a request spelt with the header's names."""
import argparse
import ctypes
import json
import os
import socket
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STANDBY_DIR = os.path.join(ROOT, "apps", "dtrun", "python", "dtrun_standby")
sys.path.insert(0, STANDBY_DIR)
import dtrun_standby  # noqa: E402

DUMP = None
_PR_SET_CHILD_SUBREAPER = 36


def spec():
    out = subprocess.run([DUMP], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


class ProtocolAgreementTest(unittest.TestCase):
    def test_names_and_limits(self):
        c = spec()
        s = dtrun_standby
        self.assertEqual(c["max_packet"], s.MAX_PACKET)
        self.assertEqual(c["descriptors"], s.DESCRIPTORS)
        self.assertEqual(c["script_variable"], s.SCRIPT_VARIABLE)
        self.assertEqual(c["module_variable"], s.MODULE_VARIABLE)
        for name in ("ready", "seconds", "why", "argv", "env", "cpus", "parent", "pid",
                     "error"):
            self.assertEqual(c[name], getattr(s, name.upper()), name)

    def test_python_standby_answers_the_headers_messages(self):
        """A request spelt with the header's names gets a worker (its pid
        under the header's name, its output on the descriptors sent) and a
        bad one an answer under the header's error name."""
        c = spec()
        libc = ctypes.CDLL(None, use_errno=True)
        self.assertEqual(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), 0)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        boot = ("import sys; sys.path.insert(0, sys.argv[1]); "
                "import dtrun_standby; dtrun_standby.main()")
        with tempfile.TemporaryDirectory() as tmp:
            script = os.path.join(tmp, "worker.py")
            with open(script, "w") as f:
                f.write("import os, sys\nprint('worker', os.environ['RANK'], sys.argv[1:])\n")
            env = dict(os.environ, **{c["script_variable"]: script, c["module_variable"]: "0"})
            fd = theirs.fileno()
            standby = subprocess.Popen(
                [sys.executable, "-u", "-c", boot, STANDBY_DIR, str(fd), ""], env=env,
                pass_fds=(fd,))
            theirs.close()
            try:
                ready = json.loads(ours.recv(c["max_packet"]))
                self.assertIs(ready[c["ready"]], True, ready)
                self.assertGreaterEqual(ready[c["seconds"]], 0)

                worker_env = [f"{k}={v}" for k, v in os.environ.items()] + ["RANK=3"]
                out_r, out_w = os.pipe()
                request = {c["argv"]: [sys.executable, "-u", script, "a", "b"],
                           c["env"]: worker_env, c["cpus"]: [],
                           c["parent"]: os.getpid()}
                socket.send_fds(ours, [json.dumps(request).encode()], [out_w, out_w])
                os.close(out_w)
                answer = json.loads(ours.recv(c["max_packet"]))
                self.assertIn(c["pid"], answer, answer)
                _, status = os.waitpid(answer[c["pid"]], 0)
                self.assertEqual(os.waitstatus_to_exitcode(status), 0)
                with os.fdopen(out_r) as f:
                    self.assertEqual(f.read(), "worker 3 ['a', 'b']\n")

                request[c["argv"]] = ["/bin/true"]
                null = os.open(os.devnull, os.O_WRONLY)
                socket.send_fds(ours, [json.dumps(request).encode()], [null] * c["descriptors"])
                os.close(null)
                answer = json.loads(ours.recv(c["max_packet"]))
                self.assertIn("python -u", answer[c["error"]])
            finally:
                ours.close()  # the standby's cue to exit
                self.assertEqual(standby.wait(timeout=30), 0)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--dump", required=True)
    args, rest = parser.parse_known_args()
    DUMP = args.dump
    unittest.main(argv=[sys.argv[0]] + rest)
