"""Checkpoints in and out of Python: dtrun.checkpoint reads what train_cfg
wrote under the real dtrun (DDP; FSDP sharded and full; torch's archive
payload), every tensor of it, checksums verified, and a damaged step is
skipped for the one before; `python -m dtrun.checkpoint convert` writes a
torch.save file; and train_cfg starts from a state dict Python saved
(model.init_from), checkpointing it back bit for bit."""
import argparse
import collections
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import unittest
import warnings

p = argparse.ArgumentParser()
p.add_argument("--dtrun", required=True)
p.add_argument("--train-cfg", required=True)
ARGS, REST = p.parse_known_args()
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(ROOT, "apps", "dtrun", "python"))
CONFIGS = os.path.join(ROOT, "examples", "configs")
DONE = re.compile(r"params_sha256=([0-9a-f]{64})")

import torch  # noqa: E402

import dtrun.checkpoint as ck  # noqa: E402


def train(folder, *sets, config="digits_ddp.toml", nproc=2):
    cmd = [ARGS.dtrun, f"--nproc-per-node={nproc}", "--log-level=error", ARGS.train_cfg,
           os.path.join(CONFIGS, config), "--set", f'checkpoint.dir="{folder}"',
           "--set", "train.steps=60", "--set", "checkpoint.every=30", "--set",
           "train.eval_every=0"]
    for s in sets:
        cmd += ["--set", s]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    return p.returncode, p.stdout, p.stderr


def equal(a, b):
    return list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)


class CheckpointPython(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.runs = {}
        for name, config, sets in [
                ("ddp", "digits_ddp.toml", ()),
                ("ddp_torch", "digits_ddp.toml", ('checkpoint.payload="torch"',)),
                ("fsdp", "digits_fsdp.toml", ()),
                ("fsdp_full", "digits_fsdp.toml", ('checkpoint.format="full"',))]:
            folder = os.path.join(cls.tmp.name, name)
            rc, out, err = train(folder, *sets, config=config)
            assert rc == 0, err
            cls.runs[name] = (folder, DONE.search(out).group(1))

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_every_format_reads_as_the_trained_parameters(self):
        # DDP and FSDP train bitwise alike on digits: every format gives the
        # same state dict, and its parameters in the model's order hash to
        # the run's params_sha256.
        fsdp = ck.load_checkpoint(self.runs["fsdp"][0])
        self.assertEqual((fsdp["step"], fsdp["strategy"], fsdp["world_size"]), (60, "fsdp", 2))
        h = hashlib.sha256()
        for t in fsdp["model"].values():
            h.update(t.contiguous().numpy().tobytes())
        self.assertEqual(h.hexdigest(), self.runs["fsdp"][1])
        self.assertEqual(self.runs["fsdp"][1], self.runs["ddp"][1])
        ordered = collections.OrderedDict(sorted(fsdp["model"].items()))
        for name in ("ddp", "ddp_torch", "fsdp_full"):
            got = ck.load(self.runs[name][0])
            self.assertTrue(equal(collections.OrderedDict(sorted(got.items())), ordered), name)
        # Optimizer state comes too: SGD's momentum, per parameter.
        self.assertIn("0.weight.momentum_buffer", fsdp["optimizer"])
        self.assertEqual(fsdp["optimizer"]["0.weight.momentum_buffer"].shape,
                         fsdp["model"]["0.weight"].shape)
        ddp = ck.load_checkpoint(self.runs["ddp"][0])
        self.assertTrue(any(k.endswith(".momentum_buffer") for k in ddp["optimizer"]))

    def test_checksums_without_the_xxhash_module_go_through_libxxhash(self):
        # pip environments may lack the module: the system's library checks
        # the same blocks.
        with_module = ck.load(self.runs["fsdp"][0])
        saved, ck._xxh3 = ck._xxh3, None
        blocked = sys.modules.get("xxhash")
        sys.modules["xxhash"] = None  # import fails
        try:
            self.assertTrue(equal(ck.load(self.runs["fsdp"][0]), with_module))
            self.assertIn("_FuncPtr", repr(ck._xxh3.__closure__))  # ctypes
        finally:
            ck._xxh3 = saved
            if blocked is None:
                del sys.modules["xxhash"]
            else:
                sys.modules["xxhash"] = blocked

    def test_a_damaged_step_is_skipped_for_the_one_before(self):
        folder = self.runs["ddp"][0]
        path = os.path.join(folder, "ckpt_000000000060.dtck")
        with open(path, "rb") as f:
            data = bytearray(f.read())
        damaged = os.path.join(self.tmp.name, "damaged")
        os.makedirs(damaged)
        for name in os.listdir(folder):
            with open(os.path.join(folder, name), "rb") as f, \
                    open(os.path.join(damaged, name), "wb") as g:
                g.write(f.read())
        data[-100] ^= 0xFF
        with open(os.path.join(damaged, "ckpt_000000000060.dtck"), "wb") as f:
            f.write(data)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = ck.load_checkpoint(damaged)
        self.assertEqual(got["step"], 30)
        self.assertIn("checksum mismatch in payload bytes", str(caught[0].message))
        with self.assertRaisesRegex(ck.CheckpointError, "checksum mismatch in payload bytes"):
            ck.read_file(os.path.join(damaged, "ckpt_000000000060.dtck"))
        self.assertEqual(ck.read_file(os.path.join(damaged, "ckpt_000000000060.dtck"), verify=False)
                         ["step"].item(), 60)
        # A shard alone is not a checkpoint; the folder is.
        with self.assertRaisesRegex(ck.CheckpointError, "give the folder"):
            ck.load(os.path.join(self.runs["fsdp"][0], "ckpt_000000000060.shard_0.dtck"))

    def test_convert_writes_a_torch_save_file(self):
        out = os.path.join(self.tmp.name, "model.pt")
        env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "apps", "dtrun", "python"))
        p = subprocess.run([sys.executable, "-m", "dtrun.checkpoint", "convert",
                            self.runs["fsdp"][0], out], capture_output=True, text=True, env=env)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("tensors of step 60 (fsdp, 2 ranks)", p.stdout)
        self.assertTrue(equal(torch.load(out), ck.load(self.runs["fsdp"][0])))
        p = subprocess.run([sys.executable, "-m", "dtrun.checkpoint", "show",
                            self.runs["ddp"][0]], capture_output=True, text=True, env=env)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("step 60, ddp, saved by 2 ranks", p.stdout)
        self.assertIn("model  0.weight  float32  [128, 64]", p.stdout)
        p = subprocess.run([sys.executable, "-m", "dtrun.checkpoint", "show",
                            os.path.join(self.tmp.name, "nowhere")], capture_output=True,
                           text=True, env=env)
        self.assertEqual(p.returncode, 2)
        self.assertIn("nowhere: no such file or folder", p.stderr)
        with self.assertRaisesRegex(ck.CheckpointError, "no checkpoint"):
            ck.load(self.tmp.name)

    def test_train_cfg_starts_from_a_state_dict_python_saved(self):
        # Python's own weights (another seed than train_cfg's), saved as
        # PyTorch users do; with lr 0 one step leaves them as they came, and
        # the checkpoint gives them back bit for bit, under DDP and FSDP.
        torch.manual_seed(7)
        model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                    torch.nn.Linear(128, 64), torch.nn.ReLU(),
                                    torch.nn.Linear(64, 10))
        want = collections.OrderedDict(sorted(model.state_dict().items()))
        saved = os.path.join(self.tmp.name, "python.pt")
        torch.save(model.state_dict(), saved)
        # libtorch's reader takes no OrderedDict: said, with the fix.
        rc, out, err = train(os.path.join(self.tmp.name, "od"), f'model.init_from="{saved}"')
        self.assertNotEqual(rc, 0)
        self.assertIn("holds an OrderedDict", err)
        self.assertIn(f"python -m dtrun.checkpoint import {saved} OUT.dtck", err)
        # The fix: imported into a .dtck file (nanoGPT's ckpt.pt: --key
        # model --strip-prefix _orig_mod.), or a plain dict saved.
        nested = os.path.join(self.tmp.name, "nested.pt")
        torch.save({"model": {"_orig_mod." + k: v for k, v in model.state_dict().items()},
                    "iter_num": 3}, nested)
        imported = os.path.join(self.tmp.name, "python.dtck")
        env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "apps", "dtrun", "python"))
        p = subprocess.run([sys.executable, "-m", "dtrun.checkpoint", "import", nested, imported,
                            "--key", "model", "--strip-prefix", "_orig_mod."],
                           capture_output=True, text=True, env=env)
        self.assertEqual(p.returncode, 0, p.stderr)
        plain = os.path.join(self.tmp.name, "plain.pt")
        torch.save(dict(model.state_dict()), plain)
        for path, config in ((imported, "digits_ddp.toml"), (imported, "digits_fsdp.toml"),
                             (plain, "digits_ddp.toml")):
            folder = os.path.join(self.tmp.name, f"from_{os.path.basename(path)}_{config}")
            rc, out, err = train(folder, f'model.init_from="{path}"', "optimizer.lr=0",
                                 "train.steps=1", config=config)
            self.assertEqual(rc, 0, err)
            got = collections.OrderedDict(sorted(ck.load(folder).items()))
            self.assertTrue(equal(got, want), (path, config))
        # A state dict of another model: named, not half loaded.
        other = os.path.join(self.tmp.name, "other.pt")
        torch.save(dict(torch.nn.Sequential(torch.nn.Linear(64, 32)).state_dict()), other)
        rc, out, err = train(os.path.join(self.tmp.name, "x"), f'model.init_from="{other}"')
        self.assertNotEqual(rc, 0)
        self.assertIn("'0.weight' is [32, 64], the model's is [128, 64]", err)
        rc, out, err = train(os.path.join(self.tmp.name, "y"),
                             f'model.init_from="{self.tmp.name}/none.pt"')
        self.assertEqual(rc, 2, err)
        self.assertIn("model.init_from", err)
        self.assertIn("cannot be read (No such file or directory)", err)

if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]] + REST)
