"""A soak with mixed faults: three dtrun nodes of one train_cfg rank each, in
network namespaces (tests/netns/up.sh), on an etcd member in a fourth,
checkpoints in memory. For --minutes, one fault at a time, at random: a
worker SIGKILLed, a whole node SIGKILLed (its dtrun and worker; a new dtrun
starts there a second later), a node SIGSTOPped for 4 s, a node's switch
port down for 5 s. After each, the job must be back to three nodes within
60 s. Then the faults stop and the job runs to its end. At the end: every
process it started is gone, the surviving dtruns' descriptors did not grow,
no /dev/shm copy and no etcd key of the job is left, and the parameters
equal an undisturbed replay of the same schedule (each epoch's resume step
and world size, from the checkpoint folder's epochs file) on one host.
Prints the faults injected and survived, and the time each took to heal.
Exit 77 without root, ip or etcd. Usage:
  soak_bench.py --dtrun D --train-cfg T [--minutes 10] [--seed N]"""
import argparse
import glob
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from dtrun_proc import alive, wait_for  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--dtrun", required=True)
p.add_argument("--train-cfg", required=True)
p.add_argument("--minutes", type=float, default=10)
p.add_argument("--seed", type=int, default=0)
ARGS = p.parse_args()
ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
DIGITS = os.path.join(ROOT, "examples", "configs", "digits_ddp.toml")
CONF = "keep_alive_interval=0.5,keep_alive_max_attempt=4,last_call_timeout=1,join_timeout=120"
# The soak's pace with rank 0 slowed 12x, recoveries included (26 steps/s
# measured over 10 minutes): the job outlasts the faults.
STEPS_PER_S = 32
NODES = 3
DONE = re.compile(r"params_sha256=([0-9a-f]{64})")


def sets(steps, slow=True):
    s = [f"train.steps={steps}", "checkpoint.every=20", "train.eval_every=0",
         "train.log_every=1000", "fault.slow_rank=0"]
    return s + (["fault.slow_factor=12", 'checkpoint.mode="memory"',
                 "checkpoint.persist_every=5"] if slow else ["checkpoint.keep=100000"])


def children(pid):
    out = []
    for d in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(d) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                out.append(int(d.split("/")[2]))
        except (OSError, ValueError, IndexError):
            pass
    return out


def epochs(folder):
    """The folder's epochs file: [(epoch, resumed_from, world_size)]."""
    try:
        with open(os.path.join(folder, "epochs.dtck"), "rb") as f:
            text = f.read()[48:].decode()
    except OSError:
        return []
    return [tuple(int(v) for v in line.split()) for line in text.splitlines() if line]


class Soak:
    def __init__(self, work):
        self.work = work
        self.tag = "dts%d" % (os.getpid() % 10000)
        self.net = "10.203.%d" % (os.getpid() % 250)
        self.ckpt = os.path.join(work, "ckpt")
        self.procs = [None] * NODES   # the dtrun of each node now
        self.starts = [0] * NODES
        self.seen = set()             # every pid started: dtruns and workers
        self.steps = int(ARGS.minutes * 60 * STEPS_PER_S) + 600

    def up(self):
        subprocess.run(["bash", os.path.join(ROOT, "tests", "netns", "up.sh"), self.tag,
                        str(NODES + 1), self.net], check=True)
        a = f"{self.net}.{NODES + 1}"
        self.etcd = subprocess.Popen(
            ["ip", "netns", "exec", f"{self.tag}-h{NODES}", "etcd", "--name", "m0",
             "--data-dir", os.path.join(self.work, "etcd"), "--listen-client-urls",
             f"http://{a}:2379", "--advertise-client-urls", f"http://{a}:2379",
             "--listen-peer-urls", f"http://{a}:2380", "--initial-advertise-peer-urls",
             f"http://{a}:2380", "--initial-cluster", f"m0=http://{a}:2380",
             "--log-level", "error"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.endpoint = f"{a}:2379"
        if not wait_for(lambda: self.etcdctl("endpoint", "health").returncode == 0, 30, 0.3):
            raise SystemExit("etcd did not come up")

    def etcdctl(self, *args):
        return subprocess.run(["ip", "netns", "exec", f"{self.tag}-h0", "etcdctl",
                               f"--endpoints=http://{self.endpoint}"] + list(args),
                              capture_output=True, text=True)

    def start(self, i):
        self.starts[i] += 1
        name = os.path.join(self.work, f"node{i}_{self.starts[i]}")
        args = ["ip", "netns", "exec", f"{self.tag}-h{i}", ARGS.dtrun, "--nnodes=1:3",
                "--nproc-per-node=1", "--max-restarts=100000", "--rdzv-backend=etcd-v2",
                f"--rdzv-endpoint={self.endpoint}", "--rdzv-id=soak", f"--rdzv-conf={CONF}",
                f"--local-addr={self.net}.{i + 1}", ARGS.train_cfg, DIGITS,
                "--set", f'checkpoint.dir="{self.ckpt}"']
        for s in sets(self.steps):
            args += ["--set", s]
        with open(name + ".out", "w") as out, open(name + ".err", "w") as err:
            self.procs[i] = subprocess.Popen(args, stdout=out, stderr=err,
                                             env=dict(os.environ, GLOO_SOCKET_IFNAME="eth0"))
        self.seen.add(self.procs[i].pid)

    def node_pids(self, i):
        pids = [self.procs[i].pid] + children(self.procs[i].pid)
        self.seen.update(pids)
        return pids

    def healthy(self, since):
        """A round of three began training after `since` epochs, or the job
        ended (its exit codes are judged at the end)."""
        e = epochs(self.ckpt)
        return (len(e) > since and e[-1][2] == NODES) or self.ended()

    def ended(self):
        return all(proc.poll() is not None for proc in self.procs)

    def fault(self, kind, i):
        if kind == "worker":
            workers = children(self.procs[i].pid)
            self.seen.update(workers)
            for w in workers:
                os.kill(w, signal.SIGKILL)
        elif kind == "node":
            for pid in self.node_pids(i):
                os.kill(pid, signal.SIGKILL)
            self.procs[i].wait()
            time.sleep(1)
            self.start(i)
        elif kind == "sigstop":
            pids = self.node_pids(i)
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)
            time.sleep(4)
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
        elif kind == "partition":
            subprocess.run(["ip", "-n", f"{self.tag}-sw", "link", "set", f"p{i}", "down"],
                           check=True)
            time.sleep(5)
            subprocess.run(["ip", "-n", f"{self.tag}-sw", "link", "set", f"p{i}", "up"],
                           check=True)

    def fds(self):
        out = {}
        for i, proc in enumerate(self.procs):
            try:
                out[(i, proc.pid)] = len(os.listdir(f"/proc/{proc.pid}/fd"))
            except OSError:
                pass
        return out

    def run(self):
        rng = random.Random(ARGS.seed)
        shm_before = set(glob.glob("/dev/shm/dtrun-*"))
        for i in range(NODES):
            self.start(i)
            time.sleep(0.3)
        if not wait_for(lambda: self.healthy(0), 120):
            raise SystemExit("the job never formed a round of three")
        fds_first = self.fds()
        self.fd_samples = [sum(fds_first.values())]
        healed, failed = {}, []
        end = time.monotonic() + ARGS.minutes * 60
        while time.monotonic() < end and not self.ended():
            time.sleep(rng.uniform(2, 5))
            kind = rng.choice(["worker", "node", "sigstop", "partition"])
            i = rng.randrange(NODES)
            since = len(epochs(self.ckpt))
            at = time.monotonic()
            self.fault(kind, i)
            if wait_for(lambda: self.healthy(since), 60):
                if self.ended():
                    break  # the job reached its last step meanwhile
                healed.setdefault(kind, []).append(time.monotonic() - at)
                self.fd_samples.append(sum(self.fds().values()))
            else:
                failed.append(kind)
                break
        fds_last = self.fds()
        codes = [proc.wait(timeout=900) for proc in self.procs]
        return shm_before, fds_first, fds_last, healed, failed, codes

    def outputs(self):
        text = ""
        for path in sorted(glob.glob(os.path.join(self.work, "node*.out"))):
            with open(path) as f:
                text += f.read()
        return text

    def replay(self):
        """The same schedule, undisturbed, on one host: each epoch's world
        size from its resume step to the next epoch's."""
        ref = os.path.join(self.work, "ref")
        schedule = epochs(self.ckpt)
        sha = None
        for k, (_, start, world) in enumerate(schedule):
            stop = schedule[k + 1][1] if k + 1 < len(schedule) else None
            for f in glob.glob(os.path.join(ref, "ckpt_*.dtck")):
                if int(re.search(r"ckpt_(\d+)\.dtck$", f).group(1)) > start:
                    os.remove(f)
            if stop is not None and stop <= start:
                continue
            cmd = [ARGS.dtrun, f"--nproc-per-node={world}", ARGS.train_cfg, DIGITS,
                   "--set", f'checkpoint.dir="{ref}"']
            for s in sets(self.steps, slow=False) + (
                    [f"train.stop_after_step={stop}"] if stop is not None else []):
                cmd += ["--set", s]
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
            if p.returncode != 0:
                raise SystemExit("replay failed:\n" + p.stderr[-2000:])
            m = DONE.search(p.stdout)
            sha = m.group(1) if m else sha
        return sha, len(schedule)

    def down(self):
        for proc in self.procs:
            if proc and proc.poll() is None:
                proc.kill()
        for pid in self.seen:
            if alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        if hasattr(self, "etcd"):
            self.etcd.kill()
            self.etcd.wait()
        subprocess.run(["bash", os.path.join(ROOT, "tests", "netns", "down.sh"), self.tag])


def main():
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("etcd"):
        print("SKIP: the soak needs root, iproute2 and etcd")
        return 77
    work = tempfile.mkdtemp(prefix="dtrun-soak-")
    soak = Soak(work)
    problems = []
    try:
        soak.up()
        shm_before, fds_first, fds_last, healed, failed, codes = soak.run()
        keys = soak.etcdctl("get", "--prefix", "/dtrun/", "--keys-only").stdout.split()
        out = soak.outputs()
        m = DONE.findall(out)
        want, epochs_n = soak.replay()
        leaked = sorted(pid for pid in soak.seen if alive(pid))
        # Only the copies of dtruns this soak started (tests beside it have
        # theirs).
        shm = sorted(s for s in set(glob.glob("/dev/shm/dtrun-*")) - shm_before
                     if int(s.split("-")[1]) in soak.seen)
        # A dtrun that lived through every fault holds no more descriptors
        # at the end than at the start, give or take its role in the round
        # (group rank 0 hosts the workers' store and its connections).
        grown = {k: (fds_first[k], v) for k, v in fds_last.items()
                 if k in fds_first and v > fds_first[k] + 2 * NODES + 2}
        total = sum(len(v) for v in healed.values())
        print(f"soak: {ARGS.minutes:g} min, seed {ARGS.seed}, {soak.steps} steps, "
              f"{epochs_n} epochs; faults injected {total + len(failed)}, survived {total}")
        for kind, times in sorted(healed.items()):
            print(f"  {kind:9s} {len(times):3d}  back to 3 nodes in median "
                  f"{statistics.median(times):.1f} s (min {min(times):.1f}, "
                  f"max {max(times):.1f})")
        print(f"  descriptors of the three dtruns after each heal: {soak.fd_samples}")
        print(f"  exit codes {codes}; processes left {leaked}; descriptors grown {grown}; "
              f"/dev/shm left {shm}; etcd keys left {len(keys)}")
        print(f"  params {m[-1] if m else None}\n  replay {want}")
        if failed:
            problems.append(f"not healed within 60 s after: {failed}")
        if any(codes):
            problems.append(f"exit codes {codes}")
        if leaked or shm or keys or grown:
            problems.append("left behind: processes, /dev/shm, etcd keys or descriptors")
        if not m or m[-1] != want:
            problems.append("the parameters differ from the undisturbed replay")
    finally:
        soak.down()
        if not problems:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"  logs kept in {work}")
    for pr in problems:
        print("FAIL: " + pr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
