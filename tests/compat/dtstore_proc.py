"""Stores for the Python compat tests: dtstore on a free loopback port
(started and stopped by pid, or one the caller already runs), and torch's own
TCPStore server in this process. Works with torch 1.13 and 2.x."""
import argparse
import os
import signal
import subprocess
from datetime import timedelta


def parse_args(dtstore_required=True):
    p = argparse.ArgumentParser()
    where = p.add_mutually_exclusive_group(required=dtstore_required)
    where.add_argument("--dtstore", help="path to the dtstore binary to start")
    where.add_argument("--dtstore-at", metavar="HOST:PORT",
                       help="a dtstore already running (run_in_torch2_root.py "
                            "starts one on the host)")
    args, rest = p.parse_known_args()
    return args, rest


def torch_major():
    import torch
    return int(torch.__version__.split(".")[0])


def tcp_store(host, port, world_size=None, is_master=False, timeout=5.0, **kw):
    """torch's TCPStore without libuv on 2.x: Debian's 2.6 is built without
    it, yet its constructor asks for it by default."""
    import torch.distributed as dist
    if torch_major() >= 2:
        kw.setdefault("use_libuv", False)
    return dist.TCPStore(host, port, world_size, is_master,
                         timedelta(seconds=timeout), **kw)


class Server:
    """A store server at host:port that hands out torch clients."""
    host = "127.0.0.1"
    port = 0

    def client(self, timeout=5.0, world_size=None):
        """A client whose ops time out after `timeout` seconds; it connects
        with 5 s at least (1.13 truncates a connect timeout to seconds)."""
        c = tcp_store(self.host, self.port, world_size, timeout=max(timeout, 5.0))
        c.set_timeout(timedelta(seconds=timeout))
        return c


class DtStore(Server):
    def __init__(self, binary, host="127.0.0.1"):
        self.proc = subprocess.Popen([binary, "--host", host, "--port", "0"],
                                     stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline().strip()
        if not line.startswith("listening on "):
            self.proc.kill()
            raise RuntimeError(f"dtstore did not start: {line!r}")
        self.host = host
        self.port = int(line.rsplit(":", 1)[1])

    @classmethod
    def from_args(cls, args):
        """Starts args.dtstore, or attaches to args.dtstore_at."""
        if args.dtstore:
            return cls(args.dtstore)
        self = cls.__new__(cls)
        self.proc = None
        host, port = args.dtstore_at.rsplit(":", 1)
        self.host, self.port = host, int(port)
        return self

    def stop(self):
        """SIGTERM by pid; returns dtstore's exit code (0 for one this object
        did not start: its starter checks that)."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise


class TorchServer(Server):
    """torch's own TCPStore server on a free port of `host`, in this
    process (its daemon thread), for comparing observations with dtstore."""

    def __init__(self, host="127.0.0.1"):
        self.host = host
        self.server = tcp_store(host, 0, None, is_master=True,
                                wait_for_workers=False)
        self.port = self.server.port

    def stop(self):
        self.server = None
        return 0
