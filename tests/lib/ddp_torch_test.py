"""Our DDP against PyTorch's own, on a model of float64, bfloat16 and float32
layers: the same start (rank 0's parameters; every other rank starts
elsewhere, so each side's broadcast must carry every dtype) and the same
batch, split over 2 ranks under the real dtrun. ddp_equivalence --torch
writes ours (start.pt, ours.pt); this file, run again under dtrun as the
peer, trains torch.nn.parallel.DistributedDataParallel on it and compares
each gradient: float64 to 1e-12 and float32 to 1e-6 of its scale, bfloat16
within 2 units in the last place of its largest. Where torch's gloo carries
no bfloat16 (1.13: "Invalid scalar type"), its DDP cannot hold the bfloat16
layer: that layer is left out of its DDP (and compared in the torch 2
peers), which this says."""
import argparse
import os
import subprocess
import sys
import tempfile
import unittest

BOUND = {"torch.float64": 1e-12, "torch.float32": 1e-6, "torch.bfloat16": 1.0 / 128}


def load(torch, path):
    # libtorch's pickle_save tags its dict's types, which torch 2.6's
    # weights-only loader refuses; these files are the test's own.
    return torch.load(path, weights_only=False)


def peer(folder):
    """One rank of PyTorch's DDP on ddp_equivalence's model and batch."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    start = load(torch, os.path.join(folder, "start.pt"))
    torch.manual_seed(99 + rank)
    model = torch.nn.ModuleDict({"a": torch.nn.Linear(12, 9).double(),
                                 "b": torch.nn.Linear(9, 7).bfloat16(),
                                 "c": torch.nn.Linear(7, 3)})
    if rank == 0:
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(start[name])
    try:
        probe = torch.zeros(1, dtype=torch.bfloat16)
        dist.all_reduce(probe)
        ignored = []
    except RuntimeError:  # this torch's gloo: no bfloat16
        ignored = ["b.weight", "b.bias"]
        with torch.no_grad():  # then only its start is made the same
            for name in ignored:
                p = dict(model.named_parameters())[name]
                p.copy_(start[name])

    class Net(torch.nn.Module):
        def __init__(self, layers):
            super().__init__()
            self.layers = layers

        def forward(self, x):
            x = torch.tanh(self.layers["a"](x.double()))
            x = torch.tanh(self.layers["b"](x.bfloat16()))
            return self.layers["c"](x.float())

    net = Net(model)
    torch.nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
        net, ["layers." + n for n in ignored])
    ddp = torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=0.0005)
    rows = start["x"].shape[0] // world
    x = start["x"][rank * rows:(rank + 1) * rows]
    y = start["y"][rank * rows:(rank + 1) * rows]
    torch.nn.functional.mse_loss(ddp(x), y).backward()
    if rank == 0:
        torch.save({"ignored": ignored,
                    "grads": {n: p.grad for n, p in model.named_parameters()},
                    "params": {n: p.detach() for n, p in model.named_parameters()}},
                   os.path.join(folder, "torch.pt"))
    dist.destroy_process_group()


class DdpAgainstTorch(unittest.TestCase):
    def test_each_gradient_is_pytorchs(self):
        import torch
        # dtrun runs the .py with the python3 first on PATH: this one's
        env = dict(os.environ, PATH=os.path.dirname(sys.executable) + ":" + os.environ["PATH"])
        with tempfile.TemporaryDirectory() as folder:
            for cmd in ([ARGS.dtrun, "--nproc-per-node=2", ARGS.ddp_equivalence, "--torch", folder],
                        [ARGS.dtrun, "--nproc-per-node=2", os.path.abspath(__file__),
                         "--peer", folder]):
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
                self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            start = load(torch, os.path.join(folder, "start.pt"))
            ours = load(torch, os.path.join(folder, "ours.pt"))
            theirs = load(torch, os.path.join(folder, "torch.pt"))
        self.assertEqual(set(ours), set(theirs["grads"]))
        for name, p in theirs["params"].items():  # both broadcast rank 0's
            self.assertTrue(torch.equal(p, start[name]), name)
        compared = []
        for name, g in theirs["grads"].items():
            if name in theirs["ignored"]:
                continue
            self.assertEqual(ours[name].dtype, g.dtype, name)
            want = g.double()
            err = (ours[name].double() - want).abs().max().item() / max(want.abs().max().item(), 1e-12)
            self.assertLessEqual(err, BOUND[str(g.dtype)], f"{name} ({g.dtype})")
            compared.append(str(g.dtype))
        self.assertIn("torch.float64", compared)
        self.assertIn("torch.float32", compared)
        if theirs["ignored"]:
            print(f"torch {torch.__version__}'s gloo carries no bfloat16: its DDP left "
                  f"{theirs['ignored']} out; compared in the torch 2 peers")
        else:
            self.assertIn("torch.bfloat16", compared)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--peer":
        peer(sys.argv[2])
        sys.exit(0)
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtrun", required=True)
    ap.add_argument("--ddp-equivalence", required=True)
    ARGS, REST = ap.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + REST)
