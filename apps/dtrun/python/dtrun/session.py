"""The client side of an interactive dtrun session: what the console and the
Jupyter extension use to run cells on the workers.

Everything travels through the dtrun store; protocol.py lists every key.
Cells of kind "push" (names, chunks), "pull" (names) and "complete" (text)
move variables between the client and the ranks and complete names; values
travel pickled, in chunks under the store's limit on one value (64 MiB).
A pull's tensors leave the pickle: the rank answers {tensors: [[dtype,
shape], ...], host, port} and sends their bytes, in order, to the first
connection on host:port (one copy each side, not three through the store).
Every worker reads every cell (cells are numbered from 0 in each attempt of
the worker group) and answers those that select its rank.

With several nodes, each rendezvous round has a workers' store of its own:
the client is handed the rendezvous store, where dtrun keeps
"<round> <world> <host>:<port>" of the current round under `rdzv_key`
(protocol.current_round_key), and
moves to the new store when the round changes (a %restart, a dead worker on
any node).
"""
import collections
import importlib.util
import io
import json
import os
import pickle
import queue
import socket
import struct
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from dtrun.protocol import (PREFIX, READY, cell_key, data_key, has_status_key,  # noqa: F401
                            interrupt_key, restart_key, result_key, status_answers_key,
                            status_key, stream_count_key, stream_key)
from dtrun import protocol


CHUNK = 16 << 20  # bytes per stored chunk of pickled data
TIMELINE_CELLS = 1000  # cells %dist_timeline remembers


def put_chunks(store, key_of, blob):
    """Stores `blob` in chunks under key_of(k); returns how many."""
    chunks = max(1, -(-len(blob) // CHUNK))
    view = memoryview(blob)
    for k in range(chunks):
        store.set(key_of(k), bytes(view[k * CHUNK:(k + 1) * CHUNK]))
    return chunks


def get_chunks(store, key_of, chunks):
    return b"".join(store.get(key_of(k)) for k in range(chunks))


def get_record(store, key):
    """A JSON record published in the store, or None when it reads empty:
    dtrun cleared the store for a new attempt after the caller saw the record
    counted (torch's get WAITs for the key, which still existed, then GETs
    it, which no longer does)."""
    value = store.get(key)
    return json.loads(value) if value else None


# A value no record ever has: COMPARE_SET(key, _ABSENT, _ABSENT) reads a key
# without waiting for it, changes nothing, and answers _ABSENT when the key
# does not exist.
_ABSENT = b"\x00dtrun-absent"
_COMPARE_SET = b"\x01"  # opcode of the 1.13 dialect, which the store detects


class Reader:
    """Reads the JSON records under many keys in one round trip: their
    COMPARE_SETs pipelined on a connection of its own, spoken here because
    torch's client sends one request at a time and its get waits for the
    key first (two round trips a key). Keys get the leading '/' torch's
    client gives them."""

    def __init__(self, host, port):
        self.addr = (host, port)
        self.sock = None

    def peek(self, keys):
        """[record or None (no such key yet)] for `keys`, in order."""
        msg = bytearray()
        for key in keys:
            msg += _COMPARE_SET
            for part in (("/" + key).encode(), _ABSENT, _ABSENT):
                msg += struct.pack("<Q", len(part)) + part
        try:
            if self.sock is None:
                self.sock = socket.create_connection(self.addr, timeout=60)
                self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.sock.sendall(msg)
            values = [self._exact(struct.unpack("<Q", self._exact(8))[0]) for _ in keys]
        except OSError as e:
            self.close()  # the stream may be cut mid-reply: start afresh next time
            raise RuntimeError(f"the session's store at {self.addr[0]}:{self.addr[1]}: "
                               f"{e}") from None
        return [None if v in (_ABSENT, b"") else json.loads(v) for v in values]

    def _exact(self, n):
        buf = bytearray()
        while len(buf) < n:
            got = self.sock.recv(n - len(buf))
            if not got:
                raise OSError("the store closed the connection")
            buf += got
        return bytes(buf)

    def close(self):
        if self.sock is not None:
            self.sock.close()
            self.sock = None


_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_NUMPY = importlib.util.find_spec("numpy") is not None  # raw_bytes views tensors through it


def raw_bytes(t):
    """A writable byte view of a contiguous CPU tensor's memory."""
    return memoryview(t.view(_INT_OF_SIZE[t.element_size()]).numpy()).cast("B")


def sendable(obj):
    """Whether a tensor can travel as raw bytes (plain, dense, real)."""
    return (_NUMPY and type(obj) is torch.Tensor and obj.layout == torch.strided and not obj.requires_grad
            and not obj.is_complex() and obj.element_size() in _INT_OF_SIZE
            and obj.device.type == "cpu")


class TensorPickler(pickle.Pickler):
    """Pickles everything but sendable tensors, which it collects."""

    def __init__(self, file):
        super().__init__(file, protocol=5)
        self.tensors = []

    def persistent_id(self, obj):
        if sendable(obj):
            self.tensors.append(obj.contiguous())
            return ("tensor", len(self.tensors) - 1)
        return None


def load_with_tensors(blob, tensors):
    class Unpickler(pickle.Unpickler):
        def persistent_load(self, pid):
            return tensors[pid[1]]

    return Unpickler(io.BytesIO(blob)).load()


def receive_tensors(host, port, specs, timeout=120.0):
    """The tensors a pull's rank sends, received straight into their memory."""
    tensors = [torch.empty(shape, dtype=getattr(torch, dtype.split(".")[-1]))
               for dtype, shape in specs]
    with socket.create_connection((host, port), timeout=timeout) as conn:
        for t in tensors:
            view, got = raw_bytes(t), 0
            while got < len(view):
                k = conn.recv_into(view[got:])
                if k == 0:
                    raise SessionError(f"the rank at {host}:{port} closed the connection "
                                       f"after {got} of {len(view)} bytes")
                got += k
    return tensors


class SessionError(Exception):
    """Something the user should read: what went wrong and what to do."""


def parse_ranks(spec, world):
    """'0', '0,2', '1-3', 'all' (or '[0, 2]', as the Jupyter magic writes it)
    -> sorted ranks; SessionError naming the bad part."""
    spec = spec.strip().strip("[]").strip()
    if spec in ("", "all", "*"):
        return list(range(world))
    ranks = set()
    for part in spec.replace(" ", "").split(","):
        try:
            if "-" in part[1:]:
                lo, hi = part.split("-", 1)
                ranks.update(range(int(lo), int(hi) + 1))
            else:
                ranks.add(int(part))
        except ValueError:
            raise SessionError(f"rank list '{spec}': '{part}' is not a rank or a range like 1-3")
    bad = sorted(r for r in ranks if not 0 <= r < world)
    if bad:
        raise SessionError(f"rank {bad[0]} is out of range: this session has ranks 0-{world - 1}")
    return sorted(ranks)


class JobThread(threading.Thread):
    """Runs jobs one after another; submit() returns an Event set when the
    job ends, whatever it raised (a job reports through its own state).
    stop() ends the thread after the jobs already submitted."""

    def __init__(self, name):
        super().__init__(name=name, daemon=True)
        self.jobs = queue.Queue()
        self.start()

    def submit(self, job):
        done = threading.Event()
        self.jobs.put((job, done))
        return done

    def stop(self):
        self.jobs.put(None)

    def run(self):
        while True:
            try:
                item = self.jobs.get()
                if item is None:
                    return
                job, done = item
                try:
                    job()
                finally:
                    done.set()
            except BaseException:  # noqa: BLE001 - a job's error, or an interrupt as it ended
                continue


class _Waiter(JobThread):
    """Blocks in store.wait on a connection of its own, so that the caller's
    thread stays free for Ctrl-C, streaming and liveness checks. A wait on a
    round's store that went away ends as if the keys had come."""

    def __init__(self, host, port):
        self.conn = dist.TCPStore(host, port, None, False, timedelta(days=30), False)
        super().__init__("dtrun-waiter")

    def wait(self, keys):
        return self.submit(lambda: self.conn.wait(keys))

    def run(self):
        super().run()
        self.conn = None


class Handle:
    """A non-blocking cell: its number in the attempt (and round) it was
    sent in, and its results once every rank has answered."""

    def __init__(self, name, n, ranks, code, attempt, round_):
        self.name, self.n, self.ranks, self.code = name, n, ranks, code
        self.attempt, self.round = attempt, round_
        self.started = time.monotonic()
        self.results = None
        self.lost = False  # the workers restarted before it finished


class Session:
    def __init__(self, host, port, world, launcher_pid=None, session_dir=None, rdzv_key=None):
        self.host, self.port, self.world = host, port, world
        self.launcher_pid = launcher_pid
        self.session_dir = session_dir  # dtrun's session folder, when on this host
        self.rdzv_key, self.rdzv, self.round = rdzv_key, None, None
        if rdzv_key:  # several nodes: host:port is the rendezvous store
            self.rdzv = dist.TCPStore(host, port, None, False, timedelta(days=30), False)
            self.rdzv.set_timeout(timedelta(seconds=1))  # wait_ready polls for the first round
            self.store = self.waiter = self.reader = None
        else:
            self.store = dist.TCPStore(host, port, None, False, timedelta(days=30), False)
            self.waiter = _Waiter(host, port)
            self.reader = Reader(host, port)
        self.next_cell = 0
        self.attempt = None
        self.workers = {}  # rank -> (host, pid) of the current attempt
        self.runners = {}  # rank -> how its cells run ("IPython 8.5.0", "exec")
        self.stream = False
        self.timeout = None  # seconds per cell, or None
        self.handles = {}  # name -> Handle of a non-blocking cell
        self.handle_count = 0
        self.timeline = collections.deque(maxlen=TIMELINE_CELLS)
        self.cells_run = 0  # over the whole session, for the timeline

    # -- rounds (several nodes) -------------------------------------------
    def _current_round(self):
        """(round, world, host, port) of the workers' store dtrun names now."""
        rnd, world, addr = protocol.parse_current_round(self.rdzv.get(self.rdzv_key).decode())
        host, port = addr.rsplit(":", 1)
        return rnd, world, host.strip("[]"), int(port)

    def _round_moved(self):
        return self.rdzv is not None and self._current_round()[0] != self.round

    def _follow_round(self):
        """Connects to the current round's store when the round changed."""
        rnd, world, host, port = self._current_round()
        if rnd == self.round:
            return
        store = dist.TCPStore(host, port, None, False, timedelta(days=30), False)
        waiter = _Waiter(host, port)
        if self.waiter is not None:
            self.waiter.stop()  # its thread ends after its last wait
        if self.reader is not None:
            self.reader.close()
        self.round, self.world, self.store, self.waiter = rnd, world, store, waiter
        self.reader = Reader(host, port)
        self.next_cell = 0

    # -- workers ---------------------------------------------------------
    def statuses(self, fresh=False, wait=1.0):
        """Each rank's status. fresh: idle ranks refresh theirs first (a busy
        rank's, updated when its cell passed 50 ms, is as fresh as it gets)."""
        if fresh:
            n = self.send("", list(range(self.world)), kind="status")
            deadline = time.monotonic() + wait
            while (self.store.add(status_answers_key(n), 0) < self.world
                   and time.monotonic() < deadline):
                time.sleep(0.005)
        out = {}
        for r in range(self.world):
            if self.store.add(has_status_key(r), 0) > 0:
                record = get_record(self.store, status_key(r))
                if record is not None:  # else not published again yet
                    out[r] = record
        return out

    def wait_ready(self, timeout=300.0, newer_than=None):
        """Until every rank serves cells (of an attempt after `newer_than`)."""
        deadline = time.monotonic() + timeout
        while True:
            if self._ready(newer_than):
                return
            if self.launcher_pid and not _alive(self.launcher_pid):
                raise SessionError("dtrun exited; its log says why")
            self._check_start_loop(newer_than)
            if time.monotonic() > deadline:
                raise SessionError(f"workers not ready after {timeout:.0f} s: "
                                   f"{self._count_ready()} of {self.world} answered")
            time.sleep(0.02)

    def _count_ready(self):
        try:
            return self.store.add(READY, 0) if self.store is not None else 0
        except RuntimeError:  # the round's store is gone: none of its ranks serve
            return 0

    def _ready(self, newer_than):
        if self.rdzv is not None:
            try:
                self._follow_round()
            except RuntimeError:  # the next round's store is not up yet
                return False
        try:
            if self.store.add(READY, 0) >= self.world:
                st = self.statuses()
                attempts = {s["attempt"] for s in st.values()}
                if len(st) == self.world and len(attempts) == 1 and (
                        newer_than is None or attempts.pop() > newer_than):
                    self.attempt = st[0]["attempt"]
                    self.workers = {r: (s["host"], s.get("addr"), s["pid"])
                                    for r, s in st.items()}
                    self.runners = {r: s.get("runner", "exec") for r, s in st.items()}
                    self.next_cell = 0
                    return True
        except RuntimeError:  # the round ended under us; the next one follows
            if self.rdzv is None:
                raise
        return False

    def _crash_store(self):
        """The store and key prefix where dtrun publishes worker crashes: the
        workers' store on one node, the rendezvous store across nodes."""
        if self.rdzv is not None:
            return self.rdzv, protocol.crash_prefix(protocol.run_id_of(self.rdzv_key))
        return self.store, protocol.crash_prefix()

    def last_crash(self):
        """The latest worker crash dtrun published (a dict: attempt, rank,
        how, host, addr, stderr_file, stderr_tail), or None."""
        store, prefix = self._crash_store()
        try:
            if store is None or store.add(prefix + protocol.CRASH_COUNT, 0) == 0:
                return None
            return get_record(store, prefix + protocol.CRASH)
        except RuntimeError:  # the round's store is gone; the next one tells
            return None

    def _check_start_loop(self, newer_than, limit=3):
        """Workers that die before they serve (an interpreter without torch, a
        broken environment) would be restarted by dtrun forever: after `limit`
        failed starts, stop and show what the last one said (dtrun publishes
        each crash in the store; see apps/dtrun/job.h)."""
        crash = self.last_crash()
        if crash is None:
            return
        started = crash["attempt"] + 1
        if started - (newer_than if newer_than is not None else -1) <= limit:
            return
        said = ""
        if crash.get("stderr_tail"):
            tail = crash["stderr_tail"].splitlines()[-8:]
            said = f"; the last one said ({crash['stderr_file']}):\n  " + "\n  ".join(tail)
        raise SessionError(f"the workers keep failing before they serve cells ({started} "
                           f"restarts){said}")

    def dead_ranks(self, ranks):
        """Ranks of this attempt whose worker (on this node) has exited. On
        other nodes a dead worker shows as the round moving on."""
        here = (socket.gethostname(), os.environ.get("DTRUN_NODE_ADDR"))
        return [r for r in ranks if r in self.workers and self.workers[r][:2] == here
                and not _alive(self.workers[r][2])]

    def restart(self):
        """New workers with fresh state: this attempt's workers are told
        through the store to exit (no pids: they may run anywhere), and
        dtrun restarts the group."""
        old = self.attempt
        self.handles_lost()
        self.store.add(restart_key(old), 1)
        self.send("", list(range(self.world)), kind="restart")
        self.wait_ready(newer_than=old)

    def shutdown(self):
        """Tells the workers to leave, and closes this client's connections
        (before the store goes away: Torch 1.13's client spins on a store
        that closed under it)."""
        try:
            self.store.set(cell_key(self.next_cell), json.dumps({"kind": "shutdown"}))
        except Exception:  # noqa: BLE001 - the store may be gone already
            pass
        if self.waiter is not None:
            self.waiter.stop()
            self.waiter.join(5)
        if self.reader is not None:
            self.reader.close()
        self.store = None

    # -- cells -----------------------------------------------------------
    def send(self, code, ranks, kind="cell", **extra):
        if self.handles:
            self.settle()
        n = self.next_cell
        self.next_cell += 1
        if kind == "cell" and self.timeout:
            extra["timeout"] = self.timeout  # the ranks time their cells themselves
        self.store.set(cell_key(n), json.dumps(
            {"kind": kind, "code": code, "ranks": ranks, "stream": self.stream, **extra}))
        return n

    # -- data and completion -------------------------------------------
    def push(self, values, ranks):
        """Sets the variables {name: value} on `ranks` (pickled; tensors keep
        their device, so push CPU tensors from a kernel without a GPU)."""
        n = self.next_cell
        chunks = put_chunks(self.store, lambda k: data_key(n, k), pickle.dumps(values, protocol=5))
        self.send("", ranks, kind="push", names=sorted(values), chunks=chunks)
        results = self.collect(n, ranks)
        _raise_first_error(results)

    def pull(self, names, rank):
        """{name: value} of `rank`'s variables, tensors moved to the CPU."""
        n = self.send("", [rank], kind="pull", names=list(names))
        res = self.collect(n, [rank])[rank]
        _raise_first_error({rank: res})
        blob = get_chunks(self.store, lambda k: data_key(n, k, rank), res["chunks"])
        tensors = (receive_tensors(res["host"], res["port"], res["tensors"])
                   if res.get("tensors") else [])
        return load_with_tensors(blob, tensors)

    def complete(self, text, rank=0, timeout=2.0):
        """Completions of `text` (a name or dotted attribute) in `rank`'s
        namespace, computed there; [] if the rank does not answer in time."""
        n = self.send("", [rank], kind="complete", text=text)
        if not self.waiter.wait([result_key(n, rank)]).wait(timeout):
            return []
        return json.loads(self.store.get(result_key(n, rank))).get("matches", [])

    def sync(self):
        """A barrier on every rank."""
        results = self.run("dist.barrier()", list(range(self.world)))
        _raise_first_error(results)

    def run(self, code, ranks, on_stream=None):
        """Runs `code` on `ranks`; returns {rank: result} in rank order. A
        KeyboardInterrupt while waiting interrupts the cell on those ranks and
        still returns their results (marked interrupted). Ranks whose process
        died get {"died": True}; the group is then restarted by dtrun and
        this waits for it (results say so with "restarted")."""
        n = self.send(code, ranks)
        results = self.collect(n, ranks, on_stream)
        self.note_timeline(code, results)
        return results

    # -- non-blocking cells --------------------------------------------
    def start(self, code, ranks):
        """Sends a cell that runs while the caller goes on; returns its
        handle's name (see result())."""
        self.handle_count += 1
        name = f"c{self.handle_count}"
        n = self.send(code, ranks, noblock=True)
        self.handles[name] = Handle(name, n, list(ranks), code, self.attempt, self.round)
        return name

    def handle(self, name):
        h = self.handles.get(name)
        if h is None:
            known = ", ".join(self.handles) or "none"
            raise SessionError(f"no non-blocking cell named '{name}' (this session has: {known})")
        return h

    def busy_with(self, ranks):
        """Names of non-blocking cells still running on any of `ranks`."""
        self.settle()
        return [h.name for h in self.handles.values()
                if h.results is None and not h.lost and set(h.ranks) & set(ranks)]

    def settle(self):
        """Notes which non-blocking cells have finished (into the timeline;
        re-creating the process group if one was left blocked)."""
        for h in list(self.handles.values()):
            if h.results is not None or h.lost:
                continue
            if h.attempt != self.attempt or h.round != self.round:
                h.lost = True
                continue
            try:
                got = self.peek_results(h.n, h.ranks)
            except RuntimeError:  # the round's store went away: the next wait tells
                return
            if None not in got.values():
                self._finish(h, got)

    def peek_results(self, n, ranks):
        """{rank: result of cell n, or None while it has none}: one round trip."""
        return dict(zip(ranks, self.reader.peek([result_key(n, r) for r in ranks])))

    def _finish(self, h, results):
        h.results = results
        self.note_timeline(h.code, results, h.name)
        if any(res.get("abandoned") for res in results.values()):
            self.reset_process_group()

    def result(self, name, wait=False, on_stream=None):
        """What a non-blocking cell's ranks have sent so far: {rank: result},
        where a rank still running has {"running": seconds, "out", "err"} (its
        output so far). wait: until every rank has finished (Ctrl-C
        interrupts the cell on its ranks, as for a blocking cell)."""
        h = self.handle(name)
        if h.results is not None:
            return h.results
        if h.lost or h.attempt != self.attempt or h.round != self.round:
            h.lost = True
            raise SessionError(f"{name} is gone: the workers restarted since it started "
                               "(fresh state)")
        if wait:
            results = self.collect(h.n, h.ranks, on_stream)
            if any(res.get("died") or res.get("restarted") for res in results.values()):
                h.lost = True
                return results
            self._finish(h, results)
            return results
        if self.dead_ranks(h.ranks) or self._round_moved():
            return self.result(name, wait=True)  # the death path names who died
        return self._so_far(h)

    def _so_far(self, h):
        got = {}
        for r, res in self.peek_results(h.n, h.ranks).items():
            if res is None:
                before = self._unfinished_before(h, r)
                if before:
                    res = {"ok": True, "queued": before}
                else:
                    out, err = self._streamed(h.n, r)
                    res = {"running": time.monotonic() - h.started, "ok": True, "out": out,
                           "err": err}
            got[r] = res
        if not any("running" in res or "queued" in res for res in got.values()):
            self._finish(h, got)
        return got

    def _unfinished_before(self, h, rank):
        """The non-blocking cell sent before h that `rank` still runs, if any."""
        for other in self.handles.values():
            if (other.n < h.n and other.attempt == h.attempt and other.round == h.round
                    and rank in other.ranks and other.results is None and not other.lost
                    and self.reader.peek([result_key(other.n, rank)])[0] is None):
                return other.name
        return None

    def _streamed(self, n, rank):
        """A running cell's output so far on `rank`: (out, err)."""
        out, err = [], []
        count = self.store.add(stream_count_key(n, rank), 0)
        for record in self.reader.peek([stream_key(n, rank, k) for k in range(count)]):
            if record is not None:
                (out if record[0] == "out" else err).append(record[1])
        return "".join(out), "".join(err)

    # -- timeline --------------------------------------------------------
    def note_timeline(self, code, results, name=None):
        """Each rank's wall time of a finished cell (as the rank measured
        it), for %dist_timeline."""
        self.cells_run += 1
        walls = {r: res["wall"] for r, res in results.items() if "wall" in res}
        self.timeline.append({"cell": self.cells_run, "code": code, "ranks": walls,
                              "name": name})

    def collect(self, n, ranks, on_stream=None):
        keys = [result_key(n, r) for r in ranks]
        done = self.waiter.wait(keys)
        shown = {r: 0 for r in ranks}
        died = self._await_results(n, ranks, done, shown, on_stream)
        results = None
        try:
            if not died:
                results = self.peek_results(n, ranks)
        except RuntimeError:  # the round's store went away with its workers
            if self.rdzv is None:
                raise
            died = [None]
        if not died and None in results.values():
            # dtrun cleared the store after the results came, which it does
            # only to restart the group (a worker died meanwhile).
            died = self.dead_ranks(ranks) or [None]
        if died:
            return self._results_after_death(died, ranks)
        if on_stream:
            self._pump(n, ranks, shown, on_stream, final=results)
        if any(res.get("abandoned") for res in results.values()):
            self.reset_process_group()
        return results

    def _await_results(self, n, ranks, done, shown, on_stream):
        """Waits for cell n's results while streaming output, forwarding
        Ctrl-C and watching for dead workers. Returns the ranks here that
        died, [None] when the round moved because of a worker elsewhere."""
        interrupted = False
        died = []
        while not done.is_set():
            try:
                done.wait(0.1)
                if done.is_set():
                    break
                try:
                    if on_stream:
                        self._pump(n, ranks, shown, on_stream)
                except RuntimeError:
                    # The round's store closed under us: a worker on another
                    # node died and the round is ending (before it shows as
                    # moved on), its workers with it.
                    if self.rdzv is None:
                        raise
                    died = [None]
                died = died or self.dead_ranks(ranks)
                if not died and self._round_moved():
                    # A worker on another node died (or that node's dtrun
                    # restarted the round): the ranks here start afresh too.
                    died = [None]
                if died:
                    # dtrun stops and restarts the whole group (clearing the
                    # store): release the waiter and answer for the ranks here.
                    self._answer_for(n, ranks, {"died": True})
                    done.wait(5)
                    break
            except KeyboardInterrupt:
                if not interrupted:
                    interrupted = True
                    try:
                        self.store.add(interrupt_key(n), 1)
                        self._cancel_queued(n, ranks)
                    except RuntimeError:  # the round ends: the loop sees why
                        if self.rdzv is None:
                            raise
        return died

    def _answer_for(self, n, ranks, result):
        try:
            for r in ranks:
                self.store.set(result_key(n, r), json.dumps(result))
        except RuntimeError:  # that round's store is gone already
            pass

    def _cancel_queued(self, n, ranks):
        """Ctrl-C on a cell that waits behind a non-blocking one: its ranks
        that are still busy with that one skip it (they see the interrupt
        when they reach it) and the caller stops waiting for them now."""
        for name in self.busy_with(ranks):
            h = self.handles[name]
            if h.n >= n:  # sent after (or is) the interrupted cell
                continue
            busy = [r for r in set(h.ranks) & set(ranks)
                    if self.reader.peek([result_key(h.n, r)])[0] is None]
            self._answer_for(n, busy, {"ok": False, "interrupted": True, "cancelled": True,
                                       "behind": name})

    def _results_after_death(self, died, ranks):
        """Waits for the restarted group and answers for each rank of the
        cell, naming the dead rank, where and how, from the crash record
        dtrun published (on this node or another)."""
        elsewhere, attempt = died == [None], self.attempt
        self.handles_lost()
        self.wait_ready(newer_than=attempt)
        crash = self.last_crash()
        if crash is not None and crash["attempt"] != attempt:
            crash = None  # an older crash: this one was not published
        if elsewhere and crash is not None:
            died = [crash["rank"]]
        out = {}
        for r in ranks:
            res = {"died": r in died, "restarted": True, "elsewhere": elsewhere}
            if crash is not None and crash["rank"] == r:
                res["crash"] = dict(crash, nodes=self.rdzv is not None)
            out[r] = res
        return out

    def handles_lost(self):
        """The workers restart: non-blocking cells still running are lost."""
        for h in self.handles.values():
            if h.results is None:
                h.lost = True

    def reset_process_group(self):
        n = self.send("", list(range(self.world)), kind="reset_pg")
        self.waiter.wait([result_key(n, r) for r in range(self.world)]).wait()

    def _pump(self, n, ranks, shown, on_stream, final=None):
        for r in ranks:
            have = (final[r].get("streamed", 0) if final
                    else self.store.add(stream_count_key(n, r), 0))
            while shown[r] < have:
                record = get_record(self.store, stream_key(n, r, shown[r]))
                if record is None:  # the group restarts
                    break
                which, text = record
                on_stream(r, which, text)
                shown[r] += 1


def _raise_first_error(results):
    for r in sorted(results):
        res = results[r]
        if res.get("died") or res.get("restarted"):
            raise SessionError(f"rank {r}'s worker died; dtrun restarted the group (fresh state)")
        if not res.get("ok", True):
            why = (res.get("error") or ("interrupted" if res.get("interrupted") else "failed")).strip()
            raise SessionError(why if why.startswith(f"rank {r} ") else f"rank {r}: {why}")


def _alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


class LabelledLines:
    """Streamed output chunks -> whole lines labelled with their rank (a
    print() arrives as its text and its newline, in two chunks)."""

    def __init__(self, emit, show=None):
        self.emit, self.show = emit, show
        self.partial = {}

    def __call__(self, rank, which, text):
        if self.show is not None and rank != self.show:
            return
        text = self.partial.pop(rank, "") + text
        *whole, rest = text.split("\n")
        for line in whole:
            self.emit(f"[rank {rank}] {line}")
        if rest:
            self.partial[rank] = rest

    def flush(self):
        for rank in sorted(self.partial):
            self.emit(f"[rank {rank}] {self.partial[rank]}")
        self.partial.clear()


def spans(ranks):
    """[0, 1, 2, 5] -> '0-2,5'."""
    out, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        out.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ",".join(out)


def runner_line(statuses):
    """How the ranks run cells (from their statuses): through IPython, or
    plain exec when their Python has none."""
    by = {}
    for r, st in sorted(statuses.items()):
        by.setdefault(st.get("runner", "exec"), []).append(r)
    parts = []
    for runner, ranks in by.items():
        where = "every rank" if len(by) == 1 else f"rank(s) {spans(ranks)}"
        if runner == "exec":
            parts.append(f"exec on {where} (no IPython in the workers' Python: "
                         "no magics, !cmd or obj?)")
        else:
            parts.append(f"{runner} on {where} (magics, !cmd, obj?)")
    notes = sorted({st["runner_note"] for st in statuses.values() if st.get("runner_note")})
    return "cells run through " + "; ".join(parts) + "".join(f"; {n}" for n in notes)


def crash_lines(crash):
    """How a worker died, where, and the last lines it wrote to stderr."""
    where = crash["host"] + (f" ({crash['addr']})" if crash.get("addr") else "")
    restart = ("dtrun started a new round on every node" if crash.get("nodes")
               else "dtrun restarted the group")
    lines = [f"worker died on {where} ({crash['how']}); {restart}: every rank has fresh state"]
    tail = (crash.get("stderr_tail") or "").rstrip("\n").splitlines()[-8:]
    if tail:
        lines.append(f"its last stderr lines ({crash.get('stderr_file') or 'stderr'}):")
        lines.extend("  " + line for line in tail)
    return lines


def _duration(seconds):
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def format_timeline(timeline, last=10):
    """The last `last` cells, one line each: every rank's wall time (as the
    rank measured it), the slowest marked with '*' and its excess over the
    median of the others."""
    cells = list(timeline)[-last:]
    if not cells:
        return "no cells have run yet"
    ranks = sorted({r for c in cells for r in c["ranks"]})
    width = max(9, *(len(_duration(t)) + 1 for c in cells for t in c["ranks"].values()))
    head = f"{'cell':>5}  {'code':28}  " + "  ".join(f"{'rank ' + str(r):>{width}}"
                                                      for r in ranks) + "  slowest"
    lines = [head]
    for c in cells:
        first = next((line.strip() for line in c["code"].splitlines() if line.strip()), "")
        code = (f"[{c['name']}] " if c["name"] else "") + first
        code = code if len(code) <= 28 else code[:27] + "\u2026"
        times = c["ranks"]
        slow = max(times, key=times.get) if times else None
        cols = []
        for r in ranks:
            if r not in times:
                cols.append(f"{'-':>{width}}")
            else:
                mark = "*" if r == slow and len(times) > 1 else ""
                cols.append(f"{_duration(times[r]) + mark:>{width}}")
        note = ""
        if slow is not None and len(times) > 1:
            others = sorted(t for r, t in times.items() if r != slow)
            median = others[len(others) // 2]
            note = f"rank {slow}" + (f" (+{_duration(times[slow] - median)})" if median else "")
        lines.append(f"{c['cell']:>5}  {code:28}  " + "  ".join(cols) + f"  {note}")
    return "\n".join(lines)


def format_results(results, streamed=False, show=None):
    """Rank-labelled text of a cell's results, in rank order. show: only
    that rank's output (the others' errors still count)."""
    lines = []
    for r in sorted(results):
        res = results[r]
        if show is not None and r != show:
            res = {k: v for k, v in res.items() if k not in ("out", "err", "value", "displays")}
        label = f"[rank {r}] "
        if res.get("died") and res.get("crash"):
            lines.extend(label + line for line in crash_lines(res["crash"]))
            continue
        if res.get("died"):
            lines.append(f"{label}worker died; dtrun restarted the group: every rank has fresh state")
            continue
        if res.get("elsewhere"):
            lines.append(f"{label}restarted with fresh state (a worker died: dtrun started "
                         "a new round on every node)")
            continue
        if res.get("restarted"):
            lines.append(f"{label}restarted with fresh state (another rank's worker died)")
            continue
        if res.get("cancelled"):
            behind = f" behind {res['behind']}" if res.get("behind") else ""
            lines.append(f"{label}cancelled: it was waiting{behind}, which still runs there"
                         + (f" (%dist_result {res['behind']} --wait, then Ctrl-C, stops it)"
                            if behind else ""))
            continue
        text = "" if streamed else res.get("out", "") + res.get("err", "")
        if "running" in res:
            text += f"... still running ({res['running']:.1f} s so far)\n"
        if res.get("queued"):
            text += f"... waiting behind {res['queued']}\n"
        if res.get("value") is not None:
            text += res["value"] + "\n"
        for bundle in res.get("displays", ()):
            kinds = ", ".join(sorted(m for m in bundle if m != "text/plain"))
            text += f"{bundle.get('text/plain', '')} ({kinds}: shown in a notebook)\n"
        if res.get("error"):
            text += res["error"]
        if res.get("interrupted"):
            why = (f"timed out after {res['timed_out']:g} s" if res.get("timed_out")
                   else "interrupted")
            if res.get("abandoned"):
                why += ("; it was blocked in native code (a collective the other ranks "
                        "did not enter?): the process group was re-created on every rank, "
                        "variables are kept")
            text += f"{why}\n"
        for line in text.splitlines():
            lines.append(label + line)
    return "\n".join(lines)
