"""Where the dtrun (or dtstore) binary is: $DTRUN, the scripts folder of
this interpreter (where pip puts the wheel's binaries, on PATH or not), PATH,
then a build tree next to this package's source checkout."""
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
