"""The >= 2.2 byte fixtures (tests/rendezvous/fixtures/torch2_*.hex, which
tests/rendezvous replays against dtstore) checked against torch 2.x itself:
a relay records what torch's Python client sends for the same calls and what
torch's own server answers, and both must equal the fixture's bytes. Lines
from the first request 2.x lacks (opcodes 14-18, later torch) on are checked
only in that torch's server refuses that request. Runs under torch 2.x (in
the trixie root: run_in_torch2_root.py)."""
import os
import socket
import sys
import threading
import unittest
from datetime import timedelta

import torch

from dtstore_proc import TorchServer, tcp_store, torch_major

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                        "..", "rendezvous", "fixtures")
VALIDATE = bytes.fromhex("00cef7853c")
PING = 0x0D
FIRST_LATER_OPCODE = 14  # QUEUE_PUSH: opcodes from here on are newer than 2.6


def read_fixture(name):
    """[(">" or "<", bytes)] in file order; a ">" line is one request."""
    lines = []
    with open(os.path.join(FIXTURES, name + ".hex")) as f:
        for line in f:
            if line[:1] in "<>" and line.strip():
                lines.append((line[0], bytes.fromhex(line[1:].replace(" ", ""))))
    return lines


def split_at_later_ops(lines):
    """(requests, replies, first later request or None): the fixture's bytes
    up to its first request that torch 2.6 lacks."""
    requests, replies = b"", b""
    for direction, data in lines:
        if direction == ">" and data[0] >= FIRST_LATER_OPCODE and data != VALIDATE:
            return requests, replies, data
        if direction == ">":
            requests += data
        else:
            replies += data
    return requests, replies, None


class Relay:
    """Forwards connections from `listen` to `target`, recording each
    connection's client bytes and server bytes."""

    def __init__(self, listen, target):
        self.target, self.conns, self.threads = target, [], []
        self.sock = socket.create_server(listen)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            record = {"requests": bytearray(), "replies": bytearray()}
            self.conns.append(record)
            for src, dst, buf in ((client, server, record["requests"]),
                                  (server, client, record["replies"])):
                t = threading.Thread(target=self._pump, args=(src, dst, buf), daemon=True)
                self.threads.append(t)
                t.start()

    @staticmethod
    def _pump(src, dst, buf):
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if not data:
                try:
                    dst.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                return
            buf += data
            dst.sendall(data)

    def finish(self):
        """Waits until every connection closed; its first one's record."""
        for t in self.threads:
            t.join(timeout=10)
        self.sock.close()
        return self.conns[0]


def normalize_ping(captured, fixture_requests):
    """The client's PING carries its pid as nonce: put the fixture's nonce
    in, or drop the PING when the fixture (a raw replay) has none."""
    requests, replies = bytes(captured["requests"]), bytes(captured["replies"])
    assert requests[:5] == VALIDATE and requests[5] == PING, requests[:10].hex(" ")
    nonce = requests[6:10]
    assert replies[:4] == nonce, "PING reply is not the nonce"
    if fixture_requests[5:6] == bytes([PING]):
        theirs = fixture_requests[6:10]
        return requests[:6] + theirs + requests[10:], theirs + replies[4:]
    return requests[:5] + requests[10:], replies[4:]


def wait_then_cancel(s):
    try:
        s.wait(["k"], timedelta(milliseconds=100))
    except RuntimeError:
        pass
    else:
        raise AssertionError("wait on a missing key returned")
    s.set("k", "v")
    s.num_keys()


def multi_append(s):
    s.append("a", "x")
    s.append("a", "y")
    s.multi_set(["b", "c"], ["1", "2"])
    s.multi_get(["c", "a", "b"])
    s.check(["a", "b"])
    s.delete_key("a")
    s.delete_key("b")


def compare_set(s):
    s.compare_set("k", "", "x")
    s.compare_set("m", "e", "x")
    s.compare_set("k", "x", "y")
    s.compare_set("k", "z", "q")


# fixture -> what torch's client does for it (None: nothing before the
# first later opcode).
CALLS = {
    "torch2_wait_cancel": wait_then_cancel,
    "torch2_multi_append": multi_append,
    "torch2_compare_set": compare_set,
    "torch2_queue": None,
    "torch2_barrier": None,
}


def capture_client(calls):
    """Runs calls(client) through a relay to a fresh torch server."""
    server = TorchServer()
    relay = Relay(("127.0.0.1", 0), (server.host, server.port))
    client = tcp_store("127.0.0.1", relay.port, timeout=5)
    calls(client)
    del client  # closes the connection: the relay has seen every byte
    return relay.finish()


def capture_master_start():
    """A store's own process starting with world size 1: its server listens
    on 127.0.0.2:P and its client connects to 127.0.0.1:P, the relay."""
    listener = socket.create_server(("127.0.0.2", 0))
    port = listener.getsockname()[1]
    relay = Relay(("127.0.0.1", port), ("127.0.0.2", port))
    master = tcp_store("127.0.0.1", port, 1, is_master=True, timeout=5,
                       wait_for_workers=True, master_listen_fd=listener.detach())
    del master
    return relay.finish()


def refused_by_torch_server(request):
    server = TorchServer()
    with socket.create_connection((server.host, server.port), timeout=5) as c:
        c.sendall(VALIDATE + request)
        try:
            return c.recv(1) == b""
        except ConnectionResetError:
            return True


class FixturesMatchTorch2(unittest.TestCase):
    maxDiff = None

    def check(self, name, captured):
        """captured None: the fixture has nothing torch 2.x can send."""
        requests, replies, later = split_at_later_ops(read_fixture(name))
        if captured is None:
            self.assertEqual(requests, VALIDATE, name)
        else:
            got_requests, got_replies = normalize_ping(captured, requests)
            self.assertEqual(got_requests.hex(" "), requests.hex(" "), f"{name}: requests")
            self.assertEqual(got_replies.hex(" "), replies.hex(" "), f"{name}: replies")
        if later is not None:
            self.assertTrue(refused_by_torch_server(later),
                            f"{name}: torch {torch.__version__}'s server accepted "
                            f"opcode {later[0]}, which the fixture says is newer")

    def test_handshake_is_a_master_start(self):
        self.check("torch2_handshake", capture_master_start())

    def test_fixture_calls(self):
        for name, calls in CALLS.items():
            with self.subTest(name):
                self.check(name, calls and capture_client(calls))

    def test_every_fixture_is_checked(self):
        on_disk = {f[:-4] for f in os.listdir(FIXTURES) if f.startswith("torch2_")}
        self.assertEqual(on_disk, set(CALLS) | {"torch2_handshake"})


if __name__ == "__main__":
    if torch_major() < 2:
        sys.exit(f"fixture_capture_test.py needs torch 2.x, found {torch.__version__}; "
                 "run it through tests/compat/run_in_torch2_root.py")
    unittest.main(verbosity=2)
