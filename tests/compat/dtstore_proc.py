"""Starts dtstore on a free loopback port for a test and stops it by pid."""
import argparse
import os
import signal
import subprocess


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--dtstore", required=True, help="path to the dtstore binary")
    args, rest = p.parse_known_args()
    return args, rest


class DtStore:
    def __init__(self, binary, host="127.0.0.1"):
        self.proc = subprocess.Popen([binary, "--host", host, "--port", "0"],
                                     stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline().strip()
        if not line.startswith("listening on "):
            self.proc.kill()
            raise RuntimeError(f"dtstore did not start: {line!r}")
        self.host = host
        self.port = int(line.rsplit(":", 1)[1])

    def stop(self):
        """SIGTERM by pid; returns dtstore's exit code."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise
