"""A worker of `python -m dtrun.launch` without --use-env: runs the
entrypoint with `--local-rank=N` (or `--local_rank=N`) before its own
arguments, in this process (same pid, so dtrun's signals reach it).

Usage: python -m dtrun._with_local_rank FLAG path|module|exec TARGET [ARGS...]"""
import os
import runpy
import sys


def main():
    flag, kind, target, rest = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    argv = [target, f"{flag}={os.environ['LOCAL_RANK']}"] + rest
    if kind == "exec":
        os.execvp(target, argv)
    sys.argv = argv
    if kind == "module":
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
        runpy.run_path(target, run_name="__main__")


if __name__ == "__main__":
    main()
