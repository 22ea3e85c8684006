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
import importlib.util
import io
import json
import os
import pickle
import queue
import socket
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


class _Waiter(threading.Thread):
    """Blocks in store.wait on a connection of its own, so that the caller's
    thread stays free for Ctrl-C, streaming and liveness checks."""

    def __init__(self, host, port):
        super().__init__(name="dtrun-waiter", daemon=True)
        self.conn = dist.TCPStore(host, port, None, False, timedelta(days=30), False)
        self.requests = queue.Queue()
        self.start()

    def wait(self, keys):
        done = threading.Event()
        self.requests.put((keys, done))
        return done

    def run(self):
        while True:
            request = self.requests.get()
            if request is None:
                break
            keys, done = request
            try:
                self.conn.wait(keys)
            except Exception:  # noqa: BLE001 - the round's store went away
                pass
            done.set()
        self.conn = None


class Session:
    def __init__(self, host, port, world, launcher_pid=None, session_dir=None, rdzv_key=None):
        self.host, self.port, self.world = host, port, world
        self.launcher_pid = launcher_pid
        self.session_dir = session_dir  # dtrun's session folder, when on this host
        self.rdzv_key, self.rdzv, self.round = rdzv_key, None, None
        if rdzv_key:  # several nodes: host:port is the rendezvous store
            self.rdzv = dist.TCPStore(host, port, None, False, timedelta(days=30), False)
            self.rdzv.set_timeout(timedelta(seconds=1))  # wait_ready polls for the first round
            self.store = self.waiter = None
        else:
            self.store = dist.TCPStore(host, port, None, False, timedelta(days=30), False)
            self.waiter = _Waiter(host, port)
        self.next_cell = 0
        self.attempt = None
        self.workers = {}  # rank -> (host, pid) of the current attempt
        self.stream = False
        self.timeout = None  # seconds per cell, or None

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
            self.waiter.requests.put(None)  # its thread ends with its next wait
        self.round, self.world, self.store, self.waiter = rnd, world, store, waiter
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
            self.waiter.requests.put(None)
            self.waiter.join(5)
        self.store = None

    # -- cells -----------------------------------------------------------
    def send(self, code, ranks, kind="cell", **extra):
        n = self.next_cell
        self.next_cell += 1
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
        return self.collect(n, ranks, on_stream)

    def collect(self, n, ranks, on_stream=None):
        keys = [result_key(n, r) for r in ranks]
        done = self.waiter.wait(keys)
        shown = {r: 0 for r in ranks}
        died, timed_out = self._await_results(n, ranks, done, shown, on_stream)
        results = None
        try:
            if not died:
                results = {r: get_record(self.store, result_key(n, r)) for r in ranks}
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
        if timed_out:
            for res in results.values():
                res["timed_out"] = self.timeout
        if any(res.get("abandoned") for res in results.values()):
            self.reset_process_group()
        return results

    def _await_results(self, n, ranks, done, shown, on_stream):
        """Waits for cell n's results while streaming output, applying the
        timeout, forwarding Ctrl-C and watching for dead workers. Returns
        (died, timed_out): died lists the ranks here that died, [None] when
        the round moved because of a worker elsewhere."""
        started = time.monotonic()
        interrupted = timed_out = False
        died = []
        while not done.is_set():
            try:
                done.wait(0.1)
                if done.is_set():
                    break
                if on_stream:
                    self._pump(n, ranks, shown, on_stream)
                if (self.timeout and not interrupted
                        and time.monotonic() - started > self.timeout):
                    timed_out = interrupted = True
                    self.store.add(interrupt_key(n), 1)
                died = self.dead_ranks(ranks)
                if not died and self._round_moved():
                    # A worker on another node died (or that node's dtrun
                    # restarted the round): the ranks here start afresh too.
                    died = [None]
                if died:
                    # dtrun stops and restarts the whole group (clearing the
                    # store): release the waiter and answer for the ranks here.
                    try:
                        for r in ranks:
                            self.store.set(result_key(n, r), json.dumps({"died": True}))
                    except RuntimeError:  # that round's store is gone already
                        pass
                    done.wait(5)
                    break
            except KeyboardInterrupt:
                interrupted = True
                self.store.add(interrupt_key(n), 1)
        return died, timed_out

    def _results_after_death(self, died, ranks):
        """Waits for the restarted group and answers for each rank of the
        cell, naming the dead rank where dtrun published it."""
        elsewhere, attempt = died == [None], self.attempt
        crash = None
        if elsewhere:  # which rank died, and where: dtrun published it
            crash = self.last_crash()
            if crash and crash["attempt"] == attempt:
                died = [crash["rank"]]
        self.wait_ready(newer_than=attempt)
        if elsewhere and died != [None]:
            return {r: {"died": r in died, "restarted": True, "elsewhere": True,
                        "crash": crash if r in died else None} for r in ranks}
        return {r: {"died": r in died, "restarted": True, "elsewhere": elsewhere}
                for r in ranks}

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
            c = res["crash"]
            where = c["host"] + (f" ({c['addr']})" if c.get("addr") else "")
            lines.append(f"{label}worker died on {where} ({c['how']}); dtrun started a new round "
                         "on every node: every rank has fresh state")
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
        text = "" if streamed else res.get("out", "") + res.get("err", "")
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
