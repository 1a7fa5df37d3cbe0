// tests/cuda/gpu_test.hpp: what the `gpu` tests share: a fixture that skips cleanly
// when no CUDA device is present, and host <-> device copies for test data.
#pragma once

#include <dilocox/cuda/check.hpp>
#include <dilocox/cuda/memory.hpp>

#include <gtest/gtest.h>

#include <span>
#include <vector>

namespace dilocox::test {

class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
  }
};

template <class T>
cuda::DeviceBuffer<T> to_device(std::span<const T> host) {
  cuda::DeviceBuffer<T> d(host.size());
  if (!host.empty()) cuda::check(cudaMemcpy(d.data(), host.data(), host.size_bytes(), cudaMemcpyHostToDevice), "test", "upload");
  return d;
}

template <class T>
std::vector<T> to_host(const T* device, std::size_t n) {
  std::vector<T> h(n);
  if (n) cuda::check(cudaMemcpy(h.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost), "test", "download");
  return h;
}

}  // namespace dilocox::test
