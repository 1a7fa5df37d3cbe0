// dilocox/cuda/check.hpp: CUDA runtime, cuBLAS and cuSOLVER status codes turned into
// dilocox::Error ("cuda::quantize: cudaMemcpyAsync: invalid argument"), and
// device_available() for tests that skip without a GPU. Host code only: compiles with
// g++ or nvcc against the CUDA toolkit's headers. Not here: NCCL (comm/nccl.hpp).
#pragma once

#include <cuda_runtime.h>

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

}  // namespace dilocox::cuda
