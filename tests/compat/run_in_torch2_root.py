"""Runs a compat test script under torch 2.6 in the trixie root
(scripts/torch2.sh run) against a dtstore started here, on the host: the
binary under test is the host build, the peer is the root's torch.

Usage (host python, no torch needed):
  run_in_torch2_root.py [--dtstore BINARY] SCRIPT [ARGS...]
With --dtstore, SCRIPT gets --dtstore-at 127.0.0.1:PORT. Exits with SCRIPT's
status, or 1 when dtstore did not stop cleanly. The root is required: a
missing one is a failure that says how to make it, never a skip."""
import os
import subprocess
import sys

from dtstore_proc import DtStore, parse_args

CHECKOUT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
# torch 2.6's root, or the one DTRUN_TORCH_PEER names (torch214: forky's 2.14).
PEER = os.environ.get("DTRUN_TORCH_PEER", "torch2")
TORCH2_SH = os.path.join(CHECKOUT, "scripts", f"{PEER}.sh")


def root_ready():
    root = subprocess.run([TORCH2_SH, "path"], capture_output=True, text=True,
                          check=True).stdout.strip()
    return root, os.path.exists(os.path.join(root, ".dtrun-packages"))


def main():
    args, rest = parse_args(dtstore_required=False)
    if not rest:
        sys.exit("usage: run_in_torch2_root.py [--dtstore BINARY] SCRIPT [ARGS...]")
    root, ready = root_ready()
    if not ready:
        print(f"compat2: no root at {root} ({PEER}); these tests need it. "
              f"Make it first (as root, a few minutes once): {TORCH2_SH}",
              file=sys.stderr)
        return 1
    server = DtStore(args.dtstore) if args.dtstore else None
    cmd = [TORCH2_SH, "run", "/usr/bin/python3", os.path.abspath(rest[0])]
    if server:
        cmd += ["--dtstore-at", f"{server.host}:{server.port}"]
    try:
        rc = subprocess.run(cmd + rest[1:]).returncode
    finally:
        server_rc = server.stop() if server else 0
    if server_rc != 0:
        print(f"compat2: dtstore exited {server_rc} on SIGTERM, expected 0",
              file=sys.stderr)
        return rc or 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
