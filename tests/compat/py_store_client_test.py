"""torch's Python TCPStore client against dtstore, every op the client has:
Debian's 1.13 on the host, torch 2.6 in the trixie root (through
run_in_torch2_root.py). Each check runs the same client code twice, against
dtstore and against torch's own server in this process, and the two
observations must be equal, except for the differences in DIFFERENCES,
which say what each side does."""
import hashlib
import socket
import struct
import sys
import threading
import time
import unittest
from datetime import timedelta

import torch
import torch.distributed as dist

from dtstore_proc import DtStore, TorchServer, parse_args, torch_major

ARGS, REST = parse_args()
MAJOR = torch_major()
ERROR = "error"  # the observation of an op that raised
CHECKS = {}      # name -> (fn(server, key) -> observation, client methods it needs)
RESULTS = {}     # name -> {"dtstore": observation, "torch": observation}

# Where dtstore keeps its own behaviour on purpose: check -> (dtstore's
# observation, torch's server's observation). torch's server here is the
# backend without libuv (Debian builds torch without it); since 2.4 torch's
# default server is the libuv backend, whose semantics dtstore follows.
DIFFERENCES = {
    # The libuv backend wakes waiters on every compare_set; the other one
    # never does. dtstore wakes them: a key that exists must release WAIT.
    "wait_released_by_compare_set": ("woke", "timed out"),
    # A GET of a missing key without a WAIT first (torch's client always
    # waits first): dtstore answers empty bytes as the libuv backend does;
    # the other backend closes the connection.
    "raw_get_missing_without_wait": (b"\0" * 8, "closed"),
    # An ADD whose sum leaves int64: both torch backends wrap around (signed
    # overflow in C++); dtstore refuses it and closes that connection.
    "add_overflowing_the_sum": ((ERROR, b"9223372036854775807"),
                                (-2**63, b"-9223372036854775808")),
}


def check(*needs):
    """Registers fn(server, key) as a check; `key(name)` gives a key private
    to the check. Skipped when the client lacks a method in `needs`."""
    def register(fn):
        CHECKS[fn.__name__] = (fn, needs)
        return fn
    return register


def attempt(fn, *args):
    try:
        return fn(*args)
    except RuntimeError:  # torch's DistStoreError and friends
        return ERROR


def elapsed(fn, *args):
    start = time.monotonic()
    result = attempt(fn, *args)
    return result, time.monotonic() - start


@check()
def set_then_get(srv, key):
    s = srv.client()
    s.set(key("a"), "value")
    return s.get(key("a")), srv.client().get(key("a"))


@check()
def set_overwrites(srv, key):
    s = srv.client()
    s.set(key("a"), "1")
    s.set(key("a"), "2")
    return s.get(key("a"))


@check()
def binary_and_empty_values(srv, key):
    s = srv.client()
    s.set(key("bin"), bytes(range(256)))
    s.set(key("empty"), "")
    return s.get(key("bin")), s.get(key("empty"))


@check()
def get_of_missing_key_times_out(srv, key):
    result, took = elapsed(srv.client(timeout=0.3).get, key("none"))
    return result, 0.25 <= took < 3


@check()
def add_counts_from_zero(srv, key):
    s = srv.client()
    return s.add(key("n"), 5), s.add(key("n"), -8), s.get(key("n"))


@check()
def add_zero_creates_the_key(srv, key):
    s = srv.client()
    before = s.num_keys()
    return s.add(key("z"), 0), s.get(key("z")), s.num_keys() - before


@check()
def add_overflowing_the_sum(srv, key):
    s = srv.client()
    s.add(key("big"), 2**63 - 1)
    return attempt(s.add, key("big"), 1), srv.client().get(key("big"))


# ADD reads the old value with std::stoll: leading blanks, a sign, digits,
# the rest ignored; no digits or out of range is an error that closes the
# connection (a fresh client still works, the value is unchanged).
ADD_OLD_VALUES = {
    "leading_blank": " 7", "trailing_text": "7abc", "hex": "0x10",
    "plus_sign": "+5", "blanks_then_minus": "\t\n -3", "decimal_point": "2.9",
    "not_a_number": "abc", "empty": "", "sign_only": "-", "two_signs": "+-4",
    "beyond_64_bits": "99999999999999999999",
}


def add_to_old_value(old):
    def fn(srv, key):
        s = srv.client()
        s.set(key("v"), old)
        return attempt(s.add, key("v"), 1), srv.client().get(key("v"))
    return fn


for _name, _old in ADD_OLD_VALUES.items():
    CHECKS["add_to_" + _name] = (add_to_old_value(_old), ())


@check()
def compare_set_every_case(srv, key):
    s = srv.client()
    before = s.num_keys()
    return (s.compare_set(key("c"), "", "x"),      # missing, expected empty
            s.compare_set(key("c"), "x", "y"),     # match: swaps
            s.compare_set(key("c"), "nope", "z"),  # mismatch: current
            s.compare_set(key("m"), "e", "z"),     # missing, expected set
            s.num_keys() - before)


@check("check")
def check_reports_readiness(srv, key):
    s = srv.client()
    s.set(key("a"), "1")
    return s.check([key("a")]), s.check([key("a"), key("none")])


@check()
def wait_for_existing_keys(srv, key):
    s = srv.client()
    s.set(key("a"), "1")
    s.set(key("b"), "2")
    return s.wait([key("a"), key("b")]), s.wait([key("a")], timedelta(seconds=1))


@check()
def wait_timeout_then_next_op(srv, key):
    # The key appears after the timeout: 2.x's client cancels the wait and
    # reads on in step; 1.13's reads the late STOP_WAITING as its next reply.
    s = srv.client(timeout=1)
    result, took = elapsed(s.wait, [key("never")], timedelta(milliseconds=300))
    srv.client().set(key("never"), "late")
    s.set(key("x"), "1")
    return result, 0.25 <= took < 3, attempt(s.get, key("x"))


@check()
def wait_without_timeout_uses_the_store_timeout(srv, key):
    result, took = elapsed(srv.client(timeout=0.3).wait, [key("never")])
    return result, 0.25 <= took < 3


def released_by(write, timeout=1.0):
    """A check: does a client waiting on key("w") wake when another client
    does write(client, key)?"""
    def fn(srv, key):
        waiter, writer, seen = srv.client(), srv.client(), []
        t = threading.Thread(target=lambda: seen.append(
            attempt(waiter.wait, [key("w")], timedelta(seconds=timeout))))
        t.start()
        time.sleep(0.5)  # WAIT registered before the write (not observable)
        write(writer, key)
        t.join()
        return "woke" if seen == [None] else "timed out"
    return fn


RELEASES = {
    "set": ((), lambda s, key: s.set(key("w"), "1")),
    "add": ((), lambda s, key: s.add(key("w"), 1)),
    "compare_set": ((), lambda s, key: s.compare_set(key("w"), "", "1")),
    "append": (("append",), lambda s, key: s.append(key("w"), "1")),
    "multi_set": (("multi_set",), lambda s, key: s.multi_set([key("w")], ["1"])),
}
for _name, (_needs, _write) in RELEASES.items():
    CHECKS["wait_released_by_" + _name] = (released_by(_write), _needs)


@check()
def wait_needs_every_key(srv, key):
    waiter, writer, seen = srv.client(), srv.client(), []
    t = threading.Thread(target=lambda: seen.append(
        attempt(waiter.wait, [key("a"), key("b")], timedelta(seconds=3))))
    t.start()
    writer.set(key("a"), "1")
    time.sleep(0.3)
    after_one = t.is_alive()
    writer.set(key("b"), "1")
    t.join()
    return after_one, seen


@check()
def set_timeout_applies_to_later_ops(srv, key):
    s = srv.client(timeout=5)
    s.set_timeout(timedelta(milliseconds=300))
    result, took = elapsed(s.get, key("none"))
    return result, took < 3, s.timeout == timedelta(milliseconds=300)


@check()
def delete_key_and_num_keys(srv, key):
    s = srv.client()
    before = s.num_keys()
    for name in "abc":
        s.set(key(name), "1")
    added = s.num_keys() - before
    return added, s.delete_key(key("a")), s.delete_key(key("a")), s.num_keys() - before


@check()
def delete_key_makes_wait_block_again(srv, key):
    s = srv.client()
    s.set(key("a"), "1")
    s.delete_key(key("a"))
    return attempt(s.wait, [key("a")], timedelta(milliseconds=300))


@check("append")
def append_creates_then_extends(srv, key):
    s = srv.client()
    s.append(key("a"), "x")
    s.append(key("a"), "y")
    return s.get(key("a"))


@check("multi_set", "multi_get")
def multi_set_then_multi_get_in_order(srv, key):
    s = srv.client()
    s.multi_set([key("c"), key("a"), key("b")], ["3", "1", "2"])
    return s.multi_get([key("b"), key("c"), key("a")])


@check("multi_get")
def multi_get_of_a_missing_key(srv, key):
    s = srv.client(timeout=0.5)
    s.set(key("a"), "1")
    return attempt(s.multi_get, [key("a"), key("none")])


@check()
def value_of_64_mib(srv, key):
    blob = bytes(range(256)) * (64 << 12)  # 64 MiB
    srv.client(timeout=30).set(key("big"), blob)
    got = srv.client(timeout=30).get(key("big"))
    return len(got), hashlib.sha256(got).hexdigest() == hashlib.sha256(blob).hexdigest()


@check()
def clients_with_a_world_size_count_in_init(srv, key):
    # Each client with a world size ADDs the unprefixed key "init/" as it
    # starts; the Python API cannot read it back, but num_keys sees it.
    before = srv.client().num_keys()
    clients = [srv.client(world_size=2) for _ in range(2)]
    return srv.client().num_keys() - before, len(clients)


@check()
def concurrent_adds_from_many_clients(srv, key):
    clients = [srv.client() for _ in range(4)]
    threads = [threading.Thread(target=lambda c=c: [c.add(key("n"), 1) for _ in range(50)])
               for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return srv.client().get(key("n"))


@check()
def prefix_store_over_the_client(srv, key):
    s = srv.client()
    p = dist.PrefixStore(key("pre"), s)
    p.set("a", "1")
    return s.get(key("pre") + "/a"), p.add("n", 3), p.get("n")


@check()
def gloo_group_through_store(srv, key):
    dist.init_process_group("gloo", store=dist.PrefixStore(key("pg"), srv.client()),
                            rank=0, world_size=1)
    try:
        t = torch.ones(4)
        dist.all_reduce(t)
        dist.barrier()
        return t.tolist()
    finally:
        dist.destroy_process_group()


# Raw requests in the server's dialect (2.x starts with VALIDATE).
MAGIC = struct.pack("<BI", 0, 0x3C85F7CE)


def raw(srv, payload, reply_len):
    """Sends VALIDATE + payload on a new connection; the reply bytes, or
    "closed" when the server closes it instead."""
    with socket.create_connection((srv.host, srv.port), timeout=2) as c:
        c.sendall(MAGIC + payload)
        got = b""
        try:
            while len(got) < reply_len:
                part = c.recv(reply_len - len(got))
                if not part:
                    return "closed"
                got += part
        except ConnectionResetError:
            return "closed"
        except socket.timeout:
            return ("no reply", got)
        return got


def wire_str(data):
    return struct.pack("<Q", len(data)) + data


if MAJOR >= 2:
    @check()
    def raw_get_missing_without_wait(srv, key):
        return raw(srv, b"\x03" + wire_str(b"/" + key("none").encode()), 8)

    @check()
    def raw_ping_echoes_the_nonce(srv, key):
        return raw(srv, struct.pack("<BI", 13, 0xDEADBEEF), 4)

    @check()
    def raw_cancel_wait_answers_canceled(srv, key):
        req = b"\x06" + struct.pack("<Q", 1) + wire_str(b"/" + key("never").encode())
        return raw(srv, req + b"\x0c", 1)

    @check()
    def raw_unknown_opcode_closes(srv, key):
        return raw(srv, b"\xfe", 1)

    @check()
    def raw_wrong_magic_closes(srv, key):
        with socket.create_connection((srv.host, srv.port), timeout=2) as c:
            c.sendall(struct.pack("<BI", 0, 0x12345678) + struct.pack("<BI", 13, 7))
            try:
                return c.recv(4) or "closed"
            except ConnectionResetError:
                return "closed"


class TorchClientOnDtStoreAndTorchServer(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.servers = {"dtstore": DtStore.from_args(ARGS), "torch": TorchServer()}

    @classmethod
    def tearDownClass(cls):
        cls.servers["torch"].stop()
        assert cls.servers["dtstore"].stop() == 0, "dtstore did not exit 0 on SIGTERM"

    def compare(self, name, fn, needs):
        missing = [n for n in needs if not hasattr(dist.TCPStore, n)]
        if missing:
            self.skipTest(f"torch {torch.__version__}'s Python TCPStore has no "
                          f"{', '.join(missing)}")
        seen = {side: fn(srv, lambda k: f"{name}/{k}") for side, srv in self.servers.items()}
        RESULTS[name] = seen
        differs = DIFFERENCES.get(name)
        if differs is None:
            self.assertEqual(seen["dtstore"], seen["torch"], name)
        else:
            self.assertEqual((seen["dtstore"], seen["torch"]), differs, name)


for _name, (_fn, _needs) in CHECKS.items():
    setattr(TorchClientOnDtStoreAndTorchServer, "test_" + _name,
            lambda self, n=_name, f=_fn, d=_needs: self.compare(n, f, d))


def tearDownModule():
    agree = [n for n, seen in RESULTS.items() if seen["dtstore"] == seen["torch"]]
    print(f"\n{len(agree)} of {len(RESULTS)} checks agree between dtstore and "
          f"torch {torch.__version__}'s server; differ: "
          f"{sorted(set(RESULTS) - set(agree)) or 'none'}", file=sys.stderr)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]] + REST, verbosity=2)
