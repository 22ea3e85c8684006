"""Builds dtrun's wheel: the static dtrun and dtstore (stripped) as the
wheel's scripts, so pip puts them on PATH as they are, and the Python
package apps/dtrun/python/dtrun (the session client, the Jupyter extension,
`python -m dtrun`). One platform tag: the binaries are static, so any
x86_64 Linux with glibc as new as the one they were built on runs them.

Usage: wheel.py --dtrun BIN --dtstore BIN --version V --out DIR
Prints the wheel's path."""
import argparse
import base64
import hashlib
import os
import platform
import shutil
import stat
import subprocess
import tempfile
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.join(HERE, "..", "apps", "dtrun", "python", "dtrun")


def glibc_tag():
    major, minor = (int(v) for v in platform.libc_ver()[1].split(".")[:2])
    return f"manylinux_{major}_{minor}_{platform.machine()}"


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
    tag = f"py3-none-{glibc_tag()}"
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
        f"Root-Is-Purelib: false\nTag: {tag}\n").encode()
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
