// dilocox/compress/cocktail.hpp: CocktailCompressor (CocktailSGD, Wang et al. 2023):
// a random subset of the entries (the same on every replica, new each sync, drawn per
// tensor from its name and index, so a tensor's subset does not depend on which other
// tensors share the sync: a fragment or a data-parallel shard draws what one loop over
// all the tensors draws), the top-k of it by magnitude, values quantized, with error
// feedback. Each replica's sparse
// payload is all-gathered and added in rank order (the supports differ per replica).
// Not here: chunked top-k without the random subset (sparse.hpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "dilocox/codec.hpp"
#include "dilocox/compress/compressor.hpp"
#include "dilocox/compress/flat_layout.hpp"
#include "dilocox/error_feedback.hpp"
#include "dilocox/random.hpp"
#include "dilocox/reduce.hpp"
#include "dilocox/wire.hpp"

namespace dilocox {

struct CocktailConfig {
  double random_fraction = 0.1;   // share of entries in the sync's random subset (CocktailSGD's README: 0.1)
  double topk_fraction = 0.2;     // share of the subset sent, largest magnitudes first (its README: 0.2): 2%
  QuantConfig quant{.bits = 4, .block = 64};  // the values: 4 bits, as CocktailSGD
  std::uint64_t seed = 0;         // the random subsets; same on every replica
  float error_decay = 1.0f;       // residual kept as decay (x - sent)
};

class CocktailCompressor {
 public:
  explicit CocktailCompressor(CocktailConfig config = {}) : config_(config) {
    detail::require(config.random_fraction > 0 && config.random_fraction <= 1, "CocktailConfig",
                    "random_fraction must be in (0, 1]");
    detail::require(config.topk_fraction > 0 && config.topk_fraction <= 1, "CocktailConfig",
                    "topk_fraction must be in (0, 1]");
    validate(config.quant);
    detail::require(std::isfinite(config.error_decay) && config.error_decay >= 0 && config.error_decay <= 1,
                    "CocktailConfig", "error_decay must be in [0, 1]");
  }

  const CocktailConfig& config() const { return config_; }

  void setup(std::span<const TensorSpec> specs) {
    specs_.assign(specs.begin(), specs.end());
    ef_.clear();
    std::size_t total = 0;
    for (const auto& s : specs_) ef_.emplace_back(s.shape.numel()), total += s.shape.numel();
    detail::require(total < (std::size_t{1} << 32), "CocktailCompressor", "more than 2^32 elements");
  }

  std::string describe() const {
    return "cocktail random " + detail::number(config_.random_fraction) + " x top-k " +
           detail::number(config_.topk_fraction) + " + int" + std::to_string(config_.quant.bits) + "/b" +
           std::to_string(config_.quant.block) + " + error feedback decay " + detail::number(config_.error_decay);
  }

  SyncReport sync(AnyCommunicator& comm, const SyncInput& in, TensorSpans x, TensorSpans mean) {
    const int k = comm.size(), me = comm.rank();
    const bool mine = in.contributes[static_cast<std::size_t>(me)] != 0;
    lengths_.clear();
    for (std::size_t j = 0; j < in.tensors.size(); ++j) {
      auto& e = ef_[in.tensors[j]];
      if (mine) e.add_to(x[j]);
      else e.reset();
      lengths_.push_back(specs_[in.tensors[j]].shape.numel());
    }
    layout_.assign(lengths_, 1);
    layout_.gather(x, flat_);
    const std::uint64_t rs = stream_seed(config_.seed, in.sync, 2);
    const std::uint32_t nnz = select(rs, in.tensors);
    PayloadHeader h{PayloadKind::sparse_quantized, {layout_.total()}, config_.quant, nnz};
    h.quant.seed = rs ^ static_cast<std::uint64_t>(me);
    const std::size_t p = payload_size(h, "");
    send_.resize(p);
    recv_.resize(p * static_cast<std::size_t>(k));
    values_.resize(nnz);
    auto body = begin_payload(h, "", send_);
    for (std::uint32_t j = 0; j < nnz; ++j) {
      std::memcpy(body.data() + 4 * std::size_t{j}, &subset_[j], 4);
      values_[j] = mine ? flat_[subset_[j]] : 0.0f;
    }
    quantize(values_, body.subspan(4 * std::size_t{nnz}), h.quant);
    seal_payload(send_);
    comm.allgather(send_, recv_);

    SyncReport r;
    mean_.resize(layout_.total());
    r.contributors = decode_mean(recv_, p, in.contributes.first(static_cast<std::size_t>(k)), mean_,
                                 [&](int q, const PayloadHeader& got) {
                                   detail::require(got.kind == PayloadKind::sparse_quantized &&
                                                       got.shape.numel() == layout_.total(),
                                                   "CocktailCompressor",
                                                   "rank " + std::to_string(q) + " sent a payload of another shape");
                                 });
    layout_.scatter(mean_, mean);
    if (mine) {
      sent_.assign(layout_.total(), 0.0f);
      decode_add(read_payload(send_), sent_);
      for (std::size_t j = 0; j < in.tensors.size(); ++j)
        ef_[in.tensors[j]].update(x[j], layout_.part(std::span<const float>(sent_), j), config_.error_decay);
    }
    for (std::size_t j = 0; j < in.tensors.size(); ++j)  // what is still owed
      std::copy_n(ef_[in.tensors[j]].residual().begin(), x[j].size(), x[j].begin());
    r.cost = ring_allgather_cost(p, k);
    return r;
  }

  void save_state(StateWriter& w) const {
    for (const auto& e : ef_) w.values(e.residual());
  }
  void forget_owed() {
    for (auto& e : ef_) std::fill(e.residual().begin(), e.residual().end(), 0.0f);
  }
  void load_state(StateReader& r) {
    for (auto& e : ef_) r.values(e.residual());
  }

  // The expected subset size (the random subset's size varies by a few entries).
  std::uint64_t wire_bytes(std::span<const TensorSpec> specs, int replicas) const {
    double n = 0;
    for (const auto& s : specs) n += static_cast<double>(s.shape.numel());
    const auto nnz = static_cast<std::uint32_t>(
        std::min(n, std::max(1.0, std::round(n * config_.random_fraction * config_.topk_fraction))));
    const PayloadHeader h{PayloadKind::sparse_quantized, {static_cast<std::size_t>(n)}, config_.quant, nnz};
    return ring_allgather_cost(payload_size(h, ""), replicas).bytes;
  }

  std::uint64_t state_bytes(std::span<const TensorSpec> specs) const {
    std::uint64_t n = 0;
    for (const auto& s : specs) n += s.shape.numel();
    return 4 * n;  // the residuals
  }

 private:
  // subset_[0, nnz): the sync's random subset (the same on every replica, so its size
  // agrees too), then its top-k by magnitude of flat_, in index order.
  std::uint32_t select(std::uint64_t rs, std::span<const std::size_t> tensors) {
    subset_.clear();
    for (std::size_t j = 0; j < tensors.size(); ++j) {
      const std::uint64_t ts = stream_seed(rs, stream_key(specs_[tensors[j]]), 3);
      const auto at = static_cast<std::uint32_t>(layout_.offset(j)), n = static_cast<std::uint32_t>(lengths_[j]);
      for (std::uint32_t i = 0; i < n; ++i)
        if (counter_uniform(ts, i) < config_.random_fraction) subset_.push_back(at + i);
    }
    if (subset_.empty()) return 0;
    const auto nnz = static_cast<std::uint32_t>(
        std::min<double>(subset_.size(), std::max(1.0, std::round(config_.topk_fraction * subset_.size()))));
    std::nth_element(subset_.begin(), subset_.begin() + nnz, subset_.end(), [&](std::uint32_t a, std::uint32_t b) {
      const float fa = std::fabs(flat_[a]), fb = std::fabs(flat_[b]);
      return fa != fb ? fa > fb : a < b;  // ties by index: deterministic
    });
    std::sort(subset_.begin(), subset_.begin() + nnz);
    return nnz;
  }

  CocktailConfig config_;
  std::vector<TensorSpec> specs_;
  std::vector<ErrorFeedback> ef_;     // (tensors) residuals
  std::vector<std::size_t> lengths_;  // (tensors of this sync)
  FlatLayout layout_;
  std::vector<float> flat_, mean_, sent_, values_;  // (layout total) x, mean, sent; (nnz) values
  std::vector<std::uint32_t> subset_;
  std::vector<std::byte> send_, recv_;
};

static_assert(Compressor<CocktailCompressor>);

}  // namespace dilocox
