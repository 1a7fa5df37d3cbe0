#!/usr/bin/env bash
# Installs the Debian packages dilocox needs, skipping those already installed
# (apt-get update runs only when something is missing).
#   scripts/install_deps.sh          build, test and demo: compilers, CMake, Eigen, OpenBLAS
#                                    (the trainer's matmuls), GoogleTest, Google Benchmark,
#                                    Open MPI, clang (fuzzing), CLI11, nlohmann-json, python3
#                                    and gnuplot (demo table, plots)
#   scripts/install_deps.sh --bench  also what the side-by-side benchmarks use: Debian's
#                                    PyTorch and numpy, and OpenBLAS (pthread build), which
#                                    Debian's torch (BLAS_INFO=generic) then loads through
#                                    the libblas.so.3 / liblapack.so.3 alternatives instead
#                                    of the reference BLAS no PyTorch user runs
#   scripts/install_deps.sh --torch  also what the torch extension (bindings/torch) builds and
#                                    tests with: libtorch, pybind11 and the same torch for Python
#   scripts/install_deps.sh --sites  also what GlooCommunicator (comm/gloo.hpp) and its tests
#                                    use: Gloo (TCP transport, Redis store), hiredis, redis-server
#   scripts/install_deps.sh --print  lists the packages and exits
# The options combine: scripts/install_deps.sh --torch --sites.
# Does not install CUDA (optional; CMake detects nvcc).
set -euo pipefail

packages=(
  cmake ninja-build g++ clang libclang-rt-14-dev
  libeigen3-dev libopenblas-dev libgtest-dev libgmock-dev googletest libbenchmark-dev
  libcli11-dev nlohmann-json3-dev
  libopenmpi-dev openmpi-bin
  python3 gnuplot-nox
)
bench_packages=(python3-torch python3-numpy libopenblas0-pthread)
torch_packages=(libtorch-dev pybind11-dev python3-torch)
sites_packages=(libgloo-dev libhiredis-dev redis-server)

# Which BLAS libblas.so.3 resolves to (the side-by-side scripts refuse the reference one).
report_blas() {
  local triplet
  triplet=$(gcc -dumpmachine 2>/dev/null || echo x86_64-linux-gnu)
  echo "install_deps: libblas.so.3 -> $(readlink -f "/usr/lib/$triplet/libblas.so.3" 2>/dev/null || echo none)"
}

for option in "$@"; do
  case "$option" in
    --bench) packages+=("${bench_packages[@]}"); trap report_blas EXIT ;;
    --torch) packages+=("${torch_packages[@]}") ;;
    --sites) packages+=("${sites_packages[@]}") ;;
    --print) printf '%s\n' "${packages[@]}" "${bench_packages[@]}" "${torch_packages[@]}" "${sites_packages[@]}"; exit 0 ;;
    *) echo "install_deps: unknown option '$option' (use --bench, --torch, --sites or --print)" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]} == 0)); then
  echo "install_deps: all ${#packages[@]} packages present"
  exit 0
fi
echo "install_deps: installing ${missing[*]}"
sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -q
"${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
