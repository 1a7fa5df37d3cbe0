#!/usr/bin/env bash
# compress_tensors end to end: --help, the inputs people have (dilocox payloads, raw
# float32 with --shape, .npy files NumPy wrote) and one-line refusals of the rest:
#   compress_tensors_cli.sh COMPRESS_TENSORS WRITE_PAYLOADS WORKDIR [PYTHON3]
# Runs every check and says which failed; exits 1 if any did, 77 (ctest: skipped) when
# all others passed but PYTHON3 is missing or has no numpy for the NumPy checks.
set -uo pipefail
bin=$1 write=$2 work=$3 py=${4:-}
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
failed=0
fail() { echo "FAIL: $*" >&2; failed=1; }

# refuse CODE ARGS...: expect exit CODE and exactly one stderr line 'compress_tensors: ...'.
refuse() {
  local want=$1 rc=0
  shift
  timeout 120 "$bin" "$@" >out.txt 2>err.txt || rc=$?
  if [[ $rc != "$want" ]]; then
    fail "'$*' exited $rc, expected $want; stderr: $(head -c 400 err.txt)"
  elif [[ $(wc -l <err.txt) != 1 ]] || ! grep -q '^compress_tensors: ' err.txt; then
    fail "'$*' wrote $(wc -l <err.txt) lines on stderr, expected one 'compress_tensors: ...': $(head -c 400 err.txt)"
  elif [[ -n ${grep_for:-} ]] && ! grep -q -- "$grep_for" err.txt; then
    fail "'$*' message lacks '$grep_for': $(cat err.txt)"
  else
    echo "ok: $* -> exit $rc: $(cat err.txt)"
  fi
}

# accept OUT ARGS...: expect exit 0 and a table; stdout kept in OUT.
accept() {
  local out=$1 rc=0
  shift
  timeout 300 "$bin" --quick "$@" >"$out" 2>err.txt || rc=$?
  if [[ $rc != 0 ]] || ! grep -q '^| int8 b128 |' "$out"; then
    fail "'$*' exited $rc without a table; stderr: $(head -c 400 err.txt)"
    return 1
  fi
  echo "ok: $* -> $(grep -c '^### ' "$out") table(s): $(grep '^### ' "$out" | tr '\n' ' ')"
}

# The tables without their titles: equal when the matrices are.
tables() { grep '^|' "$1"; }

# --help: usage with every flag on stdout, exit 0.
rc=0
"$bin" --help >help.txt 2>err.txt || rc=$?
if [[ $rc != 0 || -s err.txt ]]; then
  fail "--help exited $rc; stderr: $(cat err.txt)"
else
  for flag in --from --shape --quick --help; do
    grep -q -- "$flag" help.txt || fail "--help does not mention $flag"
  done
  echo "ok: --help -> exit 0, $(wc -l <help.txt) lines"
fi

# Bad arguments: exit 2.
grep_for="" refuse 2 --no-such-flag
grep_for="" refuse 2 --from
grep_for="x" refuse 2 --shape 12x
grep_for="2^28" refuse 2 --shape 100000x100000

# Files that cannot be read: exit 1, the file named.
mkdir adir
: >empty.bin
grep_for="adir: is a directory" refuse 1 --from adir
grep_for="empty.bin: empty file" refuse 1 --from empty.bin
grep_for="missing.npy: no such file" refuse 1 --from missing.npy

# Raw float32: the body of a dense f32 payload (header 96 bytes + the 1-byte name 'm').
"$write" m.bin m:f32:12x20 >/dev/null || fail "write_payloads m.bin"
tail -c +98 m.bin | head -c 960 >m.f32
grep_for="needs a shape" refuse 1 --from m.f32
grep_for="m.f32: raw float32 of shape (12, 21) needs 1008 bytes, the file holds 960" refuse 1 --shape 12x21 --from m.f32
grep_for="40000000000 bytes" refuse 1 --shape 100000x100000 --from m.f32
grep_for="comes after the last --from" refuse 2 --from m.f32 --shape 12x20
accept raw.txt --shape 12x20 --from m.f32
accept raw3d.txt --shape 12x4x5 --from m.f32 && grep -q '^### m.f32 ((12, 4, 5) as 12 x 20, m.f32)' raw3d.txt ||
  fail "a 3-D raw tensor is not titled as reshaped: $(grep '^###' raw3d.txt)"
accept payload.txt --from m.bin
tables raw.txt >a.txt && tables payload.txt >b.txt && cmp -s a.txt b.txt ||
  fail "the raw file and the payload it came from give different tables"

# Payloads: several kinds; a file without a 2-D-usable tensor is an error.
"$write" mixed.bin w:int4:16x24 bias:f32:16 conv:bf16:8x2x3 >/dev/null || fail "write_payloads mixed.bin"
"$write" vectors.bin bias:f32:8 scale:int8:5 >/dev/null || fail "write_payloads vectors.bin"
accept mixed.txt --from mixed.bin && [[ $(grep -c '^### ' mixed.txt) == 2 ]] ||
  fail "mixed.bin: expected tables for w and conv: $(grep '^###' mixed.txt)"
grep -q "skipped 'bias' (16): reshapes to 16 x 1" err.txt || fail "mixed.bin: the skipped bias is not listed: $(cat err.txt)"
grep_for="vectors.bin: no tensor usable as a matrix" refuse 1 --from vectors.bin
cp m.bin corrupt.bin && printf '\x55' | dd of=corrupt.bin bs=1 seek=300 conv=notrunc status=none
grep_for="checksum mismatch" refuse 1 --from corrupt.bin

# .npy files written by NumPy: float32 C order, float64 Fortran order, 3-D; big-endian refused.
if [[ -z $py ]] || ! "$py" -c 'import numpy' 2>/dev/null; then
  echo "SKIP: the NumPy checks: no python3 with numpy ('$py')"
  [[ $failed == 0 ]] && exit 77
  exit 1
fi
"$py" - <<'PY' || fail "numpy could not write the .npy files"
import numpy as np
x = np.fromfile('m.f32', dtype='<f4').reshape(12, 20)
np.save('c32.npy', x)
np.save('f64.npy', np.asfortranarray(x.astype(np.float64)))
np.save('c3d.npy', x.reshape(12, 4, 5))
np.save('big_endian.npy', x.astype('>f4'))
np.save('ints.npy', np.arange(12, dtype=np.int64).reshape(3, 4))
assert np.load('f64.npy').flags.f_contiguous
PY
accept npy32.txt --from c32.npy
accept npy64.txt --from f64.npy
accept npy3d.txt --from c3d.npy
for t in npy32 npy64 npy3d; do
  tables $t.txt >b.txt && cmp -s a.txt b.txt || fail "$t: its table differs from the raw file's (same matrix)"
done
grep_for="dtype '>f4' is not supported (big-endian)" refuse 1 --from big_endian.npy
grep_for="dtype '<i8' is not supported" refuse 1 --from ints.npy

[[ $failed == 0 ]] && echo "ok: every check passed"
exit $failed
