"""train_cfg (lib) on torch 1.13 (the host's build/), 2.6 (build-torch2 in
the trixie root) and 2.14 (build-torch214 in the forky root): digits DDP and
FSDP, 2 ranks, 1000 steps, the three torches taking turns, 3 rounds;
samples/s is each run's median of its log lines after the first. The
builds are scripts/test.sh's (RelWithDebInfo). Prints a Markdown table.

Usage (as root, the roots and builds made): lib_torch_versions_bench.py"""
import os
import re
import statistics
import subprocess
import sys
import tempfile

M = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sides = {
  "1.13 (host)": [],
  "2.6 (trixie)": [f"{M}/scripts/torch2.sh", "run"],
  "2.14 (forky)": [f"{M}/scripts/torch214.sh", "run"],
}
builds = {"1.13 (host)": "build", "2.6 (trixie)": "build-torch2", "2.14 (forky)": "build-torch214"}
cfgs = {"DDP": "digits_ddp.toml", "FSDP": "digits_fsdp.toml"}
res = {(s, c): [] for s in sides for c in cfgs}
os.chdir(M)
for rnd in range(3):
    for c, cfg in cfgs.items():
        for s, pre in sides.items():
            b = builds[s]
            with tempfile.TemporaryDirectory(dir="/tmp") as d:
                cmd = pre + [f"{b}/apps/dtrun", "--nproc-per-node=2", f"{b}/examples/train_cfg",
                             f"examples/configs/{cfg}", "--set", "train.steps=1000",
                             "--set", "train.log_every=100", "--set", "train.eval_every=0",
                             "--set", f'checkpoint.dir="{d}"', "--set", "checkpoint.every=100000"]
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
                if p.returncode: sys.exit(p.stderr[-2000:])
                v = [float(x) for x in re.findall(r"samples/s (\d+)", p.stdout)][1:]
                res[(s, c)].append(statistics.median(v))
print("| strategy | torch | samples/s, median of 3 runs [lo-hi] | vs 1.13 |")
print("|---|---|---|---|")
for c in cfgs:
    base = statistics.median(res[("1.13 (host)", c)])
    for s in sides:
        v = res[(s, c)]
        print(f"| {c} | {s} | {statistics.median(v):.0f} [{min(v):.0f}-{max(v):.0f}] | {statistics.median(v)/base:.2f}x |")
