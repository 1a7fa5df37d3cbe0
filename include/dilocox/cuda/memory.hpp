// dilocox/cuda/memory.hpp: owning buffers for the CUDA path: DeviceBuffer<T>
// (cudaMalloc), PinnedBuffer<T> (cudaMallocHost, for asynchronous copies and for
// staging messages through host memory) and Stream. Move-only RAII; sizes in elements.
// Host code.
// Not here: views (MatrixView<T, cuda_space>, TensorView<T, cuda_space> in tensor.hpp).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <span>
#include <string>
#include <utility>

#include "dilocox/cuda/check.hpp"
#include "dilocox/tensor.hpp"

namespace dilocox::cuda {

template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t n) { resize(n); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  ~DeviceBuffer() {
    if (p_) cudaFree(p_);
  }

  // Reallocates (contents lost) unless the size is unchanged.
  void resize(std::size_t n) {
    if (n == n_) return;
    if (p_) cudaFree(std::exchange(p_, nullptr));
    n_ = 0;
    if (n) check(cudaMalloc(&p_, n * sizeof(T)), "DeviceBuffer", ("cudaMalloc of " + std::to_string(n * sizeof(T)) + " bytes").c_str());
    n_ = n;
  }
  void zero(cudaStream_t s = nullptr) {
    if (n_) check(cudaMemsetAsync(p_, 0, n_ * sizeof(T), s), "DeviceBuffer", "cudaMemsetAsync");
  }

  T* data() { return p_; }
  const T* data() const { return p_; }
  std::size_t size() const { return n_; }
  TensorView<T, cuda_space> view() { return {p_, {n_}}; }
  TensorView<const T, cuda_space> view() const { return {p_, {n_}}; }

 private:
  T* p_ = nullptr;  // (n_) device
  std::size_t n_ = 0;
};

template <class T>
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(std::size_t n) { resize(n); }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  PinnedBuffer(PinnedBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  ~PinnedBuffer() {
    if (p_) cudaFreeHost(p_);
  }

  // Grows (contents lost) when n exceeds the capacity; never shrinks.
  void reserve(std::size_t n) {
    if (n <= n_) return;
    if (p_) cudaFreeHost(std::exchange(p_, nullptr));
    n_ = 0;
    check(cudaMallocHost(&p_, n * sizeof(T)), "PinnedBuffer", ("cudaMallocHost of " + std::to_string(n * sizeof(T)) + " bytes").c_str());
    n_ = n;
  }
  void resize(std::size_t n) { reserve(n); }

  T* data() { return p_; }
  const T* data() const { return p_; }
  std::size_t size() const { return n_; }
  std::span<T> span(std::size_t n) { return {p_, n}; }

 private:
  T* p_ = nullptr;  // (n_) page-locked host
  std::size_t n_ = 0;
};

// An owned non-blocking stream (destroyed after synchronizing).
class Stream {
 public:
  Stream() { check(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), "Stream", "cudaStreamCreate"); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream() {
    if (s_) {
      cudaStreamSynchronize(s_);
      cudaStreamDestroy(s_);
    }
  }
  cudaStream_t get() const { return s_; }
  void synchronize(const char* where) const { check(cudaStreamSynchronize(s_), where, "cudaStreamSynchronize"); }

 private:
  cudaStream_t s_ = nullptr;
};

// Asynchronous copies on `s` between spans of the same element count.
template <class T>
void copy_to_device(T* dst, std::span<const T> src, cudaStream_t s, const char* where) {
  check(cudaMemcpyAsync(dst, src.data(), src.size_bytes(), cudaMemcpyHostToDevice, s), where, "cudaMemcpyAsync to device");
}
template <class T>
void copy_to_host(std::span<T> dst, const T* src, cudaStream_t s, const char* where) {
  check(cudaMemcpyAsync(dst.data(), src, dst.size_bytes(), cudaMemcpyDeviceToHost, s), where, "cudaMemcpyAsync to host");
}

}  // namespace dilocox::cuda
