"""Runs Debian's torchrun (torch 1.13.1) on Python 3.11.

torch 1.13's Std.from_str looks an int up by iterating the IntFlag Std; on
Python 3.11 iteration skips the composite members NONE and ALL, so the
default --redirects=0 parses to None and torchrun crashes at start. This shim
parses the same syntax with Std(int(v)) and then runs torch.distributed.run
unchanged. Used only to measure torchrun beside dtrun.
"""
import re
import sys

from torch.distributed.elastic.multiprocessing import api


def _from_str(cls, vm):
    if re.fullmatch(r"[0-3]", vm):
        return cls(int(vm))
    if re.fullmatch(r"(\d+:[0-3],)*\d+:[0-3]", vm):
        return {int(i): cls(int(v)) for i, v in (m.split(":") for m in vm.split(","))}
    raise ValueError(f"{vm} does not match 0-3 or LOCAL_RANK:0-3,...")


api.Std.from_str = classmethod(_from_str)

from torch.distributed.run import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
