#!/usr/bin/env bash
# dtrun's wheel (scripts/wheel.sh, from this build's static binaries) in a
# fresh venv, offline: its tag is manylinux2014's (pip takes it for an old
# platform, not for an older one) and its binaries load nothing; pip puts
# dtrun and dtstore on the venv's PATH; the launcher contract through it (4
# gloo ranks of Debian's torch, which the venv sees as its only other package
# set). With a python3 first on PATH that has no torch (as pyenv's, conda's
# base or a cluster module's) and the venv not activated, each way in runs
# the venv's Python: `python -m dtrun`, the venv's bin/dtrun, `python -m
# dtrun.launch`, `dtrun --interactive` and a notebook cell through
# `%load_ext dtrun`; PYTHON_EXEC and --python still win, and the build
# tree's dtrun keeps PATH's python3. Uninstall removes it all.
# Usage: wheel_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$(readlink -f "$1")
src=$(readlink -f "$2")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "wheel_test: $*" >&2; exit 1; }

wheel=$(cd "$src" && scripts/wheel.sh "$build" | tail -1)
wheel=$src/$wheel
[[ -f $wheel ]] || fail "no wheel at $wheel"
case $(basename "$wheel") in
  dtrun-*-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl) ;;
  *) fail "unexpected wheel name $(basename "$wheel")" ;;
esac
# pip takes it for glibc 2.17 (CentOS 7, RHEL 8, Ubuntu 22.04 and later are
# newer), and refuses it for glibc 2.12: the test can tell.
pip_for() {  # pip_for PLATFORM: install the wheel for that platform
  /usr/bin/python3 -m pip install --no-index --no-deps --disable-pip-version-check -q \
    --platform "$1" --only-binary=:all: --target "$tmp/target-$1" "$wheel" 2>"$tmp/pip-$1"
}
pip_for manylinux2014_x86_64 || { cat "$tmp/pip-manylinux2014_x86_64"; fail "pip refused the wheel for manylinux2014"; }
[[ -x $tmp/target-manylinux2014_x86_64/bin/dtrun ]] || fail "no dtrun in the --target install"
! pip_for manylinux2010_x86_64 || fail "pip took the wheel for manylinux2010 (glibc 2.12)"

venv=$tmp/venv
/usr/bin/python3 -m venv --system-site-packages "$venv"
"$venv/bin/python" -m pip install --no-index --no-deps --disable-pip-version-check \
  -q "$wheel" || fail "pip install failed"
for b in dtrun dtstore; do
  [[ -x $venv/bin/$b ]] || fail "$b not on the venv's PATH"
  # Static: no program interpreter, no dynamic section (no glibc of the system).
  ! readelf -lW "$venv/bin/$b" | grep -qE '^ +(INTERP|DYNAMIC) ' || fail "$b is linked dynamically"
done
cd "$tmp"  # no checkout folder on sys.path

# The launcher contract: four gloo ranks through the wheel's dtrun.
out=$(PATH=$venv/bin:$PATH dtrun --nproc-per-node=4 --python "$venv/bin/python" \
  "$src/examples/allreduce_check.py" 2>"$tmp/err") || { cat "$tmp/err"; fail "dtrun from the wheel failed"; }
grep -q "sum=10" <<<"$out" || fail "unexpected output: $out"

# python -m dtrun is the launcher, with the same pid.
"$venv/bin/python" -m dtrun --version | grep -q "^dtrun " || fail "python -m dtrun --version"

# A python3 first on PATH without torch: Debian's own, without its site
# packages. The venv is not activated, as in a batch script.
mkdir "$tmp/stub"
printf '#!/bin/sh\nexec /usr/bin/python3 -S "$@"\n' >"$tmp/stub/python3"
chmod +x "$tmp/stub/python3"
export PATH=$tmp/stub:$PATH
ok() {  # ok WHAT CMD...: the 2-rank torch job runs
  local what=$1
  shift
  out=$("$@" 2>"$tmp/err") || { cat "$tmp/err"; fail "$what: failed"; }
  grep -q "sum=3" <<<"$out" || { cat "$tmp/err"; fail "$what: unexpected output: $out"; }
}
no_torch() {  # no_torch WHAT CMD...: the workers ran the stub
  local what=$1
  shift
  ! "$@" >"$tmp/out" 2>"$tmp/err" || fail "$what: ran with torch"
  grep -q "No module named 'torch'" "$tmp/err" || { cat "$tmp/err"; fail "$what: not the stub's error"; }
}
job=("--nproc-per-node=2" "$src/examples/allreduce_check.py")
ok "python -m dtrun" "$venv/bin/python" -m dtrun "${job[@]}"
grep -q "Python: $venv/bin/python, from the Python that started dtrun" "$tmp/err" ||
  { cat "$tmp/err"; fail "python -m dtrun: the start line does not name the venv's Python"; }
ok "the venv's dtrun" "$venv/bin/dtrun" "${job[@]}"
grep -q "Python: $venv/bin/python3, from the environment dtrun is installed in" "$tmp/err" ||
  { cat "$tmp/err"; fail "venv/bin/dtrun: the start line does not name the venv's Python"; }
ok "python -m dtrun.launch" "$venv/bin/python" -m dtrun.launch --use-env "${job[@]}"
no_torch "PYTHON_EXEC" env PYTHON_EXEC="$tmp/stub/python3" "$venv/bin/python" -m dtrun "${job[@]}"
no_torch "--python" "$venv/bin/dtrun" --python "$tmp/stub/python3" "${job[@]}"
no_torch "the build tree's dtrun" "$build/apps/dtrun" "${job[@]}"
out=$(printf 'import torch; print("torch", torch.__version__)\n' |
  "$venv/bin/dtrun" --interactive --nproc-per-node=1 2>&1) || { echo "$out"; fail "dtrun --interactive failed"; }
grep -q "\[rank 0\] torch " <<<"$out" || { echo "$out"; fail "dtrun --interactive: no torch on the rank"; }

# A notebook cell through the venv's IPython, dtrun found beside its Python
# (the venv's bin is not on PATH here), its ranks on the kernel's Python.
cat >"$tmp/cell.ipy" <<'IPY'
%load_ext dtrun
%dist_init --num-processes 2
%dist_mode off
get_ipython().run_cell_magic("distributed", "", "print(f'rank {rank} of {world_size}')")
%dist_shutdown
IPY
out=$(TERM=dumb "$venv/bin/python" -m IPython --no-banner --colors=NoColor "$tmp/cell.ipy" 2>&1) || { echo "$out"; fail "the notebook cell failed"; }
grep -q "rank 0 of 2" <<<"$out" && grep -q "rank 1 of 2" <<<"$out" || { echo "$out"; fail "no cell output"; }

# Uninstall leaves nothing.
"$venv/bin/python" -m pip uninstall -y -q dtrun
[[ ! -e $venv/bin/dtrun && ! -e $venv/bin/dtstore ]] || fail "binaries left after uninstall"
! "$venv/bin/python" -c "import dtrun" 2>/dev/null || fail "package left after uninstall"
echo "wheel_test: $(basename "$wheel"): installed, launched (dtrun, python -m dtrun), a notebook cell, uninstalled"
