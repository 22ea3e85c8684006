"""How soon a lost node is declared dead: two dtrun nodes on loopback
(c10d rendezvous, or --backend etcd: a 3-member etcd on 127.0.0.2-4; one
fake worker each, dtrun's default keep-alive unless --rdzv-conf says
otherwise); the second node's dtrun is then
  - kill:  SIGKILLed (its worker dies with it): c10d: its store connection
           closes, which the store counts and pushes at once; etcd: its
           lease is no longer renewed and ends one TTL later;
  - stop:  SIGSTOPped, with its worker: c10d: its connection stays open
           and silent, so only the missed heartbeats tell; etcd: as kill.
Measured from the signal to the surviving node's "declared dead" line
(its log's own timestamp). The two faults take turns, repeated; medians
and spread.

Usage: detect_bench.py --dtrun PATH --fake-worker PATH [--repeat N]
                       [--rdzv-conf K=V,...] [--backend c10d|etcd]"""
import argparse
import datetime
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
from dtrun_proc import read_pids, wait_for  # noqa: E402
from etcd_cluster import EtcdCluster  # noqa: E402

DEAD = re.compile(r"^\[(\S+ \S+)\] \[warning\] \[dtrun.rdzv\] starting round 1: .*declared dead",
                  re.M)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def once(a, fault, etcd, run):
    with tempfile.TemporaryDirectory(prefix="dtrun-detect-") as d:
        conf = "last_call_timeout=0.5,join_timeout=30" + (f",{a.rdzv_conf}" if a.rdzv_conf else "")
        where = (["--rdzv-backend=etcd-v2", f"--rdzv-endpoint={etcd.endpoints()}"] if etcd else
                 ["--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}"])
        common = ["--nnodes=1:2", "--nproc-per-node=1", *where, f"--rdzv-id=detect{run}",
                  f"--log-dir={d}/logs",
                  f"--rdzv-conf={conf}", a.fake_worker, "--pid-dir", d, "--sleep-ms", "60000"]
        err = open(os.path.join(d, "host.err"), "w+")
        host = subprocess.Popen([a.dtrun, *common], stdout=subprocess.DEVNULL, stderr=err)
        time.sleep(0.2)
        victim = subprocess.Popen([a.dtrun, *common], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            if not wait_for(lambda: len(read_pids(d)) == 2, 30):
                sys.exit("the two nodes did not start")
            time.sleep(1)
            at = time.time()
            if fault == "kill":
                victim.kill()
            else:
                os.killpg(victim.pid, signal.SIGSTOP)  # its dtrun and worker
            log = lambda: open(err.name).read()
            if not wait_for(lambda: DEAD.search(log()), 60):
                sys.exit(f"{fault}: not declared dead within 60 s:\n{log()[-2000:]}")
            stamp = DEAD.search(log()).group(1)
            seen = datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S.%f").replace(
                tzinfo=datetime.datetime.now().astimezone().tzinfo).timestamp()
            return seen - at
        finally:
            for p in (victim, host):
                try:
                    os.killpg(victim.pid, signal.SIGKILL) if p is victim else p.kill()
                except ProcessLookupError:
                    pass
                p.wait()
            for pid in read_pids(d).values():  # workers, by pid
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dtrun", required=True)
    p.add_argument("--fake-worker", required=True)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--rdzv-conf", default="")
    p.add_argument("--backend", choices=("c10d", "etcd"), default="c10d")
    a = p.parse_args()
    etcd = EtcdCluster().start() if a.backend == "etcd" else None
    got = {"kill": [], "stop": []}
    try:
        for i in range(a.repeat):
            for fault in got:
                got[fault].append(once(a, fault, etcd, f"{os.getpid()}_{i}_{fault}"))
    finally:
        if etcd:
            etcd.close()
    print(f"backend {a.backend}, keep-alive: {a.rdzv_conf or 'the default (1 s x 3)'}")
    print("| fault of the second node | signal to \"declared dead\", median (min-max) |")
    print("|---|---|")
    for fault, xs in got.items():
        label = ("SIGKILL of its dtrun" if fault == "kill" else
                 "SIGSTOP of its dtrun and worker")
        print(f"| {label} | {statistics.median(xs) * 1000:.0f} ms "
              f"({min(xs) * 1000:.0f}-{max(xs) * 1000:.0f}) |")


main()
