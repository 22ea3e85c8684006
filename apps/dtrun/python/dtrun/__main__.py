"""`python -m dtrun ...`: the launcher, with torchrun's flags and rules, as
`python -m torch.distributed.run ...` is torchrun. The process becomes the
dtrun binary (same pid, so signals reach the launcher itself), and its
workers run this Python, as torchrun's run sys.executable."""
import sys

from dtrun._binary import exec_dtrun, find


def main():
    exe = find("dtrun")
    if not exe:
        sys.exit("python -m dtrun: cannot find the dtrun binary (install the dtrun "
                 "wheel, put dtrun on PATH or set $DTRUN)")
    exec_dtrun(exe, sys.argv[1:])


if __name__ == "__main__":
    main()
