"""Builds dtrun's wheel: the static dtrun and dtstore (stripped) as the
wheel's scripts, so pip puts them on PATH as they are, and the Python
package apps/dtrun/python/dtrun (the session client, the Jupyter extension,
`python -m dtrun`). The binaries are static: they load no shared library,
the system's glibc included (the program headers are checked: no
interpreter, no dynamic section), so the wheel carries the oldest platform
tag pip knows for x86_64, manylinux2014 (glibc 2.17), and installs on every
distribution GPU clusters run. Host names are resolved from /etc/hosts and
DNS by the static glibc itself (rendezvous/util/name_lookup.h).

Usage: wheel.py --dtrun BIN --dtstore BIN --version V --out DIR
Prints the wheel's path."""
import argparse
import base64
import hashlib
import os
import shutil
import stat
import struct
import subprocess
import sys
import tempfile
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.join(HERE, "..", "apps", "dtrun", "python", "dtrun")


# PEP 600's name and its PEP 599 alias, as a compressed tag set.
PLATFORM_TAGS = ("manylinux_2_17_x86_64", "manylinux2014_x86_64")
PT_DYNAMIC, PT_INTERP = 2, 3


def program_header_types(path):
    """The p_type of each program header of a 64-bit little-endian ELF."""
    with open(path, "rb") as f:
        head = f.read(64)
        if head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
            raise ValueError("not a 64-bit little-endian ELF file")
        machine, = struct.unpack_from("<H", head, 18)
        if machine != 62:
            raise ValueError(f"built for ELF machine {machine}, not x86_64 (62)")
        phoff, = struct.unpack_from("<Q", head, 32)
        phentsize, phnum = struct.unpack_from("<HH", head, 54)
        types = []
        for i in range(phnum):
            f.seek(phoff + i * phentsize)
            types.append(struct.unpack("<I", f.read(4))[0])
        return types


def check_static(path):
    """Exits naming the binary when it would load anything at run time."""
    try:
        types = program_header_types(path)
    except (OSError, ValueError) as e:
        sys.exit(f"wheel.py: {path}: {e}")
    if PT_INTERP in types or PT_DYNAMIC in types:
        sys.exit(f"wheel.py: {path} is linked dynamically (it has a program "
                 "interpreter or a dynamic section), so it would need the glibc "
                 "it was built with; build it with -DDTRUN_STATIC_RUNTIME=ON")


def record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return f"{name},sha256={digest.decode()},{len(data)}"


def stripped(binary, tmp):
    out = os.path.join(tmp, os.path.basename(binary))
    shutil.copy(binary, out)
    subprocess.run(["strip", "--strip-debug", out], check=True)
    with open(out, "rb") as f:
        return f.read()


def main():
    ap = argparse.ArgumentParser()
    for flag in ("--dtrun", "--dtstore", "--version", "--out"):
        ap.add_argument(flag, required=True)
    a = ap.parse_args()
    for b in (a.dtrun, a.dtstore):
        check_static(b)
    tag = "py3-none-" + ".".join(PLATFORM_TAGS)
    dist = f"dtrun-{a.version}"
    files = {}
    for name in sorted(os.listdir(PACKAGE)):
        if name.endswith(".py"):
            with open(os.path.join(PACKAGE, name), "rb") as f:
                files[f"dtrun/{name}"] = f.read()
    with tempfile.TemporaryDirectory() as tmp:
        for b in (a.dtrun, a.dtstore):
            files[f"{dist}.data/scripts/{os.path.basename(b)}"] = stripped(b, tmp)
    files[f"{dist}.dist-info/METADATA"] = (
        "Metadata-Version: 2.1\nName: dtrun\nVersion: " + a.version + "\n"
        "Summary: A C++ torchrun: launcher, c10d-compatible store, interactive "
        "sessions\nRequires-Python: >=3.9\n").encode()
    files[f"{dist}.dist-info/WHEEL"] = (
        "Wheel-Version: 1.0\nGenerator: dtrun scripts/wheel.py\n"
        "Root-Is-Purelib: false\n" +
        "".join(f"Tag: py3-none-{t}\n" for t in PLATFORM_TAGS)).encode()
    files[f"{dist}.dist-info/top_level.txt"] = b"dtrun\n"
    record = [record_line(n, d) for n, d in files.items()]
    record.append(f"{dist}.dist-info/RECORD,,")
    files[f"{dist}.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, f"{dist}-{tag}.whl")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            info = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))
            executable = "/scripts/" in name
            info.external_attr = (stat.S_IFREG | (0o755 if executable else 0o644)) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    print(path)


if __name__ == "__main__":
    main()
