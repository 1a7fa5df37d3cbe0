// dilocox/comm/host_staged.hpp: HostStaged<C>, a Communicator over device memory built
// on a host transport C (MpiCommunicator, ThrottledLink<...>): each collective copies
// its device operands into page-locked host buffers, runs C's collective, and copies the
// result back. When the MPI library is CUDA-aware (mpi_cuda_aware()), pass_through
// hands the device pointers straight to C instead. The pinned buffers grow to the
// largest message and are reused. Not here: NCCL (nccl.hpp), the transports.
#pragma once

#include <cuda_runtime.h>

#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#include <mpi.h>
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif

#include <cstddef>
#include <span>
#include <string>

#include "dilocox/comm/communicator.hpp"
#include "dilocox/cuda/check.hpp"
#include "dilocox/cuda/memory.hpp"

namespace dilocox {

// Whether this MPI accepts device pointers (Open MPI's MPIX_Query_cuda_support: both
// built with CUDA support and running with it). False when it cannot tell.
inline bool mpi_cuda_aware() {
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
  return MPIX_Query_cuda_support() == 1;
#else
  return false;
#endif
}

template <Communicator C>
class HostStaged : public AsyncCollectives<HostStaged<C>> {
 public:
  // `inner` must outlive this object. pass_through: give device pointers to `inner`.
  explicit HostStaged(C& inner, bool pass_through = mpi_cuda_aware()) : inner_(inner), pass_through_(pass_through) {}

  int rank() const { return inner_.rank(); }
  int size() const { return inner_.size(); }
  bool pass_through() const { return pass_through_; }
  C& inner() { return inner_; }

  // x: device memory, summed in place over the ranks.
  void allreduce_sum(std::span<float> x) {
    if (pass_through_) return inner_.allreduce_sum(x);
    send_.reserve(x.size_bytes());
    auto h = std::span<float>(reinterpret_cast<float*>(send_.data()), x.size());
    down(h.data(), x.data(), x.size_bytes());
    inner_.allreduce_sum(h);
    up(x.data(), h.data(), x.size_bytes());
  }

  // send, recv: device memory.
  void allgather(std::span<const std::byte> send, std::span<std::byte> recv) {
    if (pass_through_) return inner_.allgather(send, recv);
    send_.reserve(send.size());
    recv_.reserve(recv.size());
    down(send_.data(), send.data(), send.size());
    inner_.allgather(std::span<const std::byte>(send_.data(), send.size()), recv_.span(recv.size()));
    up(recv.data(), recv_.data(), recv.size());
  }

  void sendrecv(std::span<const std::byte> send, int dest, std::span<std::byte> recv, int src) {
    if (pass_through_) return inner_.sendrecv(send, dest, recv, src);
    send_.reserve(send.size());
    recv_.reserve(recv.size());
    down(send_.data(), send.data(), send.size());
    inner_.sendrecv(std::span<const std::byte>(send_.data(), send.size()), dest, recv_.span(recv.size()), src);
    up(recv.data(), recv_.data(), recv.size());
  }

  void barrier() { inner_.barrier(); }

 private:
  void down(void* host, const void* device, std::size_t bytes) {
    if (bytes == 0) return;
    cuda::check(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream_.get()), "HostStaged", "copy to host");
    stream_.synchronize("HostStaged");
  }
  void up(void* device, const void* host, std::size_t bytes) {
    if (bytes == 0) return;
    cuda::check(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, stream_.get()), "HostStaged", "copy to device");
    stream_.synchronize("HostStaged");
  }

  C& inner_;
  bool pass_through_;
  cuda::Stream stream_;
  cuda::PinnedBuffer<std::byte> send_, recv_;  // page-locked staging, grown to the largest message
};

}  // namespace dilocox
