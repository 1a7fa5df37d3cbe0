// dilocox/comm/nccl.hpp: NcclCommunicator, the Communicator over NCCL for the `cluster`
// communicator (the fast links inside a cluster). Every span points into device memory.
// Bootstrapped through MPI: rank 0 creates the NCCL id and MPI broadcasts it, so it
// needs an initialized MPI and one GPU per rank. Blocking collectives enqueue on the
// communicator's stream and wait for it; enqueue_* forms take a stream and never
// synchronize; i* forms run on a progress thread like every transport's.
// Not here: the inter-cluster path (MpiCommunicator, staged through host memory by
// comm/host_staged.hpp when MPI is not CUDA-aware).
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <cstddef>
#include <span>
#include <string>

#include "dilocox/comm/communicator.hpp"
#include "dilocox/comm/mpi.hpp"
#include "dilocox/config.hpp"
#include "dilocox/cuda/check.hpp"
#include "dilocox/cuda/memory.hpp"

namespace dilocox {

namespace detail {
inline void nccl_check(ncclResult_t rc, const char* what) {
  if (rc == ncclSuccess) return;
  throw Error(std::string("NcclCommunicator::") + what + ": " + ncclGetErrorString(rc));
}
template <class T>
ncclDataType_t nccl_type() {
  if constexpr (std::is_same_v<std::remove_cv_t<T>, float>) return ncclFloat32;
  else if constexpr (std::is_same_v<std::remove_cv_t<T>, std::byte>) return ncclUint8;
  else static_assert(sizeof(T) == 0, "no NCCL datatype for this element type");
}
}  // namespace detail

class NcclCommunicator : public AsyncCollectives<NcclCommunicator> {
 public:
  // One rank of `comm` per GPU; `device` < 0 keeps the current device. The caller keeps
  // ownership of comm (it is duplicated for size checks).
  explicit NcclCommunicator(MPI_Comm comm, int device = -1) : device_(select_device(device)) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    detail::require(initialized != 0, "NcclCommunicator", "MPI is not initialized (NCCL is bootstrapped through MPI)");
    detail::mpi_check(MPI_Comm_dup(comm, &mpi_), "MPI_Comm_dup", "NcclCommunicator");
    MPI_Comm_set_errhandler(mpi_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(mpi_, &rank_);
    MPI_Comm_size(mpi_, &size_);
    ncclUniqueId id{};
    if (rank_ == 0) detail::nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    detail::mpi_check(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, mpi_), "MPI_Bcast of the NCCL id", "NcclCommunicator");
    detail::nccl_check(ncclCommInitRank(&comm_, size_, id, rank_), "ncclCommInitRank");
    scratch_.resize(1);
  }
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;
  ~NcclCommunicator() {
    if (comm_) ncclCommDestroy(comm_);  // before stream_, a member, goes
    if (mpi_ != MPI_COMM_NULL) MPI_Comm_free(&mpi_);
  }

  int rank() const { return rank_; }
  int size() const { return size_; }
  int device() const { return device_; }
  cudaStream_t stream() const { return stream_.get(); }
  ncclComm_t native() const { return comm_; }

  // Enqueued forms: no host synchronization.
  void enqueue_allreduce_sum(std::span<float> x, cudaStream_t s) {
    detail::nccl_check(ncclAllReduce(x.data(), x.data(), x.size(), detail::nccl_type<float>(), ncclSum, comm_, s),
                       "allreduce_sum");
  }
  void enqueue_allgather(std::span<const std::byte> send, std::span<std::byte> recv, cudaStream_t s) {
    detail::require(recv.size() == send.size() * static_cast<std::size_t>(size_), "NcclCommunicator::allgather",
                    "receive buffer has " + std::to_string(recv.size()) + " bytes, needs " +
                        std::to_string(send.size() * static_cast<std::size_t>(size_)));
    detail::nccl_check(ncclAllGather(send.data(), recv.data(), send.size(), detail::nccl_type<std::byte>(), comm_, s),
                       "allgather");
  }
  void enqueue_sendrecv(std::span<const std::byte> send, int dest, std::span<std::byte> recv, int src, cudaStream_t s) {
    detail::require(dest >= 0 && dest < size_ && src >= 0 && src < size_, "NcclCommunicator::sendrecv",
                    "peer outside the communicator");
    detail::nccl_check(ncclGroupStart(), "sendrecv");
    detail::nccl_check(ncclSend(send.data(), send.size(), ncclUint8, dest, comm_, s), "sendrecv");
    detail::nccl_check(ncclRecv(recv.data(), recv.size(), ncclUint8, src, comm_, s), "sendrecv");
    detail::nccl_check(ncclGroupEnd(), "sendrecv");
  }

  // Blocking forms (the Communicator concept): enqueue on stream(), then wait for it.
  void allreduce_sum(std::span<float> x) {
    // A size mismatch would hang NCCL: refuse it on every rank.
    detail::agree_on_size(mpi_, x.size(), "NcclCommunicator", "allreduce_sum", "elements");
    enqueue_allreduce_sum(x, stream());
    wait("allreduce_sum");
  }
  void allgather(std::span<const std::byte> send, std::span<std::byte> recv) {
    detail::agree_on_size(mpi_, send.size(), "NcclCommunicator", "allgather", "bytes");
    enqueue_allgather(send, recv, stream());
    wait("allgather");
  }
  void sendrecv(std::span<const std::byte> send, int dest, std::span<std::byte> recv, int src) {
    enqueue_sendrecv(send, dest, recv, src, stream());
    wait("sendrecv");
  }
  void barrier() {
    enqueue_allreduce_sum(std::span<float>(scratch_.data(), 1), stream());
    wait("barrier");
  }

 private:
  // Makes `device` current (< 0: keeps the current one) before the stream is created.
  static int select_device(int device) {
    if (device >= 0) cuda::check(cudaSetDevice(device), "NcclCommunicator", "cudaSetDevice");
    int current = 0;
    cuda::check(cudaGetDevice(&current), "NcclCommunicator", "cudaGetDevice");
    return current;
  }
  void wait(const char* what) { stream_.synchronize((std::string("NcclCommunicator::") + what).c_str()); }

  int device_;           // first: selected before the stream is created on it
  cuda::Stream stream_;  // destroyed after the destructor has freed comm_
  MPI_Comm mpi_ = MPI_COMM_NULL;
  ncclComm_t comm_ = nullptr;
  int rank_ = 0, size_ = 1;
  cuda::DeviceBuffer<float> scratch_;  // (1) device: the barrier's operand
};

}  // namespace dilocox
