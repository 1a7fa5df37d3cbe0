// reference_trainer/pipeline/stage_link.hpp: the messages between the pipeline stages
// of one replica over MPI (the `cluster` communicator, where rank = stage):
// activations forward, their gradients backward, the tied-embedding gradient between
// the first and the last stage, and small reductions of step statistics. Sends are
// non-blocking from copies (one buffer per activation slot), receives block; counts
// come from the spans (every message is float). Errors become dilocox::Error.
#pragma once

#include <dilocox/comm/mpi.hpp>
#include <dilocox/config.hpp>

#include <mpi.h>

#include <algorithm>
#include <span>
#include <string>
#include <vector>

namespace dilocox::trainer {

namespace detail {
inline void mpi_ok(int rc, const char* what) { dilocox::detail::mpi_check(rc, what, "StageLink"); }
template <class T>
int mpi_count(std::span<T> s) {
  dilocox::detail::require(s.size() <= static_cast<std::size_t>(INT32_MAX), "StageLink", "message too large");
  return static_cast<int>(s.size());
}
}  // namespace detail

class StageLink {
 public:
  // comm: the stages of one replica, rank = stage. slots: activation buffers per direction.
  StageLink(MPI_Comm comm, int slots, std::size_t activation_floats) : comm_(comm) {
    MPI_Comm_rank(comm_, &stage_);
    MPI_Comm_size(comm_, &stages_);
    const auto n = static_cast<std::size_t>(std::max(slots, 1));
    for (auto* side : {&fwd_, &bwd_}) {
      side->buffers.assign(n, std::vector<float>(activation_floats));
      side->requests.assign(n, MPI_REQUEST_NULL);
    }
  }
  StageLink(const StageLink&) = delete;
  StageLink& operator=(const StageLink&) = delete;
  ~StageLink() {
    for (auto* side : {&fwd_, &bwd_})
      for (auto& r : side->requests)
        if (r != MPI_REQUEST_NULL) MPI_Wait(&r, MPI_STATUS_IGNORE);
  }

  int stage() const { return stage_; }
  int stages() const { return stages_; }

  void send_forward(std::span<const float> act, int micro) { post(fwd_, act, stage_ + 1, tag(micro, 0)); }
  void recv_forward(std::span<float> act, int micro) { recv(act, stage_ - 1, tag(micro, 0)); }
  void send_backward(std::span<const float> grad, int micro) { post(bwd_, grad, stage_ - 1, tag(micro, 1)); }
  void recv_backward(std::span<float> grad, int micro) { recv(grad, stage_ + 1, tag(micro, 1)); }

  void wait_sends() {
    for (auto* side : {&fwd_, &bwd_})
      for (auto& r : side->requests) detail::mpi_ok(MPI_Wait(&r, MPI_STATUS_IGNORE), "wait");
  }

  // g <- g(first stage) + g(last stage) on both: the two shares of the tied embedding's
  // gradient, added in the same order on both ranks so the copies stay identical.
  void sum_tied(std::span<float> g) {
    if (stages_ == 1 || (stage_ != 0 && stage_ != stages_ - 1)) return;
    const int peer = stage_ == 0 ? stages_ - 1 : 0;
    other_.resize(g.size());
    detail::mpi_ok(MPI_Sendrecv(g.data(), detail::mpi_count(g), MPI_FLOAT, peer, tied_tag, other_.data(),
                                detail::mpi_count(g), MPI_FLOAT, peer, tied_tag, comm_, MPI_STATUS_IGNORE),
                   "tied embedding exchange");
    const float* first = stage_ == 0 ? g.data() : other_.data();
    const float* last = stage_ == 0 ? other_.data() : g.data();
    for (std::size_t i = 0; i < g.size(); ++i) g[i] = first[i] + last[i];
  }

  // The last stage's copy of the tied embedding <- the first stage's (after an outer
  // round changed the first stage's copy).
  void copy_tied(std::span<float> w) {
    if (stages_ == 1) return;
    if (stage_ == 0)
      detail::mpi_ok(MPI_Send(w.data(), detail::mpi_count(w), MPI_FLOAT, stages_ - 1, tied_tag + 1, comm_), "send tied");
    else if (stage_ == stages_ - 1)
      recv(w, 0, tied_tag + 1);
  }

  // Element-wise sum over the stages (for vectors where each entry has one contributor).
  void allreduce_sum(std::span<double> v) {
    if (stages_ == 1) return;
    detail::mpi_ok(MPI_Allreduce(MPI_IN_PLACE, v.data(), detail::mpi_count(v), MPI_DOUBLE, MPI_SUM, comm_),
                   "allreduce");
  }

 private:
  struct Side {
    std::vector<std::vector<float>> buffers;
    std::vector<MPI_Request> requests;
  };
  static constexpr int tied_tag = 30000;
  static int tag(int micro, int dir) { return 2 * (micro % 8192) + dir; }

  void post(Side& side, std::span<const float> data, int dest, int t) {
    const auto slot = static_cast<std::size_t>(t / 2) % side.buffers.size();
    auto& req = side.requests[slot];
    if (req != MPI_REQUEST_NULL) detail::mpi_ok(MPI_Wait(&req, MPI_STATUS_IGNORE), "wait");
    auto& buf = side.buffers[slot];
    dilocox::detail::require(data.size() <= buf.size(), "StageLink::send", "activation larger than the buffer");
    std::copy(data.begin(), data.end(), buf.begin());
    detail::mpi_ok(MPI_Isend(buf.data(), detail::mpi_count(data), MPI_FLOAT, dest, t, comm_, &req), "send");
  }
  void recv(std::span<float> data, int src, int t) {
    MPI_Status st;
    detail::mpi_ok(MPI_Recv(data.data(), detail::mpi_count(data), MPI_FLOAT, src, t, comm_, &st), "receive");
    int got = 0;
    MPI_Get_count(&st, MPI_FLOAT, &got);
    dilocox::detail::require(static_cast<std::size_t>(got) == data.size(), "StageLink::recv",
                             "got " + std::to_string(got) + " floats, expected " + std::to_string(data.size()));
  }

  MPI_Comm comm_;
  int stage_ = 0, stages_ = 1;
  Side fwd_, bwd_;
  std::vector<float> other_;
};

}  // namespace dilocox::trainer
