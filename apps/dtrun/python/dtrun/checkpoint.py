"""dtrun's checkpoints (.dtck, written by the training library) read from
Python, and converted to torch.save or safetensors files.

    import dtrun.checkpoint
    state = dtrun.checkpoint.load("ckpt/")          # the model's state dict
    model.load_state_dict(state)
    full = dtrun.checkpoint.load_checkpoint("ckpt/")  # step, strategy, model, optimizer

    python -m dtrun.checkpoint convert ckpt/ model.pt            # torch.save
    python -m dtrun.checkpoint convert ckpt/ model.safetensors   # with safetensors
    python -m dtrun.checkpoint show ckpt/

A folder gives its newest step whose files are whole (the step's file and,
for FSDP's sharded format, every shard it names); a damaged or torn one is
skipped for the one before, with a warning naming what did not verify, as
the library's resume does. DDP's parameters and buffers come by their
names; FSDP's units are reassembled from any number of shards and cut back
into the model's parameters by the layout the checkpoint carries. Every
file is verified first: XXH3-64 per block (the `xxhash` module, or the
system's libxxhash through ctypes) or SHA-256 (hashlib). The format is in
lib/README.md, "Checkpoint format"."""
import collections
import ctypes
import ctypes.util
import hashlib
import json
import os
import re
import struct
import sys
import warnings

__all__ = ["CheckpointError", "read_file", "load", "load_checkpoint", "save"]

MAGIC1, MAGIC2, RAW = b"DTCKPT1\n", b"DTCKPT2\n", b"DTRAW1\n\0"
STEP_FILE = re.compile(r"^ckpt_(\d+)\.dtck$")


class CheckpointError(Exception):
    """A file that is not a whole dtrun checkpoint, or a folder without one."""


# --- the frame ------------------------------------------------------------

_xxh3 = None


def _xxh3_64():
    """XXH3-64 of bytes, from the xxhash module or libxxhash (ctypes)."""
    global _xxh3
    if _xxh3 is None:
        try:
            import xxhash
            _xxh3 = lambda b: xxhash.xxh3_64_intdigest(b)  # noqa: E731
        except ImportError:
            name = ctypes.util.find_library("xxhash") or "libxxhash.so.0"
            try:
                lib = ctypes.CDLL(name)
            except OSError:
                raise CheckpointError(
                    "verifying a DTCKPT2 file needs XXH3: install the xxhash module "
                    "(pip install xxhash, or Debian's python3-xxhash) or libxxhash, or "
                    "pass verify=False") from None
            fn = lib.XXH3_64bits
            fn.restype, fn.argtypes = ctypes.c_uint64, [ctypes.c_char_p, ctypes.c_size_t]

            def h(b):
                b = bytes(b) if not isinstance(b, bytes) else b
                return fn(b, len(b))
            _xxh3 = h
    return _xxh3


def _payload(data, path, verify):
    """The payload of one framed file's bytes, checked unless verify=False."""
    view = memoryview(data)
    if data[:8] == MAGIC1:
        if len(data) < 48:
            raise CheckpointError(f"{path}: not a dtrun checkpoint (bad header)")
        (length,) = struct.unpack_from("<Q", data, 40)
        if length != len(data) - 48:
            raise CheckpointError(f"{path}: truncated: {len(data) - 48} of {length} payload bytes")
        payload = view[48:]
        if verify and hashlib.sha256(payload).digest() != bytes(data[8:40]):
            raise CheckpointError(f"{path}: checksum mismatch")
        return payload
    if data[:8] != MAGIC2 or len(data) < 24:
        raise CheckpointError(f"{path}: not a dtrun checkpoint (bad header)")
    length, block = struct.unpack_from("<QQ", data, 8)
    if block == 0 or block > 1 << 30 or length > 1 << 50:
        raise CheckpointError(f"{path}: not a dtrun checkpoint (bad header)")
    blocks = (length + block - 1) // block
    hashed = 24 + 8 * blocks
    header = (hashed + 8 + 63) // 64 * 64
    if len(data) < header:
        raise CheckpointError(f"{path}: truncated: 0 of {length} payload bytes")
    if verify and _xxh3_64()(view[:hashed]) != struct.unpack_from("<Q", data, hashed)[0]:
        raise CheckpointError(f"{path}: checksum mismatch in the header")
    if length != len(data) - header:
        raise CheckpointError(f"{path}: truncated: {len(data) - header} of {length} payload bytes")
    payload = view[header:]
    if verify:
        h = _xxh3_64()
        for b in range(blocks):
            begin = b * block
            want = struct.unpack_from("<Q", data, 24 + 8 * b)[0]
            if h(payload[begin:begin + block]) != want:
                raise CheckpointError(f"{path}: checksum mismatch in payload bytes "
                                      f"{begin}-{min(length, begin + block)}")
    return payload


# --- the payload ----------------------------------------------------------

def _dtypes():
    import torch
    return {1: torch.float32, 2: torch.float64, 3: torch.float16, 4: torch.bfloat16,
            5: torch.int64, 6: torch.int32, 7: torch.int16, 8: torch.int8, 9: torch.uint8,
            10: torch.bool}


_SIZES = {1: 4, 2: 8, 3: 2, 4: 2, 5: 8, 6: 4, 7: 2, 8: 1, 9: 1, 10: 1}


def _raw_tensors(payload, path):
    """The named tensors of a raw payload (DTRAW1), each a copy of its own."""
    import torch
    (index_len,) = struct.unpack_from("<Q", payload, 8)
    if index_len > len(payload) - 16:
        raise CheckpointError(f"{path}: its index ({index_len} bytes) runs past the payload")
    index = payload[16:16 + index_len]
    data_start = 16 + index_len
    at = 4
    (count,) = struct.unpack_from("<I", index, 0)
    dtypes = _dtypes()
    out = collections.OrderedDict()
    for i in range(count):
        try:
            (name_len,) = struct.unpack_from("<H", index, at)
            name = bytes(index[at + 2:at + 2 + name_len]).decode()
            at += 2 + name_len
            code, dims = struct.unpack_from("<BB", index, at)
            at += 2
            sizes = list(struct.unpack_from(f"<{dims}q", index, at))
            at += 8 * dims
            offset, nbytes = struct.unpack_from("<QQ", index, at)
            at += 16
        except struct.error:
            raise CheckpointError(f"{path}: tensor {i} of the index runs past it") from None
        if code not in dtypes:
            raise CheckpointError(f"{path}: tensor {i} '{name}': unknown dtype code {code}")
        numel = 1
        for d in sizes:
            if d < 0:
                raise CheckpointError(f"{path}: tensor {i} '{name}': a negative size")
            numel *= d
        if numel * _SIZES[code] != nbytes or offset < data_start or offset + nbytes > len(payload):
            raise CheckpointError(f"{path}: tensor {i} '{name}': its bytes lie outside the payload")
        raw = bytearray(payload[offset:offset + nbytes])
        t = torch.frombuffer(raw, dtype=dtypes[code]) if nbytes else torch.empty(0, dtype=dtypes[code])
        out[name] = t.reshape(sizes)
    return out


def _archive_tensors(data):
    """The tensors of a torch archive (libtorch's OutputArchive)."""
    import io
    import torch
    m = torch.jit.load(io.BytesIO(bytes(data)), map_location="cpu")
    out = collections.OrderedDict()
    for name, t in list(m.named_parameters()) + list(m.named_buffers()):
        out[name] = t.detach().clone()
    return out


def read_file(path, verify=True):
    """One .dtck file's named tensors, its frame checked (verify=False: not).
    Raises CheckpointError naming what is wrong."""
    with open(path, "rb") as f:
        data = f.read()
    payload = _payload(data, path, verify)
    if bytes(payload[:8]) == RAW:
        return _raw_tensors(payload, path)
    try:
        return _archive_tensors(payload)
    except Exception as e:  # noqa: BLE001 - torch's errors name no file
        raise CheckpointError(f"{path}: neither a raw payload nor a torch archive ({e})") from None


# --- a step ---------------------------------------------------------------

def _text(t):
    return bytes(t.numpy().tobytes()).decode()


def _fsdp_model(files):
    """FSDP's units, reassembled from the files that hold their ranges and
    cut into the model's parameters by the layout."""
    import torch
    layout = json.loads(_text(files[0]["fsdp_layout"]))
    model, optimizer = collections.OrderedDict(), {}
    for k, unit in enumerate(layout["units"]):
        pre = f"u{k}."
        numel = unit["numel"]
        fields = sorted({key[len(pre):] for f in files for key in f
                         if key.startswith(pre) and key[len(pre):] not in ("begin", "numel", "padded")})
        flat = {}
        for field in fields:
            if field == "step":
                optimizer[f"{pre}step"] = files[0][pre + "step"].clone()
                continue
            whole = torch.zeros(numel, dtype=torch.float32)
            covered = torch.zeros(numel, dtype=torch.bool)
            for f in files:
                part = f[pre + field].reshape(-1)
                begin = int(f[pre + "begin"])
                end = min(numel, begin + part.numel())
                if end > begin:
                    whole[begin:end] = part[:end - begin].to(torch.float32)
                    covered[begin:end] = True
            if not bool(covered.all()):
                raise CheckpointError(f"unit {k}'s {field}: the shards do not cover it "
                                      f"({int((~covered).sum())} of {numel} elements missing)")
            flat[field] = whole
        for p in unit["params"]:
            n = 1
            for d in p["shape"]:
                n *= d
            cut = flat["param"][p["offset"]:p["offset"] + n].reshape(p["shape"]).clone()
            model[p["name"]] = cut
            for field, whole in flat.items():
                if field != "param":
                    optimizer[f"{p['name']}.{field}"] = (
                        whole[p["offset"]:p["offset"] + n].reshape(p["shape"]).clone())
    # parameters that do not train and buffers: whole in every file
    for key, t in files[0].items():
        for pre in ("frozen.", "buffer."):
            if key.startswith(pre):
                model[key[len(pre):]] = t.clone()
    return model, optimizer


def _step_of(folder, step, verify):
    """The checkpoint of `step` (its digits as the file names have them:
    zero-padded) in `folder`, read whole."""
    main = read_file(os.path.join(folder, f"ckpt_{step}.dtck"), verify)
    out = {"step": int(main["step"]), "world_size": int(main["world_size"]),
           "epoch": int(main["epoch"]) if "epoch" in main else 0}
    if "fsdp_shards" in main:
        out["strategy"] = "fsdp"
        if "fsdp_layout" not in main:
            raise CheckpointError(f"{folder}: step {step} was written before FSDP checkpoints "
                                  "carried their layout; it loads only in the library")
        shards = int(main["fsdp_shards"])
        files = [main] if shards == 0 else [
            dict(read_file(os.path.join(folder, f"ckpt_{step}.shard_{r}.dtck"), verify),
                 fsdp_layout=main["fsdp_layout"]) for r in range(shards)]
        out["model"], out["optimizer"] = _fsdp_model(files)
        return out
    out["strategy"] = "ddp"
    model, optimizer = collections.OrderedDict(), {}
    for key, t in main.items():
        if key.startswith("ddp.model."):
            model[key[len("ddp.model."):]] = t
        elif key.startswith("ddp.optim."):
            optimizer[key[len("ddp.optim."):]] = t
    if not model and "model" in main:  # files written before the named tensors
        model.update(_archive_tensors(main["model"].numpy().tobytes()))
    out["model"], out["optimizer"] = model, optimizer
    return out


def load_checkpoint(path, verify=True):
    """A checkpoint as a dict: "step", "world_size", "epoch", "strategy"
    ("ddp" or "fsdp"), "model" (the state dict) and "optimizer" (its state
    by parameter: DDP's "<i>.<field>", FSDP's "<name>.<field>"). `path`: a
    checkpoint folder (its newest whole step) or a step's file."""
    if not os.path.exists(path):
        raise CheckpointError(f"{path}: no such file or folder")
    if os.path.isdir(path):
        steps = sorted((m.group(1) for m in map(STEP_FILE.match, os.listdir(path)) if m),
                       key=int, reverse=True)
        if not steps:
            raise CheckpointError(f"{path}: no checkpoint (no ckpt_<step>.dtck file)")
        why = []
        for step in steps:
            try:
                got = _step_of(path, step, verify)
            except (CheckpointError, OSError) as e:
                why.append(str(e))
                continue
            for w in why:
                warnings.warn(f"checkpoint skipped: {w}")
            return got
        raise CheckpointError(f"{path}: no step loads: " + "; ".join(why))
    m = STEP_FILE.match(os.path.basename(path))
    if not m:
        raise CheckpointError(f"{path}: not a step's file (ckpt_<step>.dtck); a shard alone "
                              "holds part of each unit: give the folder")
    return _step_of(os.path.dirname(path) or ".", m.group(1), verify)


def load(path, verify=True):
    """The model's state dict (name -> tensor, on the CPU) of a checkpoint
    folder's newest whole step, or of a step's file."""
    return load_checkpoint(path, verify)["model"]


def _raw_payload(state):
    """Named tensors as a raw payload (DTRAW1), the library's layout."""
    codes = {v: k for k, v in _dtypes().items()}
    entries, index_len = [], 4
    for name, t in state.items():
        if t.dtype not in codes:
            raise CheckpointError(f"'{name}': dtype {t.dtype} has no code in the raw format")
        t = t.detach().cpu().contiguous()
        entries.append((name.encode(), codes[t.dtype], list(t.shape), t))
        index_len += 2 + len(name.encode()) + 2 + 8 * t.dim() + 16
    align = lambda v: (v + 63) // 64 * 64  # noqa: E731
    at = align(16 + index_len)
    index = [struct.pack("<I", len(entries))]
    offsets = []
    for name, code, shape, t in entries:
        nbytes = t.numel() * t.element_size()
        offsets.append(at)
        index.append(struct.pack("<H", len(name)) + name + struct.pack("<BB", code, len(shape)) +
                     struct.pack(f"<{len(shape)}q", *shape) + struct.pack("<QQ", at, nbytes))
        at = align(at + nbytes)
    out = bytearray(RAW + struct.pack("<Q", index_len) + b"".join(index))
    for (name, code, shape, t), offset in zip(entries, offsets):
        out.extend(b"\0" * (offset - len(out)))
        out.extend(t.reshape(-1).view(torch_uint8()).numpy().tobytes() if t.numel() else b"")
    return bytes(out)


def torch_uint8():
    import torch
    return torch.uint8


def _write_dtck(state, out):
    """A file the library reads (model.init_from): SHA-256 frame, raw
    payload, written whole under a temporary name, then renamed."""
    payload = _raw_payload(state)
    frame = MAGIC1 + hashlib.sha256(payload).digest() + struct.pack("<Q", len(payload))
    tmp = out + ".tmp"
    with open(tmp, "wb") as f:
        f.write(frame)
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, out)


def save(state, out):
    """`state` (name -> tensor) to `out`: a .dtck file the library reads
    (train_cfg's model.init_from), safetensors for .safetensors (the
    safetensors module needed), else torch.save."""
    if out.endswith(".dtck"):
        _write_dtck(state, out)
        return
    if out.endswith(".safetensors"):
        try:
            from safetensors.torch import save_file
        except ImportError:
            raise CheckpointError("writing .safetensors needs the safetensors module "
                                  "(pip install safetensors); or write a .pt file") from None
        save_file({k: v.contiguous() for k, v in state.items()}, out)
        return
    import torch
    torch.save(dict(state), out)


def _torch_state(src, key, prefix):
    """The state dict in a torch.save file: the top level, or its `key`."""
    import torch
    try:
        obj = torch.load(src, map_location="cpu")
    except Exception as e:  # noqa: BLE001 - torch names no file
        raise CheckpointError(f"{src}: not a torch.save file ({e})") from None
    if key is not None:
        if not isinstance(obj, dict) or key not in obj:
            raise CheckpointError(f"{src}: no entry '{key}'")
        obj = obj[key]
    if not isinstance(obj, dict):
        raise CheckpointError(f"{src}: holds a {type(obj).__name__}, not a state dict")
    if not all(isinstance(v, torch.Tensor) for v in obj.values()):
        held = [k for k, v in obj.items() if isinstance(v, dict)]
        raise CheckpointError(f"{src}: not every entry is a tensor" +
                              (f"; the state dict may be under --key {held[0]}" if held else ""))
    return collections.OrderedDict(
        (k[len(prefix):] if prefix and k.startswith(prefix) else k, v) for k, v in obj.items())


def main(argv=None):
    import argparse
    p = argparse.ArgumentParser(prog="python -m dtrun.checkpoint",
                                description="dtrun checkpoints read, shown and converted")
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("convert", help="the model's state dict to torch.save or safetensors")
    c.add_argument("src", help="a checkpoint folder or a ckpt_<step>.dtck file")
    c.add_argument("out", help="OUT.pt (torch.save) or OUT.safetensors")
    c.add_argument("--no-verify", action="store_true", help="skip the checksums")
    i = sub.add_parser("import", help="a torch.save file's state dict to a .dtck file "
                       "that train_cfg's model.init_from reads")
    i.add_argument("src", help="a torch.save file: a state dict, or a dict holding one")
    i.add_argument("out", help="OUT.dtck")
    i.add_argument("--key", help="the entry holding the state dict (nanoGPT's ckpt.pt: model)")
    i.add_argument("--strip-prefix", default="",
                   help="taken off each name that starts with it (torch.compile's _orig_mod.)")
    s = sub.add_parser("show", help="the step, the strategy and every tensor")
    s.add_argument("src")
    s.add_argument("--no-verify", action="store_true")
    a = p.parse_args(argv)
    try:
        if a.cmd == "import":
            state = _torch_state(a.src, a.key, a.strip_prefix)
            save(state, a.out)
            print(f"{a.out}: {len(state)} tensors")
            return 0
        ck = load_checkpoint(a.src, verify=not a.no_verify)
        if a.cmd == "convert":
            save(ck["model"], a.out)
            print(f"{a.out}: {len(ck['model'])} tensors of step {ck['step']} "
                  f"({ck['strategy']}, {ck['world_size']} ranks)")
        else:
            print(f"step {ck['step']}, {ck['strategy']}, saved by {ck['world_size']} ranks, "
                  f"epoch {ck['epoch']}")
            for part in ("model", "optimizer"):
                for name, t in ck[part].items():
                    print(f"{part}  {name}  {str(t.dtype).replace('torch.', '')}  {list(t.shape)}")
    except CheckpointError as e:
        print(f"dtrun.checkpoint: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
