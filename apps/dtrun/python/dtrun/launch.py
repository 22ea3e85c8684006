"""`python -m dtrun.launch ...`: torch.distributed.launch's rules on dtrun,
for the dist_train.sh scripts that still call the legacy launcher.

Its command line is torchrun's plus `--use-env` (`--use_env`). Without it,
each worker's script gets `--local-rank=N` before its own arguments
(`--local_rank=N` when the torch beside this Python is older than 2.0, as
that torch's launcher wrote it); with it, LOCAL_RANK alone, as under
torchrun. Workers run this Python unless --python or $PYTHON_EXEC says
otherwise."""
import sys

from dtrun._binary import exec_dtrun, find

# torchrun's and dtrun's flags that take no value: anything else that
# starts with "-" and has no "=" takes the next word.
SWITCHES = {
    "-m", "--module", "--no-python", "--no_python", "--run-path", "--run_path",
    "--standalone", "--use-env", "--use_env", "--virtual-local-rank",
    "--virtual_local_rank", "--interactive", "--no-console", "--no_console",
    "--json", "--label-ranks", "--label_ranks", "--help", "-h", "--version",
}
USE_ENV = ("--use-env", "--use_env")


def split(argv):
    """(launcher flags, the entrypoint and its arguments)."""
    i = 0
    while i < len(argv):
        word = argv[i]
        if not word.startswith("-") or word == "--":
            break
        i += 1 if word in SWITCHES or "=" in word else 2
    if i < len(argv) and argv[i] == "--":
        return argv[:i], argv[i + 1:]
    return argv[:i], argv[i:]


def local_rank_flag():
    try:
        from importlib.metadata import version
        major = int(version("torch").split(".")[0])
    except Exception:  # no torch here: the current spelling
        return "--local-rank"
    return "--local_rank" if major < 2 else "--local-rank"


def command(argv):
    flags, entry = split(argv)
    use_env = any(f in USE_ENV for f in flags)
    flags = [f for f in flags if f not in USE_ENV]
    if use_env or not entry:
        return flags + entry
    kind = "path"
    if "-m" in flags or "--module" in flags:
        kind = "module"
    elif "--no-python" in flags or "--no_python" in flags:
        kind = "exec"
    flags = [f for f in flags if f not in ("-m", "--module", "--no-python", "--no_python")]
    return flags + ["-m", "dtrun._with_local_rank", local_rank_flag(), kind] + entry


def main():
    exe = find("dtrun")
    if not exe:
        sys.exit("python -m dtrun.launch: cannot find the dtrun binary (install the "
                 "dtrun wheel, put dtrun on PATH or set $DTRUN)")
    exec_dtrun(exe, command(sys.argv[1:]))


if __name__ == "__main__":
    main()
