"""One rank of an interactive dtrun session (`dtrun --interactive`).

Started by dtrun with torchrun's environment. Initialises torch.distributed
(gloo on CPU, NCCL on GPU), then runs cells that arrive through the dtrun
store, each in this rank's own namespace, and answers through the store.
Protocol: see session.py.
"""
import ast
import ctypes
import io
import json
import os
import socket
import sys
import threading
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

from dtrun import session as proto

RANK = int(os.environ["RANK"])
LOCAL_RANK = int(os.environ.get("LOCAL_RANK", "0"))
WORLD = int(os.environ["WORLD_SIZE"])
ATTEMPT = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


class _ThreadOutput(io.TextIOBase):
    """sys.stdout/err for every thread: a cell thread's writes go to its
    cell's buffer (and stream out), anything else to the real stream."""

    def __init__(self, real, which):
        self.real, self.which = real, which
        self.sinks = {}  # thread ident -> callable(which, text)

    def writable(self):
        return True

    def write(self, text):
        sink = self.sinks.get(threading.get_ident())
        if sink is None:
            return self.real.write(text)
        sink(self.which, text)
        return len(text)

    def flush(self):
        self.real.flush()


class Worker:
    def __init__(self):
        host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        forever = timedelta(days=30)
        # Two connections: one blocks waiting for the next cell, the other
        # answers and watches for interrupts while a cell runs.
        self.cells = dist.TCPStore(host, port, None, False, forever, False)
        self.store = dist.TCPStore(host, port, None, False, forever, False)
        self.backend = "nccl" if torch.cuda.is_available() else "gloo"
        if self.backend == "nccl":
            torch.cuda.set_device(LOCAL_RANK)
            self.device = torch.device("cuda", LOCAL_RANK)
        else:
            self.device = torch.device("cpu")
        dist.init_process_group(self.backend, init_method="env://")
        self.pg_generation = 0
        self.abandoned = []  # (thread, process group) of cells stuck in native code
        self.namespace = {
            "__name__": "__main__", "torch": torch, "dist": dist, "rank": RANK,
            "local_rank": LOCAL_RANK, "world_size": WORLD, "device": self.device,
        }
        self.stdout = _ThreadOutput(sys.stdout, "out")
        self.stderr = _ThreadOutput(sys.stderr, "err")
        sys.stdout, sys.stderr = self.stdout, self.stderr
        self.last_cell = None
        self.published = False
        self.published_at = 0.0

    def publish(self, busy):
        self.published_at = time.monotonic()
        status = {"pid": os.getpid(), "host": socket.gethostname(), "attempt": ATTEMPT,
                  "busy": busy, "last_cell": self.last_cell, "rss_mb": _rss_mb(),
                  "device": str(self.device), "backend": self.backend}
        self.store.set(proto.status_key(RANK), json.dumps(status))
        if not self.published:
            self.store.add(proto.has_status_key(RANK), 1)
            self.published = True

    def serve(self):
        self.publish(busy=False)
        self.store.add(proto.READY, 1)
        n = 0
        while True:
            self.cells.wait([proto.cell_key(n)])
            cell = json.loads(self.cells.get(proto.cell_key(n)))
            if cell.get("kind") == "shutdown":
                return
            if cell.get("kind") == "status":
                self.publish(busy=False)
                self.store.add(proto.status_answers_key(n), 1)
                n += 1
                continue
            if RANK in cell["ranks"]:
                if cell.get("kind") == "reset_pg":
                    result = self.reset_process_group()
                else:
                    result = self.run(n, cell)
                self.store.set(proto.result_key(n, RANK), json.dumps(result))
            n += 1

    def run(self, n, cell):
        self.last_cell = n
        out, err = [], []
        streamed = [0]
        stream = cell.get("stream", False)

        def sink(which, text):
            (out if which == "out" else err).append(text)
            if stream:
                self.store.set(proto.stream_key(n, RANK, streamed[0]), json.dumps([which, text]))
                streamed[0] += 1
                self.store.add(proto.stream_count_key(n, RANK), 1)

        result = {"ok": True}

        def body():
            self.stdout.sinks[threading.get_ident()] = sink
            self.stderr.sinks[threading.get_ident()] = sink
            try:
                value = _execute(cell["code"], self.namespace)
                if value is not None:
                    result["value"] = repr(value)
            except KeyboardInterrupt:
                result.update(ok=False, interrupted=True)
            except BaseException:  # noqa: BLE001 - the user's exception, shown to the user
                etype, evalue, tb = sys.exc_info()
                while tb is not None and tb.tb_frame.f_code.co_filename != "<cell>":
                    tb = tb.tb_next  # the user's frames only
                result.update(ok=False, error="".join(
                    traceback.format_exception(etype, evalue, tb)))

        thread = threading.Thread(target=body, name=f"cell-{n}", daemon=True)
        thread.start()
        interrupt = proto.interrupt_key(n)
        busy_published = False
        while thread.is_alive():
            thread.join(0.05)
            if not thread.is_alive():
                break
            if not busy_published:  # status updates cost round trips: only for long cells
                self.publish(busy=True)
                busy_published = True
            if self.store.add(interrupt, 0) > 0:
                self.interrupt(thread, result)
                break
        self.stdout.sinks.pop(thread.ident, None)
        self.stderr.sinks.pop(thread.ident, None)
        result["out"], result["err"] = "".join(out), "".join(err)
        result["streamed"] = streamed[0]
        if self.backend == "nccl":
            torch.cuda.empty_cache()  # give memory a cell freed back, as Ddip does
        if busy_published or time.monotonic() - self.published_at > 1.0:
            self.publish(busy=False)
        return result

    def interrupt(self, thread, result):
        # Python code: a KeyboardInterrupt raised in the cell's thread.
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident),
                                                   ctypes.py_object(KeyboardInterrupt))
        thread.join(1.0)
        if thread.is_alive():
            # Blocked in native code, e.g. a collective that other ranks never
            # entered: leave the thread behind (its process group is retired
            # and kept alive so nothing is torn down under it).
            self.abandoned.append((thread, dist.group.WORLD))
            result.update(ok=False, interrupted=True, abandoned=True)

    def reset_process_group(self):
        """A new default process group on every rank (after a cell was left
        blocked in a collective); the namespace stays."""
        self.pg_generation += 1
        retired = dist.group.WORLD
        self.abandoned.append((None, retired))
        dist.destroy_process_group()
        store = dist.PrefixStore(f"{proto.PREFIX}pg/{self.pg_generation}", self.store)
        dist.init_process_group(self.backend, store=store, rank=RANK, world_size=WORLD)
        return {"ok": True, "out": "", "err": ""}


def _execute(code, namespace):
    """Runs a cell; returns the value of a last bare expression (as the REPL
    shows it), else None."""
    tree = ast.parse(code, "<cell>", "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, "<cell>", "exec"), namespace)
    if last is not None:
        return eval(compile(last, "<cell>", "eval"), namespace)
    return None


def _rss_mb():
    try:
        with open("/proc/self/statm") as f:
            return round(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20, 1)
    except OSError:
        return None


def main():
    worker = Worker()
    try:
        worker.serve()
    finally:
        sys.stdout.flush()
    # Torch 1.13 can hang tearing down gloo at interpreter exit, and an
    # abandoned cell may still hold a collective: leave at once.
    os._exit(0)


if __name__ == "__main__":
    main()
