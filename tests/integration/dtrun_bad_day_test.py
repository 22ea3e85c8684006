"""The first screen of a dead job: a worker the kernel's OOM killer killed
in a memory cgroup of the test's own (named, with the cgroup's limit; the
same as a user without the kernel log's read access, who is told what could
not be checked), an NVIDIA Xid line the test writes to the kernel log
(quoted with its meaning), SIGSEGV in a native and in a Python worker (the
signal's meaning, the core, the Python stack), a dead worker's leftover
shared-memory segment removed, a SIGTERM that leaves a worker's child alive for its handler, and a log folder on a full tmpfs
(these need root: cgroups, /dev/kmsg, mounts; skipped without it); and two
nodes meant as one job that each form a world of one (different
--rdzv-id's on one store)."""
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

from dtrun_proc import alive, parse_args, run, start, wait_for

ARGS, REST = parse_args()
DTRUN, WORKER = ARGS.dtrun, ARGS.fake_worker
PY = "/usr/bin/python3"
ROOT = os.geteuid() == 0

# Touches 50 MB at a time until the kernel stops it; beats nothing.
HOG = """
import time
held = []
while True:
    held.append(bytearray(50 << 20))
    for i in range(0, len(held[-1]), 4096):
        held[-1][i] = 1
    time.sleep(0.02)
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def memory_cgroup(name, limit_bytes):
    """A memory cgroup of the test's own under this process's (v2 or v1),
    limited to `limit_bytes`; returns (folder, file to add a pid to)."""
    with open("/proc/self/cgroup") as f:
        lines = [l.rstrip("\n").split(":", 2) for l in f]
    v1 = [p for _, c, p in lines if "memory" in c.split(",")]
    if v1:
        base = "/sys/fs/cgroup/memory" + v1[0].rstrip("/")
        folder = os.path.join(base, name)
        os.mkdir(folder)
        with open(os.path.join(folder, "memory.limit_in_bytes"), "w") as f:
            f.write(str(limit_bytes))
        return folder, os.path.join(folder, "cgroup.procs")
    path = [p for h, c, p in lines if h == "0" and c == ""][0]
    folder = os.path.join("/sys/fs/cgroup" + path.rstrip("/"), name)
    os.mkdir(folder)
    with open(os.path.join(folder, "memory.max"), "w") as f:
        f.write(str(limit_bytes))
    return folder, os.path.join(folder, "cgroup.procs")


def remove_cgroup(folder):
    procs = os.path.join(folder, "cgroup.procs")
    if os.path.exists(procs):
        with open(procs) as f:
            for pid in f.read().split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
    for _ in range(100):
        try:
            os.rmdir(folder)
            return
        except OSError:
            time.sleep(0.05)


@unittest.skipUnless(ROOT, "needs root: memory cgroups, /dev/kmsg, mounts")
class FirstScreen(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name
        os.chmod(self.dir, 0o755)
        self.cgroups = []

    def tearDown(self):
        for c in self.cgroups:
            remove_cgroup(c)
        self.tmp.cleanup()

    def in_cgroup(self, limit_mb, args, user=None, timeout=120):
        """dtrun (and so its workers) in a memory cgroup of `limit_mb`."""
        folder, procs = memory_cgroup(f"dtrun-test-{os.getpid()}-{len(self.cgroups)}",
                                      limit_mb << 20)
        self.cgroups.append(folder)
        cmd = [DTRUN] + args
        if user:
            cmd = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups"] + cmd
        p = subprocess.run(["sh", "-c", 'echo $$ > "$0" && exec "$@"', procs] + cmd,
                           capture_output=True, text=True, timeout=timeout, cwd=self.dir)
        return p.returncode, p.stdout, p.stderr, folder

    def test_an_oom_kill_is_named_with_its_cgroup_and_restarts_stop(self):
        rc, _, err, folder = self.in_cgroup(300, [
            "--max-restarts=3", "--max-restarts-without-progress=1", PY, "-c", HOG])
        cgroup = folder.split("/sys/fs/cgroup", 1)[1].replace("/memory/", "/", 1)
        self.assertEqual(rc, 93, err)
        self.assertIn("failed: SIGKILL: killed by the kernel's OOM killer (memory cgroup "
                      + cgroup + ": limit 300 MB; anon-rss ", err)
        self.assertIn("cause     : killed by the kernel's OOM killer (memory cgroup "
                      + cgroup + ": limit 300 MB", err)
        self.assertIn("MB as dtrun saw it)", err)
        self.assertIn("the last root cause was killed by the kernel's OOM killer", err)

    def test_without_the_kernel_log_it_says_what_it_could_not_check(self):
        # `nobody` cannot read /dev/kmsg (dmesg_restrict, or its mode): the
        # cgroup's counter still tells an OOM kill from another SIGKILL.
        rc, _, err, _ = self.in_cgroup(300, [PY, "-c", HOG], user="65534")
        self.assertEqual(rc, 137, err)
        self.assertIn("cause     : killed by the kernel's OOM killer (memory cgroup ", err)
        rc, _, err, _ = self.in_cgroup(300, [WORKER, "--kill-self", "9"], user="65534")
        self.assertEqual(rc, 137, err)
        self.assertIn("cause     : not the kernel's OOM killer, by its memory cgroup's "
                      "counter (/dev/kmsg: ", err)

    def test_an_xid_in_the_kernel_log_is_quoted_with_its_meaning(self):
        xid = "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, GPU has fallen off the bus."
        worker = f"open('/dev/kmsg', 'w').write({xid!r} + '\\n'); raise SystemExit(3)"
        rc, _, err = run(DTRUN, [PY, "-c", worker])
        self.assertEqual(rc, 3, err)
        self.assertIn("gpu error : " + xid + " (Xid 79: the GPU has fallen off the bus", err)
        self.assertIn("the kernel logged a GPU error: " + xid, err)

    def test_a_segfault_is_said_plainly_native_and_python(self):
        rc, _, err = run(DTRUN, [WORKER, "--kill-self", str(int(signal.SIGSEGV))])
        self.assertEqual(rc, 128 + signal.SIGSEGV, err)
        self.assertIn("cause     : invalid memory access (a segmentation fault", err)
        self.assertIn("core", err.split("cause     : ", 1)[1].split("\n", 1)[0])
        script = os.path.join(self.dir, "crash.py")
        with open(script, "w") as f:  # a .py: a Python worker, as dtrun sees it
            f.write("import ctypes\ndef crash():\n    ctypes.string_at(0)\ncrash()\n")
        rc, _, err = run(DTRUN, ["--python", PY, script])
        self.assertEqual(rc, 128 + signal.SIGSEGV, err)
        self.assertIn("Fatal Python error: Segmentation fault", err)  # faulthandler
        self.assertIn('line 3 in crash', err)
        self.assertIn("cause     : invalid memory access", err)

    def test_a_dead_workers_collectives_segment_is_removed(self):
        # A rank 0 that dies while its peers open the shared memory of its
        # group's collectives leaves the segment's name; dtrun removes those
        # of the worker it reaped, and no one else's.
        script = os.path.join(self.dir, "segment.py")
        with open(script, "w") as f:
            f.write("import os\n"
                    "open(f'/dev/shm/dtrun-ddp-{os.getpid()}-1234', 'w').close()\n"
                    "os._exit(1)\n")
        other = f"/dev/shm/dtrun-ddp-{os.getpid()}-5678"
        open(other, "w").close()
        try:
            rc, _, err = run(DTRUN, ["--nproc-per-node=2", "--python", PY, script])
            self.assertEqual(rc, 1, err)
            pids = re.search(r"started 2 worker\(s\), pids (\d+),(\d+)", err)
            self.assertIsNotNone(pids, err)
            for pid in pids.groups():
                self.assertFalse(os.path.exists(f"/dev/shm/dtrun-ddp-{pid}-1234"), err)
            self.assertTrue(os.path.exists(other))
        finally:
            os.unlink(other)

    def test_sigterm_leaves_the_workers_child_to_its_handler(self):
        child_pid = os.path.join(self.dir, "child")
        worker = f"""
import os, signal, sys, time
child = os.fork()
if child == 0:
    while True:
        time.sleep(0.05)
open({child_pid!r}, "w").write(str(child))
def save(*_):
    time.sleep(0.5)
    gone = os.waitpid(child, os.WNOHANG) != (0, 0)
    print("child", "dead" if gone else "alive", "at the save", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, save)
while True:
    time.sleep(0.05)
"""
        p = subprocess.Popen([DTRUN, PY, "-c", worker], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, cwd=self.dir)
        self.assertTrue(wait_for(lambda: os.path.exists(child_pid) and
                                 os.path.getsize(child_pid) > 0, 30))
        time.sleep(0.2)
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=30)
        self.assertEqual(p.returncode, 128 + signal.SIGTERM, err)
        self.assertIn("child alive at the save", out)
        with open(child_pid) as f:
            child = int(f.read())
        self.assertTrue(wait_for(lambda: not alive(child), 10), "the child outlived the job")

    def test_a_workers_stdout_and_stderr_block_as_under_torchrun(self):
        # Only dtrun's ends of the pipes read without blocking: a worker that
        # writes faster than its lines are shown waits, rather than getting
        # EAGAIN (Python then drops what it buffered: lines lost mid-stream).
        worker = ("import fcntl, os, sys; sys.exit(sum(1 for fd in (1, 2) "
                  "if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_NONBLOCK))")
        p = subprocess.run([DTRUN, PY, "-c", worker], capture_output=True,
                           text=True, timeout=60, cwd=self.dir)
        self.assertEqual(p.returncode, 0, p.stderr)

    def test_a_full_log_folder_is_said_and_the_console_keeps_every_line(self):
        logs = os.path.join(self.dir, "logs")
        os.mkdir(logs)
        lines = 3000
        worker = f"for i in range({lines}): print('line', i, 'x' * 80)"
        script = ('mount -t tmpfs -o size=128k tmpfs "$1" && shift && exec "$@"')
        p = subprocess.run(["unshare", "-m", "sh", "-c", script, "sh", logs, DTRUN,
                            "--log-dir", logs, "--tee=3", PY, "-c", worker],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(sum(1 for l in p.stdout.splitlines() if l.endswith("x" * 80)), lines)
        said = [l for l in p.stderr.splitlines() if "cannot write the log file" in l]
        self.assertEqual(len(said), 1, p.stderr)
        self.assertIn("stdout.log: No space left on device", said[0])
        self.assertIn("dtrun: a worker log file was cut short: ", p.stderr)


class WorldsOfOne(unittest.TestCase):
    def test_two_run_ids_on_one_store_are_said_on_both_nodes(self):
        # A store of its own (dtstore), so neither job outlives its host.
        port = free_port()
        store = subprocess.Popen([os.path.join(os.path.dirname(DTRUN), "dtstore"),
                                  "--port", str(port)], stderr=subprocess.DEVNULL)
        common = ["--nnodes=1:2", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
                  "--rdzv-conf=is_host=0,last_call_timeout=2", WORKER, "--sleep-ms", "1000"]
        procs = [start(DTRUN, ["--rdzv-id=job-a"] + common),
                 start(DTRUN, ["--rdzv-id=job-b"] + common)]
        try:
            results = [p.communicate(timeout=120) for p in procs]
        finally:
            for p in procs + [store]:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        self.assertEqual([p.returncode for p in procs], [0, 0], results)
        errs = [r[1] for r in results]
        for me, other, err in (("job-a", "job-b", errs[0]), ("job-b", "job-a", errs[1])):
            self.assertIn("round 0: 1 of up to 2 node(s) (--nnodes=1:2) came within the "
                          "last call's 2", err)
            self.assertIn(f"another job, rdzv id '{other}', rendezvoused on this store", err)
            self.assertIn(f"while this one ('{me}') waited for nodes: if they are one job, "
                          "give every node the same --rdzv-id", err)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]] + REST)
