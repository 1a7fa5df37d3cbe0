// bindings/torch/process_group_comm.hpp: ProcessGroupCommunicator, the Communicator
// concept over a torch.distributed process group (c10d::ProcessGroup), so a PyTorch job
// needs no MPI beside torch. Host buffers are wrapped as CPU tensors without a copy, so
// the group's backend must take CPU tensors (gloo; NCCL takes device buffers, which the
// outer loop does not hold yet). Every operation waits at most `timeout`, so a dead or
// stalled peer is a dilocox::Error naming the operation, never a hang; the group is
// unusable after one. Async forms run
// on a progress thread (AsyncCollectives). Not here: the outer loop (torch_outer_loop.hpp).
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/torch.h>

#include <dilocox/comm/communicator.hpp>
#include <dilocox/config.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

namespace dilocox::torch_binding {

class ProcessGroupCommunicator : public AsyncCollectives<ProcessGroupCommunicator> {
 public:
  ProcessGroupCommunicator(c10::intrusive_ptr<c10d::ProcessGroup> group, std::chrono::milliseconds timeout)
      : group_(std::move(group)), timeout_(timeout) {
    detail::require(static_cast<bool>(group_), "ProcessGroupCommunicator", "no process group");
    detail::require(timeout_.count() > 0, "ProcessGroupCommunicator", "the timeout must be positive");
    try {
      backend_ = group_->getBackendName();
    } catch (const std::exception&) {
      backend_ = "unnamed backend";
    }
  }

  int rank() const { return group_->getRank(); }
  int size() const { return group_->getSize(); }
  const std::string& backend() const { return backend_; }

  void allreduce_sum(std::span<float> x) {
    agree_on_size(x.size(), "allreduce_sum");
    if (x.empty()) return;
    std::vector<at::Tensor> t{wrap(x.data(), x.size(), at::kFloat)};
    finish(group_->allreduce(t), "allreduce_sum");
  }

  void allgather(std::span<const std::byte> send, std::span<std::byte> recv) {
    const auto n = send.size(), k = static_cast<std::size_t>(size());
    detail::require(recv.size() == n * k, "ProcessGroupCommunicator::allgather", "recv must hold size() blocks of send");
    agree_on_size(n, "allgather");
    if (n == 0) return;
    std::vector<at::Tensor> in{wrap(const_cast<std::byte*>(send.data()), n, at::kByte)};
    std::vector<std::vector<at::Tensor>> out(1);
    for (std::size_t r = 0; r < k; ++r) out[0].push_back(wrap(recv.data() + r * n, n, at::kByte));
    finish(group_->allgather(out, in), "allgather");
  }

  void sendrecv(std::span<const std::byte> send, int dest, std::span<std::byte> recv, int src) {
    detail::require(dest >= 0 && dest < size() && src >= 0 && src < size(), "ProcessGroupCommunicator::sendrecv",
                    "peer out of range");
    if (dest == rank() && src == rank()) {
      detail::require(send.size() == recv.size(), "ProcessGroupCommunicator::sendrecv", "sizes differ");
      if (!send.empty()) std::memcpy(recv.data(), send.data(), send.size());
      return;
    }
    std::vector<at::Tensor> out{wrap(const_cast<std::byte*>(send.data()), send.size(), at::kByte)};
    std::vector<at::Tensor> in{wrap(recv.data(), recv.size(), at::kByte)};
    auto r = group_->recv(in, src, sendrecv_tag);
    auto s = group_->send(out, dest, sendrecv_tag);
    finish(s, "sendrecv (send)");
    finish(r, "sendrecv (recv)");
  }

  void barrier() { finish(group_->barrier(), "barrier"); }

 private:
  static constexpr int sendrecv_tag = 0x0d1c;

  static at::Tensor wrap(void* p, std::size_t n, at::ScalarType type) {
    return torch::from_blob(p, {static_cast<std::int64_t>(n)}, torch::TensorOptions().dtype(type));
  }

  // Waits for `work`; a failure or the timeout becomes an Error naming the operation.
  void finish(const c10::intrusive_ptr<c10d::Work>& work, const char* op) const {
    try {
      work->wait(timeout_);
    } catch (const std::exception& e) {
      std::string what = e.what();
      if (const auto nl = what.find('\n'); nl != std::string::npos) what.resize(nl);  // c10's backtrace follows
      throw Error("ProcessGroupCommunicator::" + std::string(op) + " (rank " + std::to_string(rank()) + " of " +
                  std::to_string(size()) + ", " + backend() + ", timeout " +
                  detail::number(static_cast<double>(timeout_.count()) / 1000.0) + " s): " + what);
    }
  }

  // Every rank learns the smallest and largest size; all throw the same Error on a
  // mismatch instead of a truncated or hung collective.
  void agree_on_size(std::size_t n, const char* op) {
    std::int64_t v[2] = {static_cast<std::int64_t>(n), -static_cast<std::int64_t>(n)};
    std::vector<at::Tensor> t{wrap(v, 2, at::kLong)};
    finish(group_->allreduce(t, c10d::AllreduceOptions{c10d::ReduceOp::MAX}), op);
    detail::require(v[0] == -v[1], ("ProcessGroupCommunicator::" + std::string(op)).c_str(),
                    "ranks disagree on the message size (" + std::to_string(-v[1]) + " to " + std::to_string(v[0]) +
                        " elements)");
  }

  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  std::chrono::milliseconds timeout_;
  std::string backend_;
};

static_assert(Communicator<ProcessGroupCommunicator>);

}  // namespace dilocox::torch_binding
