// dilocox/cuda/check.hpp: CUDA runtime status codes turned into dilocox::Error
// ("cuda::quantize: cudaMemcpyAsync: invalid argument"), launch checks and grid sizes,
// and device_available() for tests that skip without a GPU. Host code only: compiles
// with g++ or nvcc against the CUDA toolkit's headers. Not here: cuBLAS and cuSOLVER
// (blas.hpp), NCCL (comm/nccl.hpp).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <string>

#include "dilocox/config.hpp"

namespace dilocox::cuda {

// Throws Error("<where>: <what>: <CUDA's message>") unless rc is cudaSuccess.
inline void check(cudaError_t rc, const char* where, const char* what) {
  if (rc == cudaSuccess) return;
  throw Error(std::string(where) + ": " + what + ": " + cudaGetErrorString(rc));
}

// Whether a usable CUDA device exists (clears the error a failed query leaves behind).
inline bool device_available() {
  int n = 0;
  const cudaError_t rc = cudaGetDeviceCount(&n);
  if (rc != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return n > 0;
}

// Checks a kernel launch (bad configuration, no device) without synchronizing.
inline void check_launch(const char* where) { check(cudaGetLastError(), where, "kernel launch"); }

// Blocks for `items` work items at `per_block` each, for grid-stride kernels: at least
// one, at most 65535.
inline unsigned grid_size(std::size_t items, std::size_t per_block) {
  return static_cast<unsigned>(std::clamp<std::size_t>((items + per_block - 1) / per_block, 1, 65535));
}

}  // namespace dilocox::cuda
