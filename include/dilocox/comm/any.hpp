// dilocox/comm/any.hpp: AnyCommunicator, a non-owning, type-erased reference to any
// Communicator (thread, MPI, throttled, a user's own). Compressors take it, so a
// compressor is an ordinary class, written once for every transport; the cost is one
// indirect call per collective. It satisfies the Communicator concept itself.
// Not here: any transport (comm/thread.hpp, comm/mpi.hpp, ...).
#pragma once

#include <concepts>
#include <cstddef>
#include <span>

#include "dilocox/comm/communicator.hpp"

namespace dilocox {

class AnyCommunicator {
 public:
  template <Communicator C>
    requires(!std::same_as<std::remove_cv_t<C>, AnyCommunicator>)
  explicit AnyCommunicator(C& comm) : self_(&comm), ops_(&ops_for<C>) {}

  int rank() const { return ops_->rank(self_); }
  int size() const { return ops_->size(self_); }
  void allreduce_sum(std::span<float> x) { ops_->allreduce_sum(self_, x); }
  void allgather(std::span<const std::byte> send, std::span<std::byte> recv) { ops_->allgather(self_, send, recv); }
  void sendrecv(std::span<const std::byte> send, int dest, std::span<std::byte> recv, int src) {
    ops_->sendrecv(self_, send, dest, recv, src);
  }
  void barrier() { ops_->barrier(self_); }
  Request iallreduce_sum(std::span<float> x) { return ops_->iallreduce_sum(self_, x); }
  Request iallgather(std::span<const std::byte> send, std::span<std::byte> recv) {
    return ops_->iallgather(self_, send, recv);
  }

 private:
  struct Ops {
    int (*rank)(void*);
    int (*size)(void*);
    void (*allreduce_sum)(void*, std::span<float>);
    void (*allgather)(void*, std::span<const std::byte>, std::span<std::byte>);
    void (*sendrecv)(void*, std::span<const std::byte>, int, std::span<std::byte>, int);
    void (*barrier)(void*);
    Request (*iallreduce_sum)(void*, std::span<float>);
    Request (*iallgather)(void*, std::span<const std::byte>, std::span<std::byte>);
  };

  template <class C>
  static C& as(void* p) {
    return *static_cast<C*>(p);
  }
  template <class C>
  static constexpr Ops ops_for = {
      [](void* p) { return static_cast<int>(as<C>(p).rank()); },
      [](void* p) { return static_cast<int>(as<C>(p).size()); },
      [](void* p, std::span<float> x) { as<C>(p).allreduce_sum(x); },
      [](void* p, std::span<const std::byte> s, std::span<std::byte> r) { as<C>(p).allgather(s, r); },
      [](void* p, std::span<const std::byte> s, int d, std::span<std::byte> r, int src) {
        as<C>(p).sendrecv(s, d, r, src);
      },
      [](void* p) { as<C>(p).barrier(); },
      [](void* p, std::span<float> x) { return as<C>(p).iallreduce_sum(x); },
      [](void* p, std::span<const std::byte> s, std::span<std::byte> r) { return as<C>(p).iallgather(s, r); },
  };

  void* self_;
  const Ops* ops_;
};

static_assert(Communicator<AnyCommunicator>);

}  // namespace dilocox
