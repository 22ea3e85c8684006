"""Lets Debian's torch 2.6 (built without libuv) run torchrun and env:// workers.

torch 2.6's TCPStore defaults to use_libuv=True, for clients too, and a
build without libuv raises "use_libuv was requested but PyTorch was build
without libuv support": torchrun 2.6 fails at start in every mode, and so do
workers that reach torchrun's store (TORCHELASTIC_USE_AGENT_STORE=True passes
no use_libuv). Put this folder on PYTHONPATH and the constructor's default
becomes use_libuv=False; an explicit argument still wins and nothing on the
wire changes. The patch is applied when torch.distributed is first imported,
so interpreters that never import torch pay nothing. Used only to measure
torch 2.6 beside dtrun (scripts/bench.sh).
"""
import sys


def _patch_tcpstore():
    c10d = getattr(sys.modules.get("torch._C"), "_distributed_c10d", None)
    if c10d is None or getattr(c10d.TCPStore, "_libuv_default_off", False):
        return
    if "use_libuv" not in (c10d.TCPStore.__init__.__doc__ or ""):
        return  # torch before 2.2 has no libuv store
    original = c10d.TCPStore.__init__

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("use_libuv", False)
        original(self, *args, **kwargs)

    c10d.TCPStore.__init__ = __init__
    c10d.TCPStore._libuv_default_off = True


class _PatchOnImport:
    """torch.distributed's first lines call torch._C._c10d_init(), which creates
    torch._C._distributed_c10d; its TCPStore is patched right after, before
    any module imports TCPStore by name."""

    def find_spec(self, name, path=None, target=None):
        if name == "torch.distributed":
            c = sys.modules.get("torch._C")
            init = getattr(c, "_c10d_init", None)
            if init is not None and not getattr(init, "_patches_tcpstore", False):
                def _c10d_init():
                    ok = init()
                    _patch_tcpstore()
                    return ok
                _c10d_init._patches_tcpstore = True
                c._c10d_init = _c10d_init
        return None


sys.meta_path.insert(0, _PatchOnImport())
