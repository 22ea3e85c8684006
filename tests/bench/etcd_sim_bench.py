"""The rendezvous simulator (rdzv_sim_bench) against a real 3-member etcd
cluster on 127.0.0.2-4 with etcd's default timings, started and removed
here; prints the simulator's table.

Usage: etcd_sim_bench.py --sim build-bench/tests/bench/rdzv_sim_bench [sim flags]
"""
import argparse
import os
import resource
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
from etcd_cluster import EtcdCluster  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sim", required=True)
    args, rest = p.parse_known_args()
    # Each agent holds a connection, a watch stream and (leases on) a lease's
    # connection: the members need the descriptors as much as the simulator.
    # Root may raise the hard limit (16,384 agents hold ~50,000).
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    try:
        with open("/proc/sys/fs/nr_open") as f:
            most = min(int(f.read()), 262144)
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(hard, most), max(hard, most)))
    except (OSError, ValueError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    cluster = EtcdCluster(fast=False).start()
    try:
        pids = ",".join(str(proc.pid) for proc in cluster.procs)
        return subprocess.call([args.sim, "--etcd", cluster.endpoints(),
                                "--etcd-pids", pids, *rest])
    finally:
        cluster.close()


if __name__ == "__main__":
    sys.exit(main())
