"""Full, read-only and failing checkpoint folders, under the real dtrun: a
tmpfs of a size that holds one checkpoint file and a half, a read-only bind
mount, and a FUSE file system that fails writes or fsyncs with EIO on
demand (tests/helpers/failing_fs.py, python3-fusepy), as a dying disk does.
A write that cannot be made names the folder, the error and the newest
checkpoint that still loads, and that one does load; in memory mode a
persist that fails keeps the copy in memory, the run goes on, and at the
end dtrun keeps the copies in /dev/shm; the next dtrun on the node
persists them once the folder has room, and resumes from them. Needs root
(mounts)."""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

p = argparse.ArgumentParser()
p.add_argument("--dtrun", required=True)
p.add_argument("--train-cfg", required=True)
ARGS, REST = p.parse_known_args()
HERE = os.path.dirname(os.path.abspath(__file__))
FAILING_FS = os.path.join(HERE, "..", "helpers", "failing_fs.py")
CONFIGS = os.path.join(HERE, "..", "..", "examples", "configs")
DDP = os.path.join(CONFIGS, "digits_ddp.toml")
FSDP = os.path.join(CONFIGS, "digits_fsdp.toml")
DONE = re.compile(r"done: steps=(\d+) ")


def train(ckpt, *sets, config=DDP, restarts=0):
    cmd = [ARGS.dtrun, "--nproc-per-node=2", f"--max-restarts={restarts}", ARGS.train_cfg,
           config, "--set", f'checkpoint.dir="{ckpt}"', "--set", "train.eval_every=0"]
    for s in sets:
        cmd += ["--set", s]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout, p.stderr


def kept_copies():
    """/dev/shm checkpoint copies whose dtrun is gone (kept on purpose);
    copies of dtruns still running (tests beside this one) are theirs."""
    out = set()
    for path in glob.glob("/dev/shm/dtrun-*-ckpt-*"):
        pid = int(os.path.basename(path).split("-")[1])
        if not os.path.exists(f"/proc/{pid}"):
            out.add(path)
    return out


def checkpoints(folder):
    """The checkpoint files in `folder` (not its epochs record)."""
    return sorted(f for f in os.listdir(folder) if f.startswith("ckpt_"))


def file_size(config):
    with tempfile.TemporaryDirectory() as d:
        rc, _, err = train(d, "train.steps=5", "checkpoint.every=5", config=config)
        assert rc == 0, err
        return os.path.getsize(os.path.join(d, "ckpt_000000000005.dtck"))


class DiskFailure(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="dtrun-disk-test-")
        self.mounts = []

    def tearDown(self):
        for m in reversed(self.mounts):
            subprocess.run(["umount", m], check=False)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def small_tmpfs(self, name, size):
        path = os.path.join(self.tmp, name)
        os.makedirs(path)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path], check=True)
        self.mounts.append(path)
        return path

    def failing_fs(self, name):
        """A folder through failing_fs.py, and a function that sets how it
        fails ("ok", "eio-write", "eio-fsync")."""
        try:
            import fusepy  # noqa: F401
        except ImportError:
            self.skipTest("python3-fusepy is not installed")
        backing = os.path.join(self.tmp, name + "-backing")
        mount = os.path.join(self.tmp, name)
        control = os.path.join(self.tmp, name + ".control")
        os.makedirs(backing)
        os.makedirs(mount)
        with open(control, "w") as f:
            f.write("ok")
        proc = subprocess.Popen(["/usr/bin/python3", FAILING_FS, backing, mount, control])

        def unmount():
            subprocess.run(["umount", mount], check=False)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.addCleanup(unmount)
        end = time.monotonic() + 10
        while not os.path.ismount(mount) and time.monotonic() < end:
            time.sleep(0.05)
        self.assertTrue(os.path.ismount(mount), "failing_fs did not mount")

        def fail(mode):
            with open(control, "w") as f:
                f.write(mode)
        return mount, fail

    def test_eio_on_write_and_fsync_say_what_still_loads(self):
        for mode in ["sync", "async"]:
            for failure in ["eio-write", "eio-fsync"]:
                with self.subTest(mode=mode, failure=failure):
                    d, fail = self.failing_fs(f"{mode}-{failure}")
                    sets = ["checkpoint.every=5", f'checkpoint.mode="{mode}"']
                    rc, out, err = train(d, "train.steps=5", *sets)
                    self.assertEqual(rc, 0, err)
                    fail(failure)
                    rc, out, err = train(d, "train.steps=20", *sets)
                    self.assertNotEqual(rc, 0, out)
                    self.assertIn("resumed from", out, err)
                    self.assertIn("checkpoint at step 10 not saved:", err)
                    self.assertIn("Input/output error", err)
                    self.assertIn(f"The newest checkpoint in {d} is step 5 (it still loads)", err)
                    fail("ok")
                    self.assertEqual(checkpoints(d), ["ckpt_000000000005.dtck"])
                    self.assert_loads(d, 5)

    def test_memory_copies_kept_through_eio_until_a_persist_succeeds(self):
        d, fail = self.failing_fs("eio-memory")
        sets = ["checkpoint.every=5", 'checkpoint.mode="memory"', "checkpoint.persist_every=2"]
        rc, out, err = train(d, "train.steps=10", *sets)
        self.assertEqual(rc, 0, err)
        before = kept_copies()
        fail("eio-fsync")
        # from 10: persists at 20 (fails: kept in memory, the run goes on)
        # and 30, the end (fails: dtrun keeps the copies)
        rc, out, err = train(d, "train.steps=30", *sets)
        self.assertNotEqual(rc, 0, out)
        self.assertRegex(err, r"checkpoint step 20 is in this node's memory but not on disk: "
                              r".*Input/output error")
        self.assertIn("checkpoint at step 30 not saved:", err)
        self.assertIn("kept in /dev/shm", err)
        kept = kept_copies() - before
        self.assertTrue(kept, err)
        # the disk answers again: the next dtrun persists step 30 and
        # resumes there
        fail("ok")
        rc, out, err = train(d, "train.steps=30", *sets)
        self.assertEqual(rc, 0, err)
        self.assertRegex(err, r"persisted \S*ckpt_000000000030\.dtck from the copy of dtrun \d+")
        self.assertIn("at step 30 ", out)
        self.assertFalse(kept & set(glob.glob("/dev/shm/dtrun-*-ckpt-*")))

    def assert_loads(self, folder, step, config=DDP):
        """A copy of `folder` resumes from `step`."""
        copy = os.path.join(self.tmp, f"copy-{len(os.listdir(self.tmp))}")
        shutil.copytree(folder, copy)
        rc, out, err = train(copy, f"train.steps={step}", config=config)
        self.assertEqual(rc, 0, err)
        self.assertIn(f"at step {step} ", out)

    def test_full_disk_sync_and_async_say_what_still_loads(self):
        size = file_size(DDP)
        for mode in ["sync", "async"]:
            with self.subTest(mode=mode):
                d = self.small_tmpfs(f"full-{mode}", int(size * 1.5))
                rc, out, err = train(d, "train.steps=20", "checkpoint.every=5",
                                     f'checkpoint.mode="{mode}"')
                self.assertNotEqual(rc, 0, out)
                self.assertIn("checkpoint at step 10 not saved:", err)
                self.assertIn("No space left on device", err)
                self.assertIn(f"The newest checkpoint in {d} is step 5 (it still loads)", err)
                # the worker's error file: dtrun's summary says it too
                self.assertIn("traceback : dtrun::train::Error: checkpoint at step 10 not saved",
                              err)
                self.assertEqual(checkpoints(d), ["ckpt_000000000005.dtck"])
                self.assert_loads(d, 5)

    def test_fsdp_shard_that_cannot_be_written_is_not_waited_for(self):
        size = file_size(FSDP)  # the step's file; each shard is about half
        d = self.small_tmpfs("full-fsdp", int(size * 1.6))
        rc, out, err = train(d, "train.steps=20", "checkpoint.every=5",
                             'checkpoint.mode="async"', config=FSDP)
        self.assertNotEqual(rc, 0, out)
        self.assertIn("not saved:", err)
        self.assertIn("No space left on device", err)

    def test_read_only_folder(self):
        d = os.path.join(self.tmp, "ro")
        rc, out, err = train(d, "train.steps=5", "checkpoint.every=5")
        self.assertEqual(rc, 0, err)
        subprocess.run(["mount", "--bind", d, d], check=True)
        self.mounts.append(d)
        subprocess.run(["mount", "-o", "remount,ro,bind", d], check=True)
        rc, out, err = train(d, "train.steps=20", "checkpoint.every=5")
        self.assertNotEqual(rc, 0, out)
        self.assertIn("resumed from", out, err)
        self.assertIn("checkpoint at step 10 not saved:", err)
        self.assertIn("Read-only file system", err)
        self.assertIn("is step 5 (it still loads)", err)

    def test_memory_copies_kept_until_a_persist_succeeds(self):
        size = file_size(DDP)
        d = self.small_tmpfs("full-memory", int(size * 1.5))
        before = kept_copies()
        # persisted at 10 (fits), 20 (full: kept in memory, the run goes
        # on) and 30, the end (full: the run fails, dtrun keeps the copies)
        sets = ["train.steps=30", "checkpoint.every=5", 'checkpoint.mode="memory"',
                "checkpoint.persist_every=2"]
        rc, out, err = train(d, *sets)
        self.assertNotEqual(rc, 0, out)
        self.assertRegex(err, r"checkpoint step 20 is in this node's memory but not on disk: "
                              r".*No space left on device")
        self.assertIn("checkpoint at step 30 not saved:", err)
        self.assertIn("kept in /dev/shm", err)
        kept = kept_copies() - before
        self.assertTrue(kept, err)
        self.assertEqual(checkpoints(d), ["ckpt_000000000010.dtck"])
        # room again: the next dtrun persists step 30 first and resumes there
        subprocess.run(["mount", "-o", f"remount,size={size * 4}", d], check=True)
        rc, out, err = train(d, *sets)
        self.assertEqual(rc, 0, err)
        self.assertRegex(err, r"persisted \S*ckpt_000000000030\.dtck from the copy of dtrun \d+")
        self.assertIn("at step 30 ", out)
        self.assertEqual(DONE.search(out).group(1), "30")
        self.assertFalse(kept & set(glob.glob("/dev/shm/dtrun-*-ckpt-*")))


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]] + REST, verbosity=2)
