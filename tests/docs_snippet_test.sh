#!/usr/bin/env bash
# The compressor docs/API.md shows is the one examples/user_compressor.cpp compiles and runs:
# the text between the `// [user-compressor]` markers equals the ```cpp block between the
# `<!-- user-compressor` markers of the guide.
set -euo pipefail
root=$1
example=$(awk '/^\/\/ \[user-compressor\]/ { n++; next } n == 1' "$root/examples/user_compressor.cpp")
guide=$(awk '/^<!-- user-compressor/ { on = 1; next } /^<!-- \/user-compressor/ { on = 0 } on' "$root/docs/API.md" |
        sed -e '/^```/d')
if [[ "$example" != "$guide" ]]; then
  echo "FAIL: docs/API.md's compressor differs from examples/user_compressor.cpp:" >&2
  diff <(echo "$example") <(echo "$guide") >&2 || true
  exit 1
fi
echo "ok: docs/API.md shows the compressor examples/user_compressor.cpp runs ($(echo "$example" | wc -l) lines)"
