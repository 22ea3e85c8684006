"""dtrun's torch compatibility shim, put first on Python workers' PYTHONPATH.

Some torch 2.x builds (Debian's 2.6) have no libuv, yet `TCPStore()` asks
for it by default, clients included, so an env:// worker that joins the
launcher's store (`TORCHELASTIC_USE_AGENT_STORE=True`) dies at start with
"use_libuv was requested but PyTorch was build without libuv support".

What this does, and nothing more:
- Until `torch.distributed` is imported, only a finder that compares one
  module name sits on `sys.meta_path`; torch is never imported from here.
- Once it is imported, and only if its `TCPStore` takes `use_libuv`, the
  constructor is wrapped: a caller that did not pass `use_libuv` and got
  torch's "without libuv support" error is retried once with
  `use_libuv=False` (the same protocol on the wire). Any other outcome,
  an explicit `use_libuv`, torch 1.x, a torch with libuv, is untouched.
- Once it is imported, on torch older than 2.2 only, NCCL_ASYNC_ERROR_HANDLING
  (the only name those read) gets TORCH_NCCL_ASYNC_ERROR_HANDLING's value
  unless it is set: dtrun sets the new name alone, as torchrun >= 2.2 does,
  since newer torch warns about the old one.
- The `sitecustomize` this one shadows (Debian's /etc/python3.X, or one
  on the user's PYTHONPATH) still runs, as `sitecustomize`.
- DTRUN_TORCH_SHIM=0 turns the patch off.

And one thing for `dtrun --stacks`: when dtrun names a stack file and a
signal (DTRUN_STACK_FILE, DTRUN_STACK_SIGNAL), the interpreter's own
faulthandler is registered on that signal, to print every thread's stack to
the file and go on (faulthandler.register: no Python code runs in the
handler). A first line in the file tells dtrun the handler is there, so a
worker without it is never sent the signal.
"""
import os
import sys

_MARK = "_dtrun_torch_shim"
_USE_LIBUV_POSITION = 8  # host, port, world_size, is_master, timeout, wait, tenant, fd
_NO_LIBUV = "without libuv support"


def _wrap_tcpstore(dist):
    store = getattr(dist, "TCPStore", None)
    init = getattr(store, "__init__", None)
    if init is None or getattr(init, _MARK, False) or "use_libuv" not in (init.__doc__ or ""):
        return

    def __init__(self, *args, **kwargs):
        try:
            return init(self, *args, **kwargs)
        except RuntimeError as e:
            chosen = len(args) > _USE_LIBUV_POSITION or "use_libuv" in kwargs
            if chosen or _NO_LIBUV not in str(e):
                raise
        # Outside the handler, so a second failure is not shown as caused by the first.
        return init(self, *args, use_libuv=False, **kwargs)

    __init__.__doc__ = init.__doc__
    setattr(__init__, _MARK, True)
    store.__init__ = __init__


def _torch_version(dist):
    torch = sys.modules.get(dist.__name__.partition(".")[0])
    text = getattr(torch, "__version__", "") or ""
    try:
        return tuple(int(v) for v in str(text).split("+")[0].split(".")[:2])
    except ValueError:
        return None


def _old_nccl_name(dist):
    old, new = "NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_ASYNC_ERROR_HANDLING"
    version = _torch_version(dist)
    if version is None or version >= (2, 2) or old in os.environ or new not in os.environ:
        return
    os.environ[old] = os.environ[new]


class _PatchingLoader:
    """The real loader of torch.distributed, then the patch; the module keeps
    the real loader, which does everything else."""

    def __init__(self, loader):
        self._loader = loader

    def __getattr__(self, name):
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        _Finder.remove()
        module.__loader__ = module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        try:
            _wrap_tcpstore(module)
            _old_nccl_name(module)
        except Exception:  # a torch this does not know: leave it as it is
            pass


class _Finder:
    """Waits for the import of torch.distributed; finds nothing itself."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torch.distributed":
            return None
        for finder in sys.meta_path:
            find = None if finder is self else getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find else None
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _PatchingLoader(spec.loader)
        return spec

    @staticmethod
    def remove():
        sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, _MARK, False)]


setattr(_Finder, _MARK, True)


def _install():
    if os.environ.get("DTRUN_TORCH_SHIM", "1") == "0":
        return
    if any(getattr(f, _MARK, False) for f in sys.meta_path):
        return  # a second copy further down PYTHONPATH
    sys.meta_path.insert(0, _Finder())


def _chain():
    """Runs the sitecustomize that the first one after this folder on
    sys.path would have been (importlib.util would cost ~3 ms a start)."""
    here = os.path.abspath(os.path.dirname(__file__))
    entries = [os.path.abspath(p or os.curdir) for p in sys.path]
    if here not in entries:
        return
    after = sys.path[len(entries) - entries[::-1].index(here):]
    from importlib.machinery import PathFinder

    spec = PathFinder.find_spec("sitecustomize", after)
    if spec is None or spec.loader is None:
        return
    module = type(sys)(spec.name)
    module.__spec__, module.__loader__ = spec, spec.loader
    module.__file__, module.__cached__ = spec.origin, spec.cached
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


def _register_stack_dump():
    path, signum = os.environ.get("DTRUN_STACK_FILE"), os.environ.get("DTRUN_STACK_SIGNAL")
    if not path or not signum:
        return
    try:
        import faulthandler
        out = open(path, "a", buffering=1)
        faulthandler.register(int(signum), file=out, all_threads=True, chain=False)
        out.write("dtrun stack handler %d\n" % os.getpid())
        globals()["_stack_file"] = out  # kept open for the handler
    except (OSError, ValueError, RuntimeError):
        pass


_install()
_register_stack_dump()
# Found by dtrun's standby (dtrun_standby.py), which registers a forked
# worker's stack handler with the worker's own variables.
sys.modules["_dtrun_torch_shim"] = sys.modules[__name__]
_chain()
