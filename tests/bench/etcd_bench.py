"""Rendezvous on etcd against the c10d store, and against torchrun 1.13's own
etcd-v2 backend (python3-etcd on etcd's v2 API, Debian's torchrun through
torchrun_shim.py) on the same 3-member etcd cluster (127.0.0.2-4, etcd's
default timings, --enable-v2 for torchrun), in one run, the sides
alternating. Nodes are agents on this machine, one fake worker each.

  round:      seconds from the last node's start until every node's worker
              runs
  node loss:  seconds from kill -9 of one node (its agent and worker) until
              the N-1 survivors' workers run again in a new round; default
              keep-alive everywhere (5 s x 3). On etcd the node killed is the
              one hosting the workers' store; on the c10d store a node that
              does not host the rendezvous store (its host is the job's single
              point of failure: see the last row).

  node loss, torch workers: the same with workers in a gloo group that
              all-reduce every 50 ms, so the launchers learn of the death from
              their failing workers (torchrun's agents watch no other node's
              heartbeat: with idle workers it never notices).

Usage: etcd_bench.py --dtrun PATH --fake-worker PATH [--nodes 2,8,64]
                     [--torch-nodes 2,8] [--reps 3] [--torchrun-max 64]
"""
import argparse
import glob
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SHIM = os.path.join(HERE, "torchrun_shim.py")
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
from etcd_cluster import EtcdCluster  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


LOOP = os.path.join(HERE, "allreduce_loop_worker.py")


def program(a, worker, torchrun=False):
    """The fake worker (`worker` its flags), or with worker None the torch
    all-reduce loop (torchrun runs it with its own interpreter)."""
    if worker is None:
        return ([] if torchrun else ["--python=/usr/bin/python3"]) + [LOOP]
    return ["--no_python" if torchrun else "--no-python", a.fake_worker] + worker


def dtrun_etcd(a, cluster, n, rid, worker):
    return [a.dtrun, f"--nnodes={n - 1}:{n}", "--nproc-per-node=1", "--max-restarts=3",
            "--rdzv-backend=etcd-v2", f"--rdzv-endpoint={cluster.endpoints()}",
            f"--rdzv-id={rid}", "--rdzv-conf=last_call_timeout=1"] + program(a, worker)


def dtrun_c10d(a, cluster, n, rid, worker, port):
    return [a.dtrun, f"--nnodes={n - 1}:{n}", "--nproc-per-node=1", "--max-restarts=3",
            "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
            f"--rdzv-id={rid}", "--rdzv-conf=last_call_timeout=1"] + program(a, worker)


def torchrun_etcd(a, cluster, n, rid, worker):
    return ["/usr/bin/python3", SHIM, f"--nnodes={n - 1}:{n}", "--nproc_per_node=1",
            "--max_restarts=3", "--rdzv_backend=etcd-v2",
            f"--rdzv_endpoint={cluster.endpoint(0)}", f"--rdzv_id={rid}",
            "--rdzv_conf=last_call_timeout=1,protocol=http",
            "--monitor_interval=0.1"] + program(a, worker, torchrun=True)


SIDES = {"dtrun etcd": dtrun_etcd, "dtrun c10d": dtrun_c10d,
         "torchrun 1.13 etcd-v2": torchrun_etcd}


def stamps(folder, restart_min):
    out = []
    for path in glob.glob(os.path.join(folder, "start_*_*")):
        if path.endswith(".tmp") or int(path.rsplit("_", 1)[1]) < restart_min:
            continue
        with open(path) as f:
            text = f.read()
        if text:  # a stamp being written is read on the next look
            out.append(int(text) / 1e9)
    return out


def agent_of_rank(folder, rank):
    """The agent (parent) of the worker of `rank` in the first attempt."""
    with open(os.path.join(folder, f"pid_{rank}_0")) as f:
        pid = int(f.read())
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def one_run(a, cluster, side, n, torch_workers=False, loss=True):
    """(round seconds, node-loss seconds or None) for one job of n nodes;
    without `loss`, only the round."""
    with tempfile.TemporaryDirectory() as d:
        rid = f"b{os.getpid()}_{time.monotonic_ns()}"
        worker = None if torch_workers else [
            "--stamp-dir", d, "--pid-dir", d, "--sleep-ms", "120000"]
        os.environ["STAMP_DIR"] = d
        port = free_port()
        procs = []
        for i in range(n):
            extra = [port] if side == "dtrun c10d" else []
            cmd = SIDES[side](a, cluster, n, rid, worker, *extra)
            if i == n - 1:
                last_start = time.time()
            procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL, start_new_session=True))
            if i == 0 and side == "dtrun c10d":
                time.sleep(0.2)  # the first one hosts the store
        try:
            deadline = time.time() + 300
            while len(stamps(d, 0)) < n and time.time() < deadline:
                time.sleep(0.05)
            if len(stamps(d, 0)) < n:
                raise RuntimeError(f"{side}: {len(stamps(d, 0))} of {n} workers started")
            round_s = max(stamps(d, 0)) - last_start
            if not loss:
                return round_s, None
            # etcd: the node whose workers' store the others use (rank 0);
            # c10d: the last rank, never the rendezvous store's host.
            rank = 0 if "etcd" in side else n - 1
            victim = agent_of_rank(d, rank)
            victim_proc = next((p for p in procs if p.pid == victim), None)
            killed = time.time()
            os.killpg(os.getpgid(victim), signal.SIGKILL)
            if victim_proc:
                victim_proc.wait()
            while time.time() < killed + 90:
                later = stamps(d, 1)
                if len(later) >= n - 1:
                    return round_s, max(later) - killed
                time.sleep(0.05)
            return round_s, None
        finally:
            for p in procs:
                if p.poll() is None:
                    try:
                        os.killpg(p.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    p.wait()


def c10d_host_loss(a, cluster, n):
    """What happens to the others when the c10d store's host is killed."""
    with tempfile.TemporaryDirectory() as d:
        worker = ["--stamp-dir", d, "--sleep-ms", "120000"]
        port = free_port()
        procs = []
        for i in range(n):
            procs.append(subprocess.Popen(
                dtrun_c10d(a, cluster, n, f"h{port}", worker, port),
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                start_new_session=True))
            if i == 0:
                time.sleep(0.2)
        deadline = time.time() + 60
        while len(stamps(d, 0)) < n and time.time() < deadline:
            time.sleep(0.05)
        killed = time.time()
        os.killpg(procs[0].pid, signal.SIGKILL)
        procs[0].wait()
        codes = []
        for p in procs[1:]:
            try:
                codes.append(p.wait(timeout=90))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                codes.append(None)
        return time.time() - killed, codes


def cell(samples):
    samples = [s for s in samples if s != "skip"]
    if not samples:
        return "not measured"
    got = [s for s in samples if s is not None]
    if not got:
        return "none within 90 s"
    med = statistics.median(got)
    miss = f", {len(samples) - len(got)} missed" if len(got) < len(samples) else ""
    return f"{med:.2f} s [{min(got):.2f}-{max(got):.2f}{miss}]"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dtrun", required=True)
    p.add_argument("--fake-worker", required=True)
    p.add_argument("--nodes", default="2,8,64")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--torch-nodes", default="2,8",
                   help="node counts of the node-loss rows with torch workers")
    p.add_argument("--torchrun-max", type=int, default=64,
                   help="largest node count torchrun runs at")
    a = p.parse_args()
    cluster = EtcdCluster(fast=False, enable_v2=True).start()
    try:
        sides = list(SIDES)
        print("| nodes | measure | " + " | ".join(sides) + " | dtrun etcd / c10d | "
              "torchrun etcd-v2 / dtrun etcd |")
        print("|---:|---|" + "---:|" * (len(sides) + 2))
        for n in [int(x) for x in a.nodes.split(",") if x]:
            rounds = {s: [] for s in sides}
            losses = {s: [] for s in sides}
            for rep in range(a.reps):
                for s in sides:
                    if s.startswith("torchrun") and n > a.torchrun_max:
                        continue
                    # torchrun's agents do not watch each other: with idle
                    # workers it never notices a dead node (checked once).
                    idle_loss = not s.startswith("torchrun") or (n == 2 and rep == 0)
                    try:
                        r, l = one_run(a, cluster, s, n, loss=idle_loss)
                        if not idle_loss:
                            l = "skip"
                    except RuntimeError as e:
                        print(f"<!-- {e} -->", flush=True)
                        r, l = None, None
                    rounds[s].append(r)
                    losses[s].append(l)
            for name, table in (("round", rounds), ("node loss -> new round", losses)):
                med = {s: statistics.median([x for x in v if x not in (None, "skip")])
                       if any(x not in (None, "skip") for x in v) else None
                       for s, v in table.items()}
                ratio = lambda x, y: f"{x / y:.2f}" if x and y else "-"
                print(f"| {n} | {name} | " + " | ".join(cell(table[s]) if table[s] else "not run"
                                                         for s in sides)
                      + f" | {ratio(med['dtrun etcd'], med['dtrun c10d'])} | "
                      f"{ratio(med['torchrun 1.13 etcd-v2'], med['dtrun etcd'])} |", flush=True)
        # Workers that all-reduce: a peer's death fails their next collective,
        # so every launcher learns of it from its own workers, as in training.
        for n in [int(x) for x in a.torch_nodes.split(",") if x]:
            losses = {s: [] for s in sides}
            for _ in range(a.reps):
                for s in sides:
                    try:
                        losses[s].append(one_run(a, cluster, s, n, torch_workers=True)[1])
                    except RuntimeError as e:
                        print(f"<!-- {e} -->", flush=True)
                        losses[s].append(None)
            med = {s: statistics.median([x for x in v if x is not None])
                   if any(x is not None for x in v) else None for s, v in losses.items()}
            ratio = lambda x, y: f"{x / y:.2f}" if x and y else "-"
            print(f"| {n} | node loss -> new round, torch gloo workers | "
                  + " | ".join(cell(losses[s]) for s in sides)
                  + f" | {ratio(med['dtrun etcd'], med['dtrun c10d'])} | "
                  f"{ratio(med['torchrun 1.13 etcd-v2'], med['dtrun etcd'])} |", flush=True)
        took, codes = c10d_host_loss(a, cluster, 2)
        print(f"\nc10d, the rendezvous store's host killed (2 nodes): the other node "
              f"exits {codes} after {took:.1f} s; on etcd the same kill is the "
              f"'node loss' row.")
    finally:
        cluster.close()


if __name__ == "__main__":
    sys.exit(main())
