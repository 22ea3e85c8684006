"""The client side of an interactive dtrun session: what the console and the
Jupyter extension use to run cells on the workers.

Everything travels through the dtrun store, under the prefix "dtrun/i/":
  ready                  counter; each worker adds 1 once it serves cells
  status/<rank>          JSON {pid, host, attempt, busy, last_cell, rss_mb, ...}
  cell/<n>               JSON {kind: "cell"|"status"|"reset_pg"|"shutdown", code, ranks, stream}
  statusn/<n>            counter of ranks that refreshed their status for cell n
  result/<n>/<rank>      JSON {ok, out, err, value?, error?, interrupted?, abandoned?}
  interrupt/<n>          counter; the client adds 1 to interrupt cell n
  has_status/<rank>      counter; > 0 once status/<rank> exists (Torch 1.13's
                         Python store has no check())
  stream/<n>/<rank>/<k>  JSON [which, text]: output chunk k, with streaming on
  streamn/<n>/<rank>     counter of those chunks
Every worker reads every cell (cells are numbered from 0 in each attempt of
the worker group) and answers those that select its rank.
"""
import glob
import json
import os
import queue
import socket
import threading
import time
from datetime import timedelta

import torch.distributed as dist

PREFIX = "dtrun/i/"
READY = PREFIX + "ready"


def cell_key(n):
    return f"{PREFIX}cell/{n}"


def result_key(n, rank):
    return f"{PREFIX}result/{n}/{rank}"


def status_key(rank):
    return f"{PREFIX}status/{rank}"


def interrupt_key(n):
    return f"{PREFIX}interrupt/{n}"


def status_answers_key(n):
    return f"{PREFIX}statusn/{n}"


def has_status_key(rank):
    return f"{PREFIX}has_status/{rank}"


def stream_key(n, rank, k):
    return f"{PREFIX}stream/{n}/{rank}/{k}"


def stream_count_key(n, rank):
    return f"{PREFIX}streamn/{n}/{rank}"


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
            self.conn.wait(keys)
            done.set()
        self.conn = None


class Session:
    def __init__(self, host, port, world, launcher_pid=None, session_dir=None):
        self.host, self.port, self.world = host, port, world
        self.launcher_pid = launcher_pid
        self.session_dir = session_dir  # dtrun's session folder, when on this host
        self.store = dist.TCPStore(host, port, None, False, timedelta(days=30), False)
        self.waiter = _Waiter(host, port)
        self.next_cell = 0
        self.attempt = None
        self.workers = {}  # rank -> (host, pid) of the current attempt
        self.stream = False
        self.timeout = None  # seconds per cell, or None

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
                out[r] = json.loads(self.store.get(status_key(r)))
        return out

    def wait_ready(self, timeout=300.0, newer_than=None):
        """Until every rank serves cells (of an attempt after `newer_than`)."""
        deadline = time.monotonic() + timeout
        while True:
            if self.store.add(READY, 0) >= self.world:
                st = self.statuses()
                attempts = {s["attempt"] for s in st.values()}
                if len(st) == self.world and len(attempts) == 1 and (
                        newer_than is None or attempts.pop() > newer_than):
                    self.attempt = st[0]["attempt"]
                    self.workers = {r: (s["host"], s["pid"]) for r, s in st.items()}
                    self.next_cell = 0
                    return
            if self.launcher_pid and not _alive(self.launcher_pid):
                raise SessionError("dtrun exited; its log says why")
            self._check_start_loop(newer_than)
            if time.monotonic() > deadline:
                raise SessionError(f"workers not ready after {timeout:.0f} s: "
                                   f"{self.store.add(READY, 0)} of {self.world} answered")
            time.sleep(0.02)

    def _check_start_loop(self, newer_than, limit=3):
        """Workers that die before they serve (an interpreter without torch, a
        broken environment) would be restarted by dtrun forever: after `limit`
        failed starts, stop and show what the last one said."""
        if not self.session_dir:
            return
        attempts = glob.glob(os.path.join(self.session_dir, "logs", "*", "attempt_*"))
        started = max((int(a.rsplit("_", 1)[1]) for a in attempts), default=-1)
        if started - (newer_than if newer_than is not None else -1) <= limit:
            return
        logs = [p for p in glob.glob(os.path.join(self.session_dir, "logs", "*", "attempt_*", "*",
                                                  "stderr.log")) if os.path.getsize(p) > 0]
        said = ""
        if logs:
            newest = max(logs, key=os.path.getmtime)
            with open(newest, errors="replace") as f:
                tail = f.read().splitlines()[-8:]
            said = f"; the last one said ({newest}):\n  " + "\n  ".join(tail)
        raise SessionError(f"the workers keep failing before they serve cells ({started} "
                           f"restarts){said}")

    def dead_ranks(self, ranks):
        """Ranks of this attempt whose worker (on this host) has exited."""
        here = socket.gethostname()
        return [r for r in ranks if r in self.workers and self.workers[r][0] == here
                and not _alive(self.workers[r][1])]

    def restart(self):
        """New workers with fresh state: kill this attempt's workers; dtrun
        restarts the group."""
        here = socket.gethostname()
        if any(host != here for host, _ in self.workers.values()):
            raise SessionError("restart kills the workers by pid, and some run on other hosts")
        old = self.attempt
        for _, pid in self.workers.values():
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        self.wait_ready(newer_than=old)

    def shutdown(self):
        """Tells the workers to leave, and closes this client's connections
        (before the store goes away: Torch 1.13's client spins on a store
        that closed under it)."""
        try:
            self.store.set(cell_key(self.next_cell), json.dumps({"kind": "shutdown"}))
        except Exception:  # noqa: BLE001 - the store may be gone already
            pass
        self.waiter.requests.put(None)
        self.waiter.join(5)
        self.store = None

    # -- cells -----------------------------------------------------------
    def send(self, code, ranks, kind="cell"):
        n = self.next_cell
        self.next_cell += 1
        self.store.set(cell_key(n), json.dumps(
            {"kind": kind, "code": code, "ranks": ranks, "stream": self.stream}))
        return n

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
        started = time.monotonic()
        interrupted = timed_out = False
        shown = {r: 0 for r in ranks}
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
                if died:
                    # dtrun stops and restarts the whole group (clearing the
                    # store): release the waiter and answer for the ranks here.
                    for r in ranks:
                        self.store.set(result_key(n, r), json.dumps({"died": True}))
                    done.wait()
                    break
            except KeyboardInterrupt:
                interrupted = True
                self.store.add(interrupt_key(n), 1)
        if died:
            self.wait_ready(newer_than=self.attempt)
            return {r: {"died": r in died, "restarted": True} for r in ranks}
        results = {r: json.loads(self.store.get(result_key(n, r))) for r in ranks}
        if on_stream:
            self._pump(n, ranks, shown, on_stream, final=results)
        if timed_out:
            for res in results.values():
                res["timed_out"] = self.timeout
        if any(res.get("abandoned") for res in results.values()):
            self.reset_process_group()
        return results

    def reset_process_group(self):
        n = self.send("", list(range(self.world)), kind="reset_pg")
        self.waiter.wait([result_key(n, r) for r in range(self.world)]).wait()

    def _pump(self, n, ranks, shown, on_stream, final=None):
        for r in ranks:
            have = (final[r].get("streamed", 0) if final
                    else self.store.add(stream_count_key(n, r), 0))
            while shown[r] < have:
                which, text = json.loads(self.store.get(stream_key(n, r, shown[r])))
                on_stream(r, which, text)
                shown[r] += 1


def _alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def format_results(results, streamed=False):
    """Rank-labelled text of a cell's results, in rank order."""
    lines = []
    for r in sorted(results):
        res = results[r]
        label = f"[rank {r}] "
        if res.get("died"):
            lines.append(f"{label}worker died; dtrun restarted the group: every rank has fresh state")
            continue
        if res.get("restarted"):
            lines.append(f"{label}restarted with fresh state (another rank's worker died)")
            continue
        text = "" if streamed else res.get("out", "") + res.get("err", "")
        if res.get("value") is not None:
            text += res["value"] + "\n"
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
