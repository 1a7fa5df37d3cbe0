// dilocox/cuda/error_feedback.cuh: the error-feedback residual of one tensor in device
// memory: the same contract as ErrorFeedback (error_feedback.hpp), with device views and
// an optional stream; nothing synchronizes the host. Not here: the host version.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "dilocox/cuda/check.hpp"
#include "dilocox/cuda/memory.hpp"
#include "dilocox/tensor.hpp"

namespace dilocox::cuda {

namespace kernels {
// y[i] = a[i] + sign * b[i], four elements per step when all three are 16-byte aligned.
// y may be a (add_to updates x in place), so neither is __restrict__.
template <class T>
__global__ void add_scaled(T* y, const T* a, const T* __restrict__ b, T sign,
                           std::size_t n, bool vec) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  std::size_t t = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (vec) {
    const std::size_t nv = n / 4;
    for (std::size_t j = t; j < nv; j += stride) {
      const float4 u = reinterpret_cast<const float4*>(a)[j], v = reinterpret_cast<const float4*>(b)[j];
      reinterpret_cast<float4*>(y)[j] = make_float4(u.x + sign * v.x, u.y + sign * v.y, u.z + sign * v.z, u.w + sign * v.w);
    }
    for (std::size_t i = 4 * nv + t; i < n; i += stride) y[i] = a[i] + sign * b[i];
  } else {
    for (std::size_t i = t; i < n; i += stride) y[i] = a[i] + sign * b[i];
  }
}

inline void launch_add_scaled(float* y, const float* a, const float* b, float sign, std::size_t n, cudaStream_t s,
                              const char* where) {
  if (n == 0) return;
  const bool vec = ((reinterpret_cast<std::uintptr_t>(y) | reinterpret_cast<std::uintptr_t>(a) |
                     reinterpret_cast<std::uintptr_t>(b)) & 15) == 0;
  const std::size_t work = vec ? n / 4 + 1 : n;
  const unsigned threads = 256;
  add_scaled<float><<<grid_size(work, threads), threads, 0, s>>>(y, a, b, sign, n, vec);
  check_launch(where);
}
}  // namespace kernels

class ErrorFeedback {
 public:
  explicit ErrorFeedback(std::size_t n) : e_(n) { e_.zero(); }

  std::size_t size() const { return e_.size(); }

  // x += e
  void add_to(TensorView<float, cuda_space> x, cudaStream_t s = nullptr) const {
    check_size(x.shape.numel(), "add_to");
    kernels::launch_add_scaled(x.data, x.data, e_.data(), 1.0f, size(), s, "cuda::ErrorFeedback::add_to");
  }

  // e = x - sent
  void update(TensorView<const float, cuda_space> x, TensorView<const float, cuda_space> sent,
              cudaStream_t s = nullptr) {
    check_size(x.shape.numel(), "update");
    check_size(sent.shape.numel(), "update");
    kernels::launch_add_scaled(e_.data(), x.data, sent.data, -1.0f, size(), s, "cuda::ErrorFeedback::update");
  }

  TensorView<const float, cuda_space> residual() const { return e_.view(); }
  TensorView<float, cuda_space> residual() { return e_.view(); }
  void reset(cudaStream_t s = nullptr) { e_.zero(s); }

 private:
  void check_size(std::size_t n, const char* what) const {
    detail::require(n == e_.size(), (std::string("cuda::ErrorFeedback::") + what).c_str(),
                    "view has " + std::to_string(n) + " elements, residual has " + std::to_string(e_.size()));
  }
  DeviceBuffer<float> e_;  // (n) device
};

}  // namespace dilocox::cuda
