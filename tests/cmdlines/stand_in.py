"""Stand-in for a training script: records what torchrun's contract gave it.

Written to $CMDLINE_RECORD/<RANK>.json: its argv (without argv[0]), the
launcher's variables, and whether the store at MASTER_ADDR:MASTER_PORT
accepts a connection. Copied under each script and module name a corpus
line runs.
"""
import json
import os
import socket
import sys

KEYS = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
        "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE",
        "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
        "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE",
        "OMP_NUM_THREADS"]


def store_reachable(addr, port):
    try:
        with socket.create_connection((addr, int(port)), timeout=5):
            return True
    except (OSError, ValueError):
        return False


def main():
    env = {k: os.environ.get(k) for k in KEYS}
    record = {"argv": sys.argv[1:], "env": env,
              "store": store_reachable(env["MASTER_ADDR"], env["MASTER_PORT"])}
    print(f"stand-in rank {env['RANK']} of {env['WORLD_SIZE']}")
    path = os.path.join(os.environ["CMDLINE_RECORD"], f"{env['RANK']}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(record, f)
    os.rename(path + ".tmp", path)


if __name__ == "__main__":
    main()
