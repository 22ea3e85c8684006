"""The open trainer (Train(config, TrainParts), train_cfg's parts built in)
against the closed one it replaced (Train(config) alone), on train_cfg's
configs: the same parameters' hash and samples/s, the two builds' train_cfg
taking turns under one dtrun, 2 ranks, one thread each.

    git worktree add ../closed <commit before the open trainer>
    cmake -S ../closed -B ../closed/build -G Ninja && ninja -C ../closed/build train_cfg
    python3 tests/bench/open_trainer_bench.py --closed ../closed/build --open build

Each figure is samples/s over the progress windows after the first (the
first warms up), median of --rounds (range)."""
import argparse
import os
import re
import statistics
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = os.path.join(HERE, "..", "..", "examples", "configs")
RUNS = {
    "digits DDP (MLP 64-128-64-10, 400 steps)": ("digits_ddp.toml", []),
    "digits FSDP (the same, sharded)": ("digits_fsdp.toml", []),
    "synthetic DDP (MLP 784-1024x3-10, 60 steps)": (
        "digits_ddp.toml", ['data.source="synthetic"', "data.features=784", "data.classes=10",
                            "data.samples=8192", "model.hidden=[1024, 1024, 1024]",
                            "train.batch_size=64", "train.steps=60", "train.log_every=20"]),
}


def run(dtrun, build, config, sets):
    cmd = [dtrun, "--nproc-per-node=2", "--log-level=error",
           os.path.join(build, "examples", "train_cfg"), os.path.join(CONFIGS, config),
           "--set", 'checkpoint.dir=""', "--set", "train.eval_every=0"]
    for s in sets:
        cmd += ["--set", s]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    rates = [float(r) for r in re.findall(r"samples/s (\d+)", out)]
    return statistics.mean(rates[1:]), re.search(r"params_sha256=([0-9a-f]{64})", out).group(1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--closed", required=True, help="a build of the closed trainer")
    p.add_argument("--open", required=True, help="a build of the open one")
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    dtrun = os.path.join(a.open, "apps", "dtrun")
    print("| run | closed samples/s | open samples/s | open / closed | same hash |")
    print("|---|---:|---:|---:|---|")
    for name, (config, sets) in RUNS.items():
        rates = {"closed": [], "open": []}
        hashes = {"closed": set(), "open": set()}
        for r in range(a.rounds):
            for side in (("closed", "open") if r % 2 == 0 else ("open", "closed")):
                rate, h = run(dtrun, getattr(a, side), config, sets)
                rates[side].append(rate)
                hashes[side].add(h)
        c, o = statistics.median(rates["closed"]), statistics.median(rates["open"])
        same = len(hashes["closed"] | hashes["open"]) == 1
        print(f"| {name} | {c:.0f} ({min(rates['closed']):.0f}-{max(rates['closed']):.0f}) "
              f"| {o:.0f} ({min(rates['open']):.0f}-{max(rates['open']):.0f}) | {o / c:.2f} "
              f"| {'yes' if same else 'NO'} |", flush=True)


if __name__ == "__main__":
    main()
