// dilocox/compress/sparse.hpp: SparseLoCoCompressor (SparseLoCo, Sarfi et al. 2025,
// arXiv 2508.15706; reference code tplr-ai/templar): an error-feedback accumulator
// decayed by beta, e <- beta e + Delta, of which each tensor sends the top-k of every
// tile with 2-bit values (sparse_code.hpp: tiles of up to 64 x 64, never across
// tensors; one codebook per tensor), e <- e - sent; the replicas' sparse updates are
// all-gathered and averaged. The decayed accumulator takes the place of the outer
// momentum: outer_step() is a plain averaged step (lr 1, no momentum), and replicas
// restart from the global model (keep_residual off). Not here: the code's bytes.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dilocox/codec.hpp"
#include "dilocox/compress/compressor.hpp"
#include "dilocox/reduce.hpp"
#include "dilocox/sparse_code.hpp"
#include "dilocox/wire.hpp"

namespace dilocox {

struct SparseLoCoConfig {
  std::size_t tile = 64;      // largest tile side: each dimension's largest divisor <= 64 (reference target_chunk)
  std::uint32_t k = 64;       // kept per tile: 64 of a 64 x 64 tile, 1.56%, inside the paper's 1-3% density
  float range_sigmas = 6;     // the 2-bit codebook spans 6 standard deviations (reference quantization_range)
  float error_decay = 0.95f;  // beta: the accumulator's decay, SparseLoCo's stand-in for outer momentum
  float outer_lr = 1.0f;      // the plain averaged outer step's rate (SparseLoCo's form)
  // Off (published): replicas restart from the global model after each sync. On: a
  // replica keeps beta e (what it has not sent) in its local model (docs/RESULTS.md).
  bool keep_residual = false;
  // Off (the paper): the mean is the sum of the replicas' payloads / R. On (the reference
  // code): each replica's payload of a tensor is scaled down to at most the median of
  // their norms, and each position averaged over the replicas that chose it.
  bool average_chosen = false;
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
  TiledCode code() const { return {config_.tile, config_.k, config_.range_sigmas}; }

  void setup(std::span<const TensorSpec> specs) {
    specs_.assign(specs.begin(), specs.end());
    acc_.clear();
    for (const auto& s : specs_) acc_.emplace_back(s.shape.numel(), 0.0f);
  }

  std::string describe() const {
    return "sparseloco top-" + std::to_string(config_.k) + " per tile of up to " + std::to_string(config_.tile) + "x" +
           std::to_string(config_.tile) + " + 2-bit values (" + detail::number(config_.range_sigmas) +
           " sigma), error feedback decay " + detail::number(config_.error_decay) +
           (config_.keep_residual ? ", residual kept locally" : "") +
           (config_.average_chosen ? ", averaged over the replicas that chose each position" : "");
  }

  NesterovConfig outer_step() const { return {.lr = config_.outer_lr, .momentum = 0.0f, .nesterov = false}; }

  SyncReport sync(AnyCommunicator& comm, const SyncInput& in, TensorSpans x, TensorSpans mean) {
    const int k = comm.size(), me = comm.rank();
    const bool mine = in.contributes[static_cast<std::size_t>(me)] != 0;
    // e <- beta e + Delta (a dropped replica forgets its accumulator); one payload per tensor.
    std::size_t p = 0;
    for (std::size_t j = 0; j < in.tensors.size(); ++j) {
      auto& e = acc_[in.tensors[j]];
      if (!mine) std::fill(e.begin(), e.end(), 0.0f);
      for (std::size_t i = 0; i < e.size(); ++i) e[i] = config_.error_decay * e[i] + x[j][i];
      p += payload_size(header(in.tensors[j]), "");
    }
    send_.resize(p);
    recv_.resize(p * static_cast<std::size_t>(k));
    for (std::size_t j = 0, at = 0; j < in.tensors.size(); ++j) {
      const std::size_t t = in.tensors[j];
      const PayloadHeader h = header(t);
      pick(acc_[t], specs_[t].shape);
      const std::span<std::byte> out = std::span(send_).subspan(at, payload_size(h, ""));
      encode_tiled(acc_[t], specs_[t].shape, picked_, code(), begin_payload(h, "", out));
      seal_payload(out);
      at += out.size();
    }
    comm.allgather(send_, recv_);
    // The payloads of the contributors (and this replica's own), by rank then tensor.
    const std::size_t n = in.tensors.size();
    views_.assign(n * static_cast<std::size_t>(k), PayloadView{});
    SyncReport r;
    for (int q = 0; q < k; ++q) {
      const bool counts = in.contributes[static_cast<std::size_t>(q)] != 0;
      r.contributors += counts ? 1 : 0;
      if (!counts && q != me) continue;
      std::span<const std::byte> from = std::span<const std::byte>(recv_).subspan(static_cast<std::size_t>(q) * p, p);
      for (std::size_t j = 0; j < n; ++j) {
        const PayloadView v = read_payload(from);
        from = from.subspan(v.size);
        check(q, v.header, header(in.tensors[j]));
        views_[static_cast<std::size_t>(q) * n + j] = v;
      }
    }
    // e <- e - what this replica sent; the mean of the contributors' payloads.
    for (std::size_t j = 0; mine && j < n; ++j) {
      sent_.assign(x[j].size(), 0.0f);
      decode_add(views_[static_cast<std::size_t>(me) * n + j], sent_);
      auto& e = acc_[in.tensors[j]];
      for (std::size_t i = 0; i < e.size(); ++i) e[i] -= sent_[i];
    }
    for (std::size_t j = 0; j < n; ++j) {
      got_.clear();
      for (int q = 0; q < k; ++q)
        if (in.contributes[static_cast<std::size_t>(q)]) got_.push_back(&views_[static_cast<std::size_t>(q) * n + j]);
      average(got_, mean[j]);
    }
    // What is owed: beta e (the part the next sync carries) when kept locally, else nothing.
    for (std::size_t j = 0; j < in.tensors.size(); ++j) {
      const auto& e = acc_[in.tensors[j]];
      for (std::size_t i = 0; i < e.size(); ++i) x[j][i] = config_.keep_residual ? config_.error_decay * e[i] : 0.0f;
    }
    r.cost = ring_allgather_cost(p, k);
    return r;
  }

  void save_state(StateWriter& w) const {
    for (const auto& e : acc_) w.values(std::span<const float>(e));
  }
  void forget_owed() {
    for (auto& e : acc_) std::fill(e.begin(), e.end(), 0.0f);
  }
  void load_state(StateReader& r) {
    for (auto& e : acc_) r.values(std::span<float>(e));
  }
  // The accumulator of tensor i (tests, diagnostics).
  std::span<const float> accumulator(std::size_t i) const { return acc_[i]; }

  std::uint64_t wire_bytes(std::span<const TensorSpec> specs, int replicas) const {
    std::size_t p = 0;
    for (const auto& s : specs) p += payload_size(header_of(s.shape), "");
    return ring_allgather_cost(p, replicas).bytes;
  }

  std::uint64_t state_bytes(std::span<const TensorSpec> specs) const {
    std::uint64_t n = 0;
    for (const auto& s : specs) n += s.shape.numel();
    return 4 * n;  // the accumulators
  }

 private:
  PayloadHeader header_of(const Shape& shape) const { return tiled_header(shape, code()); }
  PayloadHeader header(std::size_t tensor) const { return header_of(specs_[tensor].shape); }

  static void check(int q, const PayloadHeader& got, const PayloadHeader& want) {
    detail::require(got.kind == want.kind && got.shape == want.shape && got.nnz == want.nnz && got.quant == want.quant,
                    "SparseLoCoCompressor", "rank " + std::to_string(q) + " sent a payload of another shape or code");
  }

  // picked_: per tile of e, the positions (inside the tile) of its largest magnitudes
  // (ties by position), ascending.
  void pick(std::span<const float> e, const Shape& shape) {
    const TileGrid g = tile_grid(shape, code());
    const std::size_t tile = g.h * g.w;
    picked_.clear();
    mags_.resize(tile);
    order_.resize(tile);
    for (std::size_t t = 0; t < g.tiles(); ++t) {
      for (std::size_t i = 0; i < tile; ++i) mags_[i] = std::fabs(e[g.position(t, i)]), order_[i] = static_cast<std::uint32_t>(i);
      const auto kc = static_cast<std::ptrdiff_t>(g.kept);
      std::nth_element(order_.begin(), order_.begin() + kc - 1, order_.end(), [&](std::uint32_t a, std::uint32_t b) {
        return mags_[a] != mags_[b] ? mags_[a] > mags_[b] : a < b;
      });
      std::sort(order_.begin(), order_.begin() + kc);
      picked_.insert(picked_.end(), order_.begin(), order_.begin() + kc);
    }
  }

  // mean = the payloads' sum / their count, or as average_chosen says.
  void average(std::span<const PayloadView* const> got, std::span<float> mean) {
    std::fill(mean.begin(), mean.end(), 0.0f);
    if (got.empty()) return;
    if (!config_.average_chosen) {
      for (const PayloadView* v : got) decode_add(*v, mean);
      const float inv = 1.0f / static_cast<float>(got.size());
      for (float& m : mean) m *= inv;
      return;
    }
    auto visit = [](const PayloadView& v, auto&& f) {
      visit_tiled(v.body, v.header.shape, tiled_code(v.header.quant, v.header.nnz), f);
    };
    norms_.clear();
    for (const PayloadView* v : got) {
      double s = 0;
      visit(*v, [&](std::size_t, float x) { s += static_cast<double>(x) * x; });
      norms_.push_back(std::sqrt(s));
    }
    std::vector<double> order = norms_;
    const auto mid = order.begin() + static_cast<std::ptrdiff_t>((order.size() - 1) / 2);  // the lower middle
    std::nth_element(order.begin(), mid, order.end());
    chosen_.assign(mean.size(), 0);
    for (std::size_t q = 0; q < got.size(); ++q) {
      const auto scale = static_cast<float>(std::min(1.0, *mid / (norms_[q] + 1e-8)));
      visit(*got[q], [&](std::size_t i, float x) { mean[i] += scale * x, ++chosen_[i]; });
    }
    for (std::size_t i = 0; i < mean.size(); ++i)
      if (chosen_[i] > 1) mean[i] /= static_cast<float>(chosen_[i]);
  }

  SparseLoCoConfig config_;
  std::vector<TensorSpec> specs_;
  std::vector<std::vector<float>> acc_;  // (tensors) the decayed error-feedback accumulators
  std::vector<float> sent_, mags_;       // (tensor) what this replica sent; (tile) magnitudes
  std::vector<std::uint32_t> picked_, order_;
  std::vector<std::byte> send_, recv_;
  std::vector<PayloadView> views_;      // (replicas x tensors) this sync's payloads
  std::vector<const PayloadView*> got_;  // (contributors) one tensor's payloads
  std::vector<double> norms_;            // (contributors) their norms, for average_chosen
  std::vector<std::uint32_t> chosen_;    // (tensor) how many payloads chose each position
};

static_assert(Compressor<SparseLoCoCompressor>);

}  // namespace dilocox
