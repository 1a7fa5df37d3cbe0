// dilocox/comm/mpi.hpp: MpiCommunicator, the Communicator over Open MPI between
// processes. Every call goes through span wrappers: counts and datatypes come from
// the argument, and messages past INT_MAX elements are split. Errors come back as
// dilocox::Error (the duplicated communicator uses MPI_ERRORS_RETURN). Async forms
// run on a progress thread, so MPI must be initialized with MPI_THREAD_MULTIPLE:
// checked in the constructor. Not here: CUDA-aware paths (cuda/), NCCL (comm/nccl.hpp).
#pragma once

#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1  // the C API only: Open MPI's deprecated C++ bindings are not used
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>

#include "dilocox/comm/communicator.hpp"
#include "dilocox/config.hpp"

namespace dilocox {

namespace detail {
template <class T>
MPI_Datatype mpi_type() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, float>) return MPI_FLOAT;
  else if constexpr (std::is_same_v<U, double>) return MPI_DOUBLE;
  else if constexpr (std::is_same_v<U, std::byte>) return MPI_BYTE;
  else if constexpr (std::is_same_v<U, std::uint64_t>) return MPI_UINT64_T;
  else if constexpr (std::is_same_v<U, std::int32_t>) return MPI_INT32_T;
  else static_assert(sizeof(T) == 0, "no MPI datatype for this element type");
}

// Throws Error("<owner>::<what>: <MPI's message>") unless rc is MPI_SUCCESS.
inline void mpi_check(int rc, const char* what, const char* owner = "MpiCommunicator") {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw Error(std::string(owner) + "::" + what + ": " + std::string(text, static_cast<std::size_t>(len)));
}

inline constexpr std::size_t mpi_max_count = INT_MAX;

// One small allreduce on comm: every rank learns the smallest and largest n, and all
// throw the same Error on a mismatch (instead of a truncated or hung collective).
inline void agree_on_size(MPI_Comm comm, std::size_t n, const char* owner, const char* op, const char* unit) {
  const auto v = static_cast<std::int64_t>(n);
  std::int64_t mine[2] = {v, -v}, most[2] = {0, 0};  // max of n and of -n: the max and -min
  mpi_check(MPI_Allreduce(mine, most, 2, MPI_INT64_T, MPI_MAX, comm), op, owner);
  require(most[0] == -most[1], (std::string(owner) + "::" + op).c_str(),
          "ranks disagree on the message size (" + std::to_string(-most[1]) + " to " + std::to_string(most[0]) + " " +
              unit + ")");
}

inline const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    default: return "MPI_THREAD_MULTIPLE";
  }
}
}  // namespace detail

class MpiCommunicator : public AsyncCollectives<MpiCommunicator> {
 public:
  // Duplicates `comm` (the caller keeps ownership of it).
  explicit MpiCommunicator(MPI_Comm comm) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    detail::require(initialized != 0, "MpiCommunicator", "MPI is not initialized (call MPI_Init_thread first)");
    int provided = MPI_THREAD_SINGLE;
    MPI_Query_thread(&provided);
    detail::require(provided == MPI_THREAD_MULTIPLE, "MpiCommunicator",
                    std::string("MPI runs at ") + detail::thread_level_name(provided) +
                        "; background reduction needs MPI_THREAD_MULTIPLE: initialize with "
                        "MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided)");
    detail::mpi_check(MPI_Comm_dup(comm, &comm_), "MPI_Comm_dup");
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;
  ~MpiCommunicator() {
    if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }

  int rank() const { return rank_; }
  int size() const { return size_; }
  MPI_Comm native() const { return comm_; }

  void barrier() { detail::mpi_check(MPI_Barrier(comm_), "barrier"); }

  // Note: MPI's reduction order is its own; dilocox's reducers (reduce.hpp) use
  // allgather or sendrecv where every rank must get bit-identical sums.
  void allreduce_sum(std::span<float> x) {
    for (std::size_t off = 0; off < x.size(); off += detail::mpi_max_count) {
      const auto part = x.subspan(off, std::min(detail::mpi_max_count, x.size() - off));
      detail::mpi_check(MPI_Allreduce(MPI_IN_PLACE, part.data(), static_cast<int>(part.size()),
                                      detail::mpi_type<float>(), MPI_SUM, comm_),
                        "allreduce_sum");
    }
  }

  void allgather(std::span<const std::byte> send, std::span<std::byte> recv) {
    const std::size_t n = send.size();
    detail::require(recv.size() == n * static_cast<std::size_t>(size_), "MpiCommunicator::allgather",
                    "receive buffer has " + std::to_string(recv.size()) + " bytes, needs " +
                        std::to_string(n * static_cast<std::size_t>(size_)));
    detail::agree_on_size(comm_, n, "MpiCommunicator", "allgather", "bytes");
    if (n <= detail::mpi_max_count) {
      detail::mpi_check(MPI_Allgather(send.data(), static_cast<int>(n), detail::mpi_type<std::byte>(), recv.data(),
                                      static_cast<int>(n), detail::mpi_type<std::byte>(), comm_),
                        "allgather");
      return;
    }
    for (int k = 0; k < size_; ++k) {  // too large for one call: one broadcast per rank
      auto block = recv.subspan(static_cast<std::size_t>(k) * n, n);
      if (k == rank_) std::copy(send.begin(), send.end(), block.begin());
      for (std::size_t off = 0; off < n; off += detail::mpi_max_count) {
        const auto part = block.subspan(off, std::min(detail::mpi_max_count, n - off));
        detail::mpi_check(MPI_Bcast(part.data(), static_cast<int>(part.size()), detail::mpi_type<std::byte>(), k, comm_),
                          "allgather");
      }
    }
  }

  void sendrecv(std::span<const std::byte> send, int dest, std::span<std::byte> recv, int src) {
    detail::require(dest >= 0 && dest < size_ && src >= 0 && src < size_, "MpiCommunicator::sendrecv",
                    "peer outside the communicator");
    const std::size_t n = std::max(send.size(), recv.size());
    for (std::size_t off = 0; off < n || off == 0; off += detail::mpi_max_count) {
      const auto s = off < send.size() ? send.subspan(off, std::min(detail::mpi_max_count, send.size() - off))
                                       : std::span<const std::byte>{};
      const auto r = off < recv.size() ? recv.subspan(off, std::min(detail::mpi_max_count, recv.size() - off))
                                       : std::span<std::byte>{};
      MPI_Status status;
      detail::mpi_check(MPI_Sendrecv(s.data(), static_cast<int>(s.size()), detail::mpi_type<std::byte>(), dest, tag,
                                     r.data(), static_cast<int>(r.size()), detail::mpi_type<std::byte>(), src, tag,
                                     comm_, &status),
                        "sendrecv");
      int got = 0;
      MPI_Get_count(&status, detail::mpi_type<std::byte>(), &got);
      detail::require(static_cast<std::size_t>(got) == r.size(), "MpiCommunicator::sendrecv",
                      "received " + std::to_string(got) + " bytes from rank " + std::to_string(src) + ", expected " +
                          std::to_string(r.size()));
      if (n == 0) break;
    }
  }

 private:
  static constexpr int tag = 0x0d1c;

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
};

}  // namespace dilocox
