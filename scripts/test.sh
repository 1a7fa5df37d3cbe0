#!/usr/bin/env bash
# The README's test command. Installs what is missing, then builds and runs:
#   1. the Release build (every CUDA target compiled for sm_90 when nvcc exists; their
#      `gpu` tests skip without a device; the torch extension) and all its tests (unit,
#      threads, MPI, packaging, trainer with its faults, examples, torch, and the `chaos`
#      label: once, here only),
#   2. the unit tests under AddressSanitizer + UndefinedBehaviorSanitizer,
#   3. the threaded tests (communicators, reducers, OuterLoop) under ThreadSanitizer,
#   4. the libFuzzer wire-decoder target for 60 s, when clang is present.
# MPI tests run in stage 1 under mpiexec (2-4 ranks, oversubscribed, root allowed).
# Build folders: build/, build-asan/, build-tsan/, build-fuzz/. Skips nothing silently: each
# stage prints its ctest summary, and the script fails if any stage fails.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh --torch --sites
jobs=$(nproc)

started=$SECONDS last=$SECONDS
# Each stage's banner also says how long the previous one took (CI has a time budget).
stage() { echo; echo "=== $* === (previous stage $((SECONDS - last)) s, total $((SECONDS - started)) s)"; last=$SECONDS; }

stage "Release build and tests"
# With nvcc present every CUDA target must compile for sm_90 (the `gpu` tests then skip
# without a device); DILOCOX_WITH_CUDA=ON makes a missing or broken toolchain an error.
cuda=(-DDILOCOX_WITH_CUDA=AUTO)
if command -v nvcc >/dev/null 2>&1 || [[ -x /usr/local/cuda/bin/nvcc ]]; then
  cuda=(-DDILOCOX_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90)
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "${cuda[@]}" >/dev/null
cmake --build build -j "$jobs"
echo "CUDA sources compiled: $(ninja -C build -t targets all 2>/dev/null | grep -c '\.cu\.o:' || true) (${cuda[*]})"
ctest --no-tests=error --test-dir build -j "$jobs" --output-on-failure

# The sanitizer builds: -O1 with line tables only. Their reports need file:line, not
# variables, and these flags compile faster than RelWithDebInfo's -O2 -g.
san=(-DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" -DDILOCOX_NATIVE=OFF)

stage "ASan + UBSan build and unit tests"
# (The convergence suite is not built here: it runs in stage 1 and is minutes of arithmetic.)
cmake -S . -B build-asan -G Ninja "${san[@]}" -DDILOCOX_SANITIZE=address,undefined \
  -DDILOCOX_BUILD_BENCH=OFF -DDILOCOX_BUILD_EXAMPLES=OFF -DDILOCOX_WITH_MPI=OFF -DDILOCOX_WITH_GLOO=OFF -DDILOCOX_WITH_CUDA=OFF \
  -DDILOCOX_BUILD_CONVERGENCE=OFF >/dev/null
cmake --build build-asan -j "$jobs"
# The known-answer convergence test (300 rounds of Eigen GEMMs, minutes under ASan) runs
# the code of the mode tests, which do run here; stage 1 runs it.
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --no-tests=error --test-dir build-asan -j "$jobs" -L "unit|threads" -E ReachesTheGlobalOptimum --output-on-failure

stage "TSan build and threaded tests"
cmake -S . -B build-tsan -G Ninja "${san[@]}" -DDILOCOX_SANITIZE=thread \
  -DDILOCOX_BUILD_BENCH=OFF -DDILOCOX_BUILD_EXAMPLES=OFF -DDILOCOX_WITH_MPI=OFF -DDILOCOX_WITH_GLOO=OFF -DDILOCOX_WITH_CUDA=OFF >/dev/null
# Every executable with `threads`-labelled tests: one left out would not run, silently.
cmake --build build-tsan -j "$jobs" --target test_comm test_reduce test_diloco test_sparse test_fragments test_adagc
# The known-answer convergence test runs 300 rounds of Eigen GEMMs (minutes under TSan);
# its threading is the same as the mode tests', which do run here.
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" ctest --no-tests=error --test-dir build-tsan -j "$jobs" -L threads \
  -E ReachesTheGlobalOptimum --output-on-failure

if command -v clang++ >/dev/null 2>&1; then
  stage "libFuzzer: wire decoder, ${DILOCOX_FUZZ_SECONDS:-60} s"
  cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
    -DDILOCOX_BUILD_TESTS=OFF -DDILOCOX_BUILD_BENCH=OFF -DDILOCOX_BUILD_EXAMPLES=OFF \
    -DDILOCOX_WITH_MPI=OFF -DDILOCOX_WITH_GLOO=OFF -DDILOCOX_WITH_CUDA=OFF -DDILOCOX_WITH_TORCH=OFF -DDILOCOX_BUILD_FUZZ=ON -DDILOCOX_FUZZ_SECONDS="${DILOCOX_FUZZ_SECONDS:-60}" >/dev/null
  cmake --build build-fuzz -j "$jobs"
  ctest --no-tests=error --test-dir build-fuzz -L fuzz --output-on-failure
else
  stage "libFuzzer skipped: clang++ not found"
fi
echo
echo "scripts/test.sh: all stages passed in $((SECONDS - started)) s"
