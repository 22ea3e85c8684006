"""A native program's own standby (lib/standby_worker.h), driven here as
dtrun drives it: train_cfg started with DTRUN_STANDBY_FD, JSON packets on
a SOCK_SEQPACKET socket, the worker's stdout and stderr passed with each
request. What it says when ready, the workers it forks (their argv,
output, parent and exit code), what it refuses and why, and its exit when
dtrun's end closes."""
import argparse
import ctypes
import json
import os
import socket
import subprocess
import sys
import unittest

p = argparse.ArgumentParser()
p.add_argument("--train-cfg", required=True)
ARGS, REST = p.parse_known_args()
HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG = os.path.join(HERE, "..", "..", "examples", "configs", "digits_ddp.toml")
PR_SET_CHILD_SUBREAPER = 36


class Standby(unittest.TestCase):
    def setUp(self):
        # The workers are forked twice and re-parented to this process, as
        # to dtrun.
        ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = {k: v for k, v in os.environ.items() if k != "LD_FOO"}
        env["DTRUN_STANDBY_FD"] = str(theirs.fileno())
        self.env = env
        self.proc = subprocess.Popen([ARGS.train_cfg, CONFIG], env=env,
                                     pass_fds=(theirs.fileno(),))
        theirs.close()
        self.sock.settimeout(60)

    def tearDown(self):
        self.sock.close()
        try:
            self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()

    def receive(self):
        return json.loads(self.sock.recv(1 << 20))

    def ask(self, argv, env, text=None):
        """Sends one request with a pipe as the worker's stdout and one as
        its stderr; the answer and the pipes' read ends."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        req = text if text is not None else json.dumps(
            {"argv": argv, "env": env, "cpus": [], "parent": os.getpid()}).encode()
        socket.send_fds(self.sock, [req], [out_w, err_w])
        os.close(out_w)
        os.close(err_w)
        return self.receive(), out_r, err_r

    def read_all(self, fd):
        chunks = []
        while True:
            b = os.read(fd, 65536)
            if not b:
                break
            chunks.append(b)
        os.close(fd)
        return b"".join(chunks).decode()

    def env_list(self, **extra):
        env = {k: v for k, v in self.env.items() if k != "DTRUN_STANDBY_FD"}
        env.update(extra)
        return [f"{k}={v}" for k, v in env.items()]

    def test_a_worker_runs_its_own_argv_with_its_output_and_exit_code(self):
        ready = self.receive()
        self.assertTrue(ready["ready"], ready)
        self.assertGreater(ready["seconds"], 0)
        missing = os.path.join(os.sep, "nonexistent", "worker.toml")
        answer, out_r, err_r = self.ask([ARGS.train_cfg, missing], self.env_list())
        self.assertIn("pid", answer, answer)
        pid = answer["pid"]
        self.assertEqual(self.read_all(out_r), "")
        self.assertIn(f"train_cfg: {missing}: cannot read it", self.read_all(err_r))
        _, status = os.waitpid(pid, 0)  # ours: re-parented to this process
        self.assertEqual(os.waitstatus_to_exitcode(status), 2)
        # And the standby goes on: a second worker.
        answer, out_r, err_r = self.ask([ARGS.train_cfg], self.env_list())
        self.assertIn("no config file given", self.read_all(err_r))
        self.read_all(out_r)
        _, status = os.waitpid(answer["pid"], 0)
        self.assertEqual(os.waitstatus_to_exitcode(status), 2)

    def test_a_variable_read_at_start_that_differs_is_refused_saying_which(self):
        self.assertTrue(self.receive()["ready"])
        answer, out_r, err_r = self.ask([ARGS.train_cfg], self.env_list(LD_FOO="1"))
        os.close(out_r)
        os.close(err_r)
        self.assertEqual(answer, {"error": "LD_FOO differs between the worker ('1') and the "
                                           "standby ('(unset)'), and is read at start"})
        answer, out_r, err_r = self.ask(None, None, text=b"{not json")
        os.close(out_r)
        os.close(err_r)
        self.assertIn("bad request", answer["error"])
        answer, out_r, err_r = self.ask(None, None, text=b'{"argv": 3, "env": [], "parent": 1}')
        os.close(out_r)
        os.close(err_r)
        self.assertIn("bad request", answer["error"])

    def test_the_standby_exits_when_dtruns_end_closes(self):
        self.assertTrue(self.receive()["ready"])
        self.sock.close()
        self.assertEqual(self.proc.wait(timeout=30), 0)

    def test_without_the_variable_the_program_runs_as_ever(self):
        p = subprocess.run([ARGS.train_cfg], capture_output=True, text=True, timeout=60,
                           env={k: v for k, v in self.env.items() if k != "DTRUN_STANDBY_FD"})
        self.assertEqual(p.returncode, 2)
        self.assertIn("no config file given", p.stderr)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]] + REST)
