#!/usr/bin/env bash
# dtrun's wheel (scripts/wheel.sh, from this build's static binaries) in a
# fresh venv, offline: pip puts dtrun and dtstore on the venv's PATH; the
# launcher contract through it (4 gloo ranks of Debian's torch, which the
# venv sees as its only other package set); `python -m dtrun`; a notebook
# cell through `%load_ext dtrun` in the venv's IPython; uninstall removes it
# all. Usage: wheel_test.sh BUILD_DIR SOURCE_DIR
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
  dtrun-*-py3-none-manylinux_*_x86_64.whl) ;;
  *) fail "unexpected wheel name $(basename "$wheel")" ;;
esac

venv=$tmp/venv
/usr/bin/python3 -m venv --system-site-packages "$venv"
"$venv/bin/python" -m pip install --no-index --no-deps --disable-pip-version-check \
  -q "$wheel" || fail "pip install failed"
for b in dtrun dtstore; do
  [[ -x $venv/bin/$b ]] || fail "$b not on the venv's PATH"
done
cd "$tmp"  # no checkout folder on sys.path

# The launcher contract: four gloo ranks through the wheel's dtrun.
out=$(PATH=$venv/bin:$PATH dtrun --nproc-per-node=4 --python "$venv/bin/python" \
  "$src/examples/allreduce_check.py" 2>"$tmp/err") || { cat "$tmp/err"; fail "dtrun from the wheel failed"; }
grep -q "sum=10" <<<"$out" || fail "unexpected output: $out"

# python -m dtrun is the launcher, with the same pid.
"$venv/bin/python" -m dtrun --version | grep -q "^dtrun " || fail "python -m dtrun --version"
out=$("$venv/bin/python" -m dtrun --nproc-per-node=2 --python "$venv/bin/python" \
  "$src/examples/allreduce_check.py" 2>"$tmp/err") || { cat "$tmp/err"; fail "python -m dtrun failed"; }
grep -q "sum=3" <<<"$out" || fail "unexpected output of python -m dtrun: $out"

# A notebook cell through the venv's IPython, dtrun found beside its Python
# (the venv's bin is not on PATH here).
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
