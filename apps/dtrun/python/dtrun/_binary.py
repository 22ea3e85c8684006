"""Where the dtrun (or dtstore) binary is: $DTRUN, the scripts folder of
this interpreter (where pip puts the wheel's binaries, on PATH or not), PATH,
then a build tree next to this package's source checkout; and the
environment it runs in, which names this interpreter (torchrun runs its
workers on sys.executable; dtrun, a binary, is told it).
CALLER_PYTHON is apps/dtrun/python_choice.h's kCallerPython."""
import os
import shutil
import sys
import sysconfig


def find(name="dtrun"):
    if name == "dtrun" and os.environ.get("DTRUN"):
        return os.environ["DTRUN"]
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [os.path.join(sysconfig.get_path("scripts"), name),
                  os.path.join(os.path.dirname(sys.executable), name),
                  shutil.which(name),
                  # apps/dtrun/python/dtrun -> build/apps/<name>
                  os.path.join(here, "..", "..", "..", "..", "build", "apps", name)]
    for path in candidates:
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return os.path.abspath(path)
    return None


CALLER_PYTHON = "DTRUN_CALLER_PYTHON"


def environ(base=None):
    """`base` (os.environ) with this interpreter handed to dtrun: its
    workers, standby and sessions run it unless --python or $PYTHON_EXEC
    say otherwise."""
    env = dict(os.environ if base is None else base)
    if sys.executable:
        env[CALLER_PYTHON] = sys.executable
    return env


def exec_dtrun(exe, args):
    """Becomes dtrun (same pid, so signals reach the launcher itself)."""
    os.execve(exe, ["dtrun"] + list(args), environ())
