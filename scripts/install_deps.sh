#!/usr/bin/env bash
# Installs the Debian packages dilocox needs to build, test and benchmark.
# Skips everything already installed; runs apt-get update at most once.
# Does not install CUDA (the toolkit is optional; CMake detects it).
set -euo pipefail

packages=(
  cmake ninja-build g++ clang libclang-rt-14-dev
  libeigen3-dev libgtest-dev libgmock-dev googletest libbenchmark-dev
  libcli11-dev nlohmann-json3-dev
  libopenmpi-dev openmpi-bin
  python3-torch python3-numpy
  gnuplot-nox
)
# npm may come with a nodejs from elsewhere; ask Debian for it only when absent.
command -v npm >/dev/null 2>&1 || packages+=(npm)
if [[ "${1:-}" == "--print" ]]; then printf '%s\n' "${packages[@]}"; exit 0; fi

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
