#!/usr/bin/env bash
# The CUDA check for a machine with an NVIDIA GPU (sm_90 by default): builds the CUDA
# targets, runs the `gpu`-labelled tests and bench_cuda, and prints a short table last:
# quantizer GB/s against the device copy bandwidth (goal >= 70%), projector time over its
# cuBLAS GEMMs (goal <= 1.3x), trainer tokens/s and MFU for small and medium.
#   scripts/device_check.sh --prepare   (here, with the Debian packages installed) copies
#       the header-only dependencies and GoogleTest's sources into .device_deps/ (ignored
#       by git) for a GPU machine that has nvcc, CMake and ninja but nothing else;
#   scripts/device_check.sh             builds in build-device/ and runs; logs go to $OUT
#       (or out/device/). Without a GPU it still builds and says that nothing ran.
# Budget: under 8 minutes on a 16-core machine with one H200.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
deps=$root/.device_deps

if [[ ${1:-} == --prepare ]]; then
  rm -rf "$deps"
  mkdir -p "$deps/usr/include" "$deps/usr/share/cmake" "$deps/src"
  cp -r /usr/include/eigen3 "$deps/usr/include/"
  mkdir -p "$deps/usr/share/eigen3" && cp -r /usr/share/eigen3/cmake "$deps/usr/share/eigen3/"
  cp -r /usr/include/nlohmann /usr/include/CLI "$deps/usr/include/"
  cp -r /usr/share/cmake/nlohmann_json /usr/share/cmake/CLI11 "$deps/usr/share/cmake/"
  cp -r /usr/src/googletest "$deps/src/"
  echo "device_check: dependencies in $(du -sh "$deps" | cut -f1) at $deps"
  exit 0
fi

out=${OUT:-$root/out/device}
mkdir -p "$out"
jobs=$(nproc)
t0=$(date +%s)
prefix=()
if [[ -d $deps ]]; then  # a bare GPU machine: GoogleTest from source, the rest carried
  gtest_prefix=/tmp/dilocox-gtest
  if [[ ! -f $gtest_prefix/lib/cmake/GTest/GTestConfig.cmake ]]; then
    cmake -S "$deps/src/googletest" -B /tmp/dilocox-gtest-build -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_INSTALL_PREFIX=$gtest_prefix -DBUILD_GMOCK=OFF >"$out/gtest_build.log" 2>&1
    cmake --build /tmp/dilocox-gtest-build -j "$jobs" --target install >>"$out/gtest_build.log" 2>&1
  fi
  prefix=(-DCMAKE_PREFIX_PATH="$deps/usr;$gtest_prefix")
fi

# The MPI test passes Open MPI's flags (--allow-run-as-root, --oversubscribe): MPI only with Open MPI.
mpi=OFF
if mpiexec --version 2>&1 | grep -q "Open MPI"; then mpi=AUTO; fi
echo "=== configure and build the CUDA targets (sm_${CUDA_ARCH:-90}, MPI $mpi) ==="
cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DDILOCOX_WITH_CUDA=ON -DDILOCOX_WITH_MPI=$mpi \
  -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}" -DDILOCOX_BUILD_EXAMPLES=OFF "${prefix[@]}" \
  >"$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 1; }
targets=(test_cuda_library test_cuda_gpt bench_cuda)
grep -q '^build tests/test_cuda_comm:' build-device/build.ninja 2>/dev/null && targets+=(test_cuda_comm)
cmake --build build-device -j "$jobs" --target "${targets[@]}" 2>&1 | tee "$out/build.log" | grep -E "error|FAILED" || true
[[ ${PIPESTATUS[0]} == 0 ]] || { echo "device_check: build failed (see build.log)"; exit 1; }
echo "built in $(( $(date +%s) - t0 )) s"

if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "device_check: no NVIDIA GPU here: everything compiled, nothing ran"
  exit 0
fi
nvidia-smi -L | tee "$out/gpu.txt"

echo "=== gpu tests ==="
status=0
ctest --test-dir build-device -L gpu --output-on-failure -j 1 2>&1 | tee "$out/gpu_tests.log" || status=1

echo "=== bench_cuda ==="
build-device/bench/bench_cuda 2>&1 | tee "$out/bench_cuda.log" || status=1

echo
echo "=== summary ($(( $(date +%s) - t0 )) s) ==="
python3 - "$out/bench_cuda.log" "$out/gpu_tests.log" <<'PY' | tee "$out/summary.txt"
import json, re, sys
rows = [json.loads(l[7:]) for l in open(sys.argv[1]) if l.startswith("RESULT ")]
tests = open(sys.argv[2]).read()
m = re.search(r"(\d+)% tests passed, (\d+) tests failed out of (\d+)", tests)
print(f"gpu tests: {m.group(0) if m else 'no ctest summary'}")
copy = next((r["GBps"] for r in rows if r["bench"] == "copy"), None)
if copy:
    print(f"{'device copy bandwidth':40s} {copy:9.0f} GB/s (read + written)")
for r in rows:
    if r["bench"] in ("quantize", "dequantize"):
        name = f"{r['bench']} int{r['bits']}" + (" stochastic" if r["stochastic"] else "")
        ok = "ok" if r["vs_copy"] >= 0.7 else "BELOW GOAL"
        print(f"{name:40s} {r['GBps']:9.0f} GB/s  {100 * r['vs_copy']:5.1f}% of copy (goal >= 70%) {ok}")
for r in rows:
    if r["bench"] == "projector":
        ok = "ok" if r["ratio"] <= 1.3 else "ABOVE GOAL"
        name = f"projector {r['m']}x{r['n']} r{r['r']}"
        print(f"{name:40s} {r['ms']:9.3f} ms  {r['ratio']:5.2f}x its GEMMs (goal <= 1.3x) {ok}")
for r in rows:
    if r["bench"] == "train":
        name = f"train {r['model']} bf16 batch {r['batch']}x{r['seq']}"
        print(f"{name:40s} {r['tokens_per_s']:9.0f} tokens/s  MFU {100 * r['mfu']:4.1f}% of {r['peak_TFLOPs']:.0f} TFLOP/s"
              f" (cuBLAS bf16 GEMM here {r['gemm_TFLOPs']:.0f})")
PY
exit $status
