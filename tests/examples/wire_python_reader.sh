#!/usr/bin/env bash
# docs/WIRE.md's Python reader (its first ```python block), run on payloads the library
# wrote, must give the values the library decodes, bit for bit, and refuse a corrupted one:
#   wire_python_reader.sh WIRE_MD WRITE_PAYLOADS WORKDIR [PYTHON3]
# Exits 77 (ctest: skipped) when PYTHON3 is missing or has no numpy.
set -euo pipefail
trap 'echo "FAIL: line $LINENO: \`$BASH_COMMAND\` exited $?" >&2' ERR
md=$1 write=$2 work=$3 py=${4:-}
if [[ -z $py ]] || ! "$py" -c 'import numpy' 2>/dev/null; then
  echo "SKIP: no python3 with numpy ('$py')"
  exit 77
fi
rm -rf "$work" && mkdir -p "$work" && cd "$work"
awk '/^```python$/ { inside = 1; next } /^```$/ { if (inside) exit } inside' "$md" >wire_reader.py
[[ $(wc -l <wire_reader.py) -gt 20 ]] || { echo "FAIL: no python block in $md" >&2; exit 1; }

# Every kind the reader claims, odd sizes, partial blocks, an odd int4 count, ndim 1 to 3.
"$write" payloads.bin w:f32:4x5 q8:int8:3x7 q4:int4:3x5 q8b:int8.bf16:13 q4b:int4.bf16:2x3x3 \
  h:f16:6 b:bf16:2x3 big:int4:40x33 >expected.txt
"$py" - payloads.bin expected.txt <<'PY'
import sys
import numpy as np
sys.path.insert(0, '.')
from wire_reader import read_payloads

got = list(read_payloads(sys.argv[1]))
want = [line.split() for line in open(sys.argv[2])]
assert len(got) == len(want), (len(got), len(want))
for (name, shape, x), w in zip(got, want):
    assert name == w[0], (name, w[0])
    assert 'x'.join(map(str, shape)) == w[1], (name, shape, w[1])
    ref = np.array([float(v) for v in w[2:]], dtype=np.float32).reshape(shape)
    assert x.dtype == np.float32 and x.shape == ref.shape, (name, x.dtype, x.shape)
    assert np.array_equal(x, ref), (name, np.abs(x - ref).max())
    print(f'ok: {name} {shape} read as the library decodes it ({x.size} values)')

data = bytearray(open(sys.argv[1], 'rb').read())
data[120] ^= 0x10  # inside the first payload's body
open('corrupt.bin', 'wb').write(data)
try:
    list(read_payloads('corrupt.bin'))
    raise SystemExit('FAIL: a flipped bit was not detected')
except ValueError as e:
    assert 'checksum' in str(e), e
    print(f'ok: flipped bit -> {e}')
PY
echo "ok: docs/WIRE.md's Python reader agrees with the library"
