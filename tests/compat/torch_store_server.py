"""torch's own TCPStore server (without libuv) on a free loopback port, for
tests of other clients: prints "listening on HOST:PORT", then serves until
its stdin closes (so it never outlives the test that started it)."""
import sys

from dtstore_proc import TorchServer

if __name__ == "__main__":
    server = TorchServer()
    print(f"listening on {server.host}:{server.port}", flush=True)
    sys.stdin.read()
