"""Processes a benchmark started, found by pid: a launcher's tree, and the
orphans a launcher left (torchrun starts each worker in a session of its
own; a worker it lost is re-parented to init and still holds the pipes the
benchmark reads)."""
import os
import signal


def _table():
    """{pid: (ppid, argv)} of every process that can be read."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        out[int(name)] = (ppid, argv)
    return out


def tree(root):
    """`root` and its descendants, parents first."""
    children = {}
    for pid, (ppid, _) in _table().items():
        children.setdefault(ppid, []).append(pid)
    out, todo = [], [root]
    while todo:
        pid = todo.pop(0)
        out.append(pid)
        todo += children.get(pid, [])
    return out


def signal_all(pids, signo):
    for pid in pids:
        try:
            os.kill(pid, signo)
        except ProcessLookupError:
            pass


def kill_holding(arg):
    """SIGKILLs every process with `arg` (a path made for this run alone,
    such as its temporary folder) among its arguments."""
    mark = arg.encode()
    signal_all([pid for pid, (_, argv) in _table().items()
                if any(mark in a for a in argv) and pid != os.getpid()], signal.SIGKILL)
