// dilocox/compress/sparse.hpp: SparseLoCoCompressor (SparseLoCo, Sarfi et al. 2025,
// arXiv 2508.15706): an error-feedback accumulator decayed by beta, e <- beta e + Delta,
// of which the top-k entries of every chunk are sent with 2-bit values (sparse_code.hpp),
// e <- e - sent; the replicas' sparse updates are all-gathered and averaged. The decayed
// accumulator takes the place of the outer momentum: outer_step() is a plain averaged
// step (lr 1, no momentum). Not here: the code's bytes (sparse_code.hpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dilocox/codec.hpp"
#include "dilocox/compress/compressor.hpp"
#include "dilocox/compress/flat_layout.hpp"
#include "dilocox/reduce.hpp"
#include "dilocox/sparse_code.hpp"
#include "dilocox/wire.hpp"

namespace dilocox {

struct SparseLoCoConfig {
  std::size_t chunk = 4096;   // elements per chunk: SparseLoCo's 64 x 64 chunks hold 4096
  std::uint32_t k = 64;       // kept per chunk: 1.56%, inside the paper's 1-3% density
  float error_decay = 0.95f;  // beta: the accumulator's decay, SparseLoCo's stand-in for outer momentum
  float outer_lr = 1.0f;      // the plain averaged outer step's rate (SparseLoCo's form)
  ScaleFormat scale = ScaleFormat::fp32;  // the two magnitudes per chunk
  // The replica keeps beta e (what it has not sent) in its local model, as every compressor
  // here keeps its residual; the paper restarts replicas from the global model, which
  // failed to converge where inner steps reach a local optimum (docs/RESULTS.md).
  bool keep_residual = true;
};

class SparseLoCoCompressor {
 public:
  explicit SparseLoCoCompressor(SparseLoCoConfig config = {}) : config_(config) {
    validate(code());
    detail::require(std::isfinite(config.error_decay) && config.error_decay >= 0 && config.error_decay <= 1,
                    "SparseLoCoConfig", "error_decay must be in [0, 1]");
    detail::require(std::isfinite(config.outer_lr) && config.outer_lr > 0, "SparseLoCoConfig", "outer_lr must be > 0");
  }

  const SparseLoCoConfig& config() const { return config_; }
  ChunkedCode code() const { return {config_.chunk, config_.k, config_.scale}; }

  void setup(std::span<const TensorSpec> specs) {
    specs_.assign(specs.begin(), specs.end());
    acc_.clear();
    for (const auto& s : specs_) acc_.emplace_back(s.shape.numel(), 0.0f);
  }

  std::string describe() const {
    return "sparseloco top-" + std::to_string(config_.k) + " of " + std::to_string(config_.chunk) +
           " + 2-bit values, error feedback decay " + detail::number(config_.error_decay);
  }

  NesterovConfig outer_step() const { return {.lr = config_.outer_lr, .momentum = 0.0f, .nesterov = false}; }

  SyncReport sync(AnyCommunicator& comm, const SyncInput& in, TensorSpans x, TensorSpans mean) {
    const int k = comm.size(), me = comm.rank();
    const bool mine = in.contributes[static_cast<std::size_t>(me)] != 0;
    // e <- beta e + Delta (a dropped replica forgets its accumulator).
    lengths_.clear();
    parts_.resize(in.tensors.size());
    for (std::size_t j = 0; j < in.tensors.size(); ++j) {
      auto& e = acc_[in.tensors[j]];
      if (!mine) std::fill(e.begin(), e.end(), 0.0f);
      for (std::size_t i = 0; i < e.size(); ++i) e[i] = config_.error_decay * e[i] + x[j][i];
      parts_[j] = e;
      lengths_.push_back(e.size());
    }
    layout_.assign(lengths_, 1);
    layout_.gather(parts_, flat_);
    pick();
    const PayloadHeader h = header(flat_.size());
    const std::size_t p = payload_size(h, "");
    send_.resize(p);
    recv_.resize(p * static_cast<std::size_t>(k));
    encode_chunked(flat_, picked_, code(), begin_payload(h, "", send_));
    seal_payload(send_);
    comm.allgather(send_, recv_);
    // e <- e - what this replica sent; the mean of what the contributors sent.
    SyncReport r;
    sent_.assign(flat_.size(), 0.0f);
    decode_add(read_payload(send_), sent_);
    for (std::size_t j = 0; j < in.tensors.size() && mine; ++j) {
      const auto s = layout_.part(std::span<const float>(sent_), j);
      auto& e = acc_[in.tensors[j]];
      for (std::size_t i = 0; i < e.size(); ++i) e[i] -= s[i];
    }
    mean_.resize(flat_.size());
    r.contributors = decode_mean(recv_, p, in.contributes.first(static_cast<std::size_t>(k)), mean_,
                                 [&](int q, const PayloadHeader& got) {
                                   detail::require(got.kind == h.kind && got.shape == h.shape && got.nnz == h.nnz &&
                                                       got.quant == h.quant,
                                                   "SparseLoCoCompressor",
                                                   "rank " + std::to_string(q) +
                                                       " sent a payload of another shape or code");
                                 });
    layout_.scatter(mean_, mean);
    // What is owed: beta e, the part of the accumulator that the next sync carries.
    for (std::size_t j = 0; j < in.tensors.size(); ++j) {
      if (!config_.keep_residual) {
        std::fill(x[j].begin(), x[j].end(), 0.0f);
        continue;
      }
      const auto& e = acc_[in.tensors[j]];
      for (std::size_t i = 0; i < e.size(); ++i) x[j][i] = config_.error_decay * e[i];
    }
    r.cost = ring_allgather_cost(p, k);
    return r;
  }

  void save_state(StateWriter& w) const {
    for (const auto& e : acc_) w.values(std::span<const float>(e));
  }
  void load_state(StateReader& r) {
    for (auto& e : acc_) r.values(std::span<float>(e));
  }
  // The accumulator of tensor i (tests, diagnostics).
  std::span<const float> accumulator(std::size_t i) const { return acc_[i]; }

  std::uint64_t wire_bytes(std::span<const TensorSpec> specs, int replicas) const {
    std::size_t n = 0;
    for (const auto& s : specs) n += s.shape.numel();
    return ring_allgather_cost(payload_size(header(n), ""), replicas).bytes;
  }

  std::uint64_t state_bytes(std::span<const TensorSpec> specs) const {
    std::uint64_t n = 0;
    for (const auto& s : specs) n += s.shape.numel();
    return 4 * n;  // the accumulators
  }

 private:
  PayloadHeader header(std::size_t n) const {
    PayloadHeader h{PayloadKind::sparse_chunked, {n}, {}, config_.k};
    h.quant.bits = 2;
    h.quant.block = config_.chunk;
    h.quant.scale = config_.scale;
    return h;
  }

  // picked_: per chunk of flat_, the positions of its k largest magnitudes (ties by
  // position), ascending.
  void pick() {
    picked_.clear();
    const std::size_t n = flat_.size(), c = config_.chunk;
    for (std::size_t base = 0; base < n; base += c) {
      const std::size_t len = std::min(c, n - base), kc = std::min<std::size_t>(config_.k, len);
      order_.resize(len);
      for (std::size_t i = 0; i < len; ++i) order_[i] = static_cast<std::uint32_t>(i);
      const float* v = flat_.data() + base;
      std::nth_element(order_.begin(), order_.begin() + static_cast<std::ptrdiff_t>(kc), order_.end(),
                       [&](std::uint32_t a, std::uint32_t b) {
                         const float fa = std::fabs(v[a]), fb = std::fabs(v[b]);
                         return fa != fb ? fa > fb : a < b;
                       });
      std::sort(order_.begin(), order_.begin() + static_cast<std::ptrdiff_t>(kc));
      picked_.insert(picked_.end(), order_.begin(), order_.begin() + static_cast<std::ptrdiff_t>(kc));
    }
  }

  SparseLoCoConfig config_;
  std::vector<TensorSpec> specs_;
  std::vector<std::vector<float>> acc_;  // (tensors) the decayed error-feedback accumulators
  std::vector<std::size_t> lengths_;
  std::vector<std::span<float>> parts_;
  FlatLayout layout_;
  std::vector<float> flat_, mean_, sent_;    // (layout total) accumulator, mean, what this replica sent
  std::vector<std::uint32_t> picked_, order_;
  std::vector<std::byte> send_, recv_;
};

static_assert(Compressor<SparseLoCoCompressor>);

}  // namespace dilocox
