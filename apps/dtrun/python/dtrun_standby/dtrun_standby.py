"""dtrun's standby for Python workers (--standby-import): a process that has
already imported the modules the user named, and forks a worker when dtrun
asks, so a restarted worker skips the imports (torch alone takes seconds).

dtrun starts it as `python -u -c <import this; main()> DIR FD MODULES`, its
environment the workers' own less what differs per worker, with one end of
a SOCK_SEQPACKET socket pair at FD. The messages (JSON, one per packet: the
standby's "ready", dtrun's requests with the worker's stdout and stderr
attached, the standby's answers) are rendezvous/standby_protocol.h's.

Safe by construction: a fork copies one thread only, so the standby forks
only while it has one thread (counted in /proc/self/task) and while CUDA is
not initialised; otherwise it says why and dtrun starts workers cold. The
worker is forked twice (standby -> A -> worker, A exits at once), so it is
re-parented to dtrun (a child subreaper), which waits for it, signals its
process group and arms its death signal, as for a worker it execs itself.

In the worker, before the user's code: its own process group, dtrun as its
parent and PR_SET_PDEATHSIG, its descriptors, signal mask and CPUs, its
environment, the torch shim's stack handler, numpy's global seed drawn
anew (as a fresh interpreter would), PYTHONFAULTHANDLER and
PYTHONDONTWRITEBYTECODE applied, sys.argv and sys.path[0] as `python -u
SCRIPT` or `python -u -m MODULE` set them. Left as the standby had them:
the other variables read only when the interpreter starts (PYTHON*, LD_*,
OMP_*, ...: the standby refuses a worker whose differ) and the hash seed
of str keys.
"""
import builtins
import ctypes
import json
import os
import signal
import socket
import sys
import time

# The protocol's names, as rendezvous/standby_protocol.h spells them
# (tests/apps/standby_protocol_test.py checks that the two agree).
MAX_PACKET = 1 << 20
DESCRIPTORS = 2
SCRIPT_VARIABLE = "DTRUN_STANDBY_SCRIPT"
MODULE_VARIABLE = "DTRUN_STANDBY_MODULE"
READY, SECONDS, WHY = "ready", "seconds", "why"
ARGV, ENV, CPUS, PARENT = "argv", "env", "cpus", "parent"
PID, ERROR = "pid", "error"

_PR_SET_PDEATHSIG = 1
# Read once, when the interpreter (or a library imported here) starts: a
# worker whose values differ cannot come from this standby.
_START_ONLY = ("PYTHON", "LD_", "OMP_", "MKL_", "MALLOC_")


def _prctl_deathsig():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


# Start-only variables a worker can still set after the fork, as the
# interpreter would have at its start.
_EMULATED = ("PYTHONFAULTHANDLER", "PYTHONDONTWRITEBYTECODE")


def _start_only(env):
    return {k: v for k, v in env.items()
            if k.startswith(_START_ONLY) and k not in _EMULATED}


def _emulate_start(env):
    """What the interpreter makes of _EMULATED at its start (dtrun sets
    PYTHONFAULTHANDLER per worker with --hang-timeout)."""
    import faulthandler
    if env.get("PYTHONFAULTHANDLER"):
        faulthandler.enable(all_threads=True)
    elif faulthandler.is_enabled():
        faulthandler.disable()
    sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))


def _target(argv):
    """(module, name, args) of `python -u [-m] NAME ARGS`, or why not. (The
    interpreter is the standby's own: dtrun starts both with --python.)"""
    if len(argv) < 3 or argv[1] != "-u":
        return None, "the worker's command is not `python -u ...`"
    if argv[2] == "-m":
        if len(argv) < 4:
            return None, "-m without a module"
        return (True, argv[3], argv[4:]), None
    return (False, argv[2], argv[3:]), None


def _path0(module, name):
    # What `python -u SCRIPT` and `python -m` put first on sys.path.
    return os.getcwd() if module else os.path.dirname(os.path.realpath(name))


def _threads():
    return len(os.listdir("/proc/self/task"))


def _unsafe():
    """Why forking now would be unsafe, or None."""
    n = _threads()
    if n != 1:
        return "the standby runs %d threads after its imports (a module started them); " \
               "a fork copies only one" % n
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    initialized = getattr(cuda, "is_initialized", None)
    if initialized is not None and initialized():
        return "CUDA was initialised by the imports; a forked worker could not use it"
    return None


def _run_worker(target, env):
    """Becomes `python -u [-m] NAME ARGS` in this process: its exit (or its
    exception) ends the process as it would end that interpreter."""
    module, name, args = target
    os.environ.clear()
    os.environ.update(env)
    _emulate_start(env)
    shim = sys.modules.get("_dtrun_torch_shim")
    if shim is not None:
        shim._register_stack_dump()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
    sys.path[0] = _path0(module, name)
    try:
        if module:
            import runpy
            sys.argv = ["-m"] + list(args)
            runpy._run_module_as_main(name, alter_argv=True)
        else:
            _run_script(name, args)
    except (SystemExit, KeyboardInterrupt):
        raise  # the interpreter's own handling: the exit code, SIGINT
    except BaseException as e:  # noqa: B902 (printed as Python prints it)
        # Printed from the user's first frame on, as a fresh interpreter
        # would; then exit 1, atexit handlers run.
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
            tb = tb.tb_next
        sys.excepthook(type(e), e.with_traceback(tb), tb)
        sys.exit(1)
    sys.exit(0)


def _run_script(name, args):
    """Runs the file `name` as __main__, as `python -u NAME ARGS` does."""
    sys.argv = [name] + list(args)
    main = sys.modules["__main__"]
    main.__dict__.clear()
    main.__dict__.update(__name__="__main__", __file__=name, __builtins__=builtins,
                         __doc__=None, __package__=None, __spec__=None, __loader__=None,
                         __cached__=None)
    with open(name, "rb") as f:
        code = compile(f.read(), name, "exec")
    exec(code, main.__dict__)


class _BecomeWorker(BaseException):
    """Raised in the forked worker: unwinds the standby's loop, so the
    user's code runs with nothing of it on the stack below main()."""

    def __init__(self, req, fds, target):
        super().__init__()
        self.req, self.fds, self.target = req, fds, target


def _settle(req, fds):
    """In the forked worker: its process group, parent, death signal,
    descriptors, signal mask and CPUs."""
    os.setpgid(0, 0)
    parent = int(req[PARENT])
    # A exits right after the fork: the worker moves to dtrun (the subreaper)
    # within a moment; the death signal is armed only once dtrun is the parent.
    deadline = time.monotonic() + 5
    while os.getppid() != parent:
        if time.monotonic() > deadline:
            os._exit(127)
        time.sleep(0.0005)
    _prctl_deathsig()
    if os.getppid() != parent:
        os._exit(127)
    os.dup2(fds[0], 1)
    os.dup2(fds[1], 2)
    os.close(fds[0])
    os.close(fds[1])
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    if req.get(CPUS):
        os.sched_setaffinity(0, req[CPUS])


def _env(req):
    return dict(e.split("=", 1) for e in req.get(ENV, []) if "=" in e)


def _refusal(req, start_env):
    """(target, None) when the standby can fork `req`'s worker, else
    (None, why)."""
    target, why = _target(req.get(ARGV, []))
    if why is None:
        mine, theirs = _start_only(start_env), _start_only(_env(req))
        for k in sorted(set(mine) | set(theirs)):
            if mine.get(k) != theirs.get(k):
                why = "%s differs between the worker (%r) and the standby (%r)" % (
                    k, theirs.get(k), mine.get(k))
                break
    why = why or _unsafe()
    return (None, why) if why else (target, None)


def _fork(req, fds, start_env):
    """Forks the worker `req` asks for: (pid, None) here, or (None, why);
    in the worker itself it raises _BecomeWorker."""
    target, why = _refusal(req, start_env)
    if why:
        return None, why
    r, w = os.pipe()
    a = os.fork()
    if a == 0:  # A: forks the worker, tells its pid, exits
        os.close(r)
        try:
            b = os.fork()
        except OSError:
            os._exit(1)
        if b == 0:
            os.close(w)
            raise _BecomeWorker(req, fds, target)
        os.write(w, str(b).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        text = f.read()
    os.waitpid(a, 0)
    return (int(text), None) if text else (None, "the intermediate process could not fork")


def _serve(sock, start_env):
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(sock, MAX_PACKET, DESCRIPTORS)
        except OSError:
            return
        if not data:
            return  # dtrun closed its end: the job is over
        try:
            req = json.loads(data)
            if len(fds) != DESCRIPTORS:
                raise ValueError("the request carries %d descriptors, not %d" %
                                 (len(fds), DESCRIPTORS))
            pid, why = _fork(req, fds, start_env)
        except (ValueError, KeyError, TypeError, OSError) as e:
            pid, why = None, "bad request: %s" % e
        for fd in fds:
            os.close(fd)
        reply = {PID: pid} if pid else {ERROR: why}
        sock.send(json.dumps(reply).encode())


def main():
    here, fd, modules = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    sock = socket.socket(fileno=fd)
    _prctl_deathsig()
    # The worker's first path entry (its script's folder, or the current one
    # for -m), so the user's own modules can be named too; not this folder.
    if here in sys.path:
        sys.path.remove(here)
    script = os.environ.pop(SCRIPT_VARIABLE, "")
    module = os.environ.pop(MODULE_VARIABLE, "") == "1"
    sys.path.insert(0, _path0(module, script))
    start_env = dict(os.environ)
    began = time.monotonic()
    why = None
    for name in [m for m in modules.split(",") if m]:
        try:
            __import__(name)
        except BaseException as e:  # noqa: B902 (SystemExit from a module too)
            why = "importing %s failed: %s: %s" % (name, type(e).__name__, e)
            break
    why = why or _unsafe()
    if why:
        sock.send(json.dumps({READY: False, WHY: why}).encode())
        return
    import gc
    gc.freeze()  # the imports' objects stay shared with the workers' pages
    sock.send(json.dumps({READY: True, SECONDS: time.monotonic() - began}).encode())
    become = None
    try:
        _serve(sock, start_env)
    except _BecomeWorker as e:
        become = e  # outside the handler: the user's errors chain to nothing
    if become is None:
        return
    sock.close()
    try:
        _settle(become.req, become.fds)
    except BaseException:  # noqa: B902 (nothing of the user's ran yet)
        import traceback
        traceback.print_exc()
        os._exit(127)
    _run_worker(become.target, _env(become.req))
