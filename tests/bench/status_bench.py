"""What `dtrun --status` costs as a job grows: a dtstore holding the status
records of N nodes of 8 ranks each (the records every agent publishes once a
second), and `dtrun --status HOST:PORT --json` timed against it, alternating
the sizes, repeated; medians and spread. Also what the records cost the
store: one SET a second per node.
Usage: status_bench.py --dtrun PATH --dtstore PATH [--repeat N]"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))

p = argparse.ArgumentParser()
p.add_argument("--dtrun", required=True)
p.add_argument("--dtstore", required=True)
p.add_argument("--repeat", type=int, default=10)
ARGS = p.parse_args()


def node_record(run, group_rank, nodes, per_node=8):
    ranks = [{"rank": group_rank * per_node + lr, "local_rank": lr, "pid": 1000 + lr,
              "state": "running", "step": 1234, "beat_age_s": 0.1, "step_time_last_s": 0.01,
              "step_time_median_s": 0.01, "rss_mb": 1024.0, "cpu_pct": 99.0,
              "compute_typical_s": 0.008, "straggler_score": 1.0} for lr in range(per_node)]
    return json.dumps({"run_id": run, "host": f"node{group_rank}", "group_rank": group_rank,
                       "group_world_size": nodes, "attempt": 0, "restarts": 0,
                       "max_restarts": 3, "started_unix": time.time(),
                       "updated_unix": time.time(), "ranks": ranks})


def main():
    store = subprocess.Popen([ARGS.dtstore, "--host", "127.0.0.1", "--port", "0"],
                             stdout=subprocess.PIPE, text=True)
    port = int(store.stdout.readline().split(":")[-1])
    try:
        import torch.distributed as dist  # the store is filled with torch's client
        from datetime import timedelta
        client = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30))
        sizes = {64: 8, 512: 64}  # ranks: nodes of 8
        for ranks, nodes in sizes.items():
            run = f"bench{ranks}"
            client.set(f"dtrun/status/{run}/nodes", str(nodes))
            for g in range(nodes):
                client.set(f"dtrun/status/{run}/node/{g}", node_record(run, g, nodes))
        times = {r: [] for r in sizes}
        for _ in range(ARGS.repeat):
            for ranks in sizes:  # alternate the sizes
                client.set("dtrun/status/last_run", f"bench{ranks}")
                env = dict(os.environ, XDG_RUNTIME_DIR="/nonexistent")
                start = time.perf_counter()
                out = subprocess.run([ARGS.dtrun, "--status", f"127.0.0.1:{port}", "--json"],
                                     capture_output=True, text=True, env=env)
                times[ranks].append(time.perf_counter() - start)
                assert out.returncode == 0, out.stderr
                got = json.loads(out.stdout)
                assert sum(len(n["ranks"]) for n in got["nodes"]) == ranks
        print("| ranks (nodes of 8) | `dtrun --status HOST:PORT --json`, median (min-max) |")
        print("|---|---|")
        for ranks, nodes in sizes.items():
            t = times[ranks]
            print(f"| {ranks} ({nodes}) | {statistics.median(t) * 1000:.1f} ms "
                  f"({min(t) * 1000:.1f}-{max(t) * 1000:.1f}) |")
    finally:
        store.terminate()
        store.wait()


main()
