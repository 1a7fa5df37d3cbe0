// dilocox/compressor.hpp: the pseudo-gradient compressors OuterLoop can run, over a
// set of named tensors, each a PseudoGradientCompressor<C>:
//   DenseCompressor    whole pseudo-gradient in fp32 / fp16 / bf16 / int8 / int4
//                      (DiLoCo, OpenDiLoCo), optional error feedback;
//   CocktailCompressor random subset (shared seed) + top-k + int4 values, error
//                      feedback (CocktailSGD);
//   LowRankCompressor  DiLoCoX: matrices through the power-iteration projector with
//                      int4 factors, small tensors quantized only, error feedback,
//                      adaptive rank per matrix.
// Error feedback is local: each replica keeps what *it* did not transmit.
// Not here: when reductions run (overlap.hpp) or what is done with them (diloco.hpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "dilocox/adaptive.hpp"
#include "dilocox/codec.hpp"
#include "dilocox/comm/communicator.hpp"
#include "dilocox/comm/cost.hpp"
#include "dilocox/error_feedback.hpp"
#include "dilocox/lowrank.hpp"
#include "dilocox/random.hpp"
#include "dilocox/reduce.hpp"
#include "dilocox/state.hpp"
#include "dilocox/tensor.hpp"

namespace dilocox {

struct TensorSpec {
  std::string name;
  Shape shape;
};

// What every rank knows about one reduction before it starts (identical everywhere).
struct SyncInput {
  std::span<const std::uint8_t> contributes;  // (K) replicas in the mean
  std::span<const double> mean_sq_norm;       // (tensors) mean over contributors of ||x_i + e_i||^2
  std::uint64_t round = 0;
};

struct SyncReport {
  WireCost cost;                 // this rank's bytes on the wire and hops
  int contributors = 0;
  double mean_rank = 0;          // low-rank tensors' mean rank used (0: none)
  double next_rank_ratio = 1;    // mean over low-rank tensors of next rank / initial rank
};

template <Communicator C>
class PseudoGradientCompressor {
 public:
  virtual ~PseudoGradientCompressor() = default;
  virtual std::string describe() const = 0;
  // x[i]: this rank's pseudo-gradient of tensor i (modified: error feedback is added);
  // delta[i]: receives the mean over contributing replicas, bit-identical on every rank.
  virtual SyncReport sync(std::span<const std::span<float>> x, const SyncInput& in,
                          std::span<const std::span<float>> delta) = 0;
  // Residuals, for checkpoints: one span per tensor (empty without error feedback).
  virtual std::vector<std::span<float>> residuals() { return {}; }
  // Everything the next sync depends on besides its input (checkpoints): the residuals,
  // and for the low-rank compressor the warm starts and rank controllers.
  virtual void save_state(StateWriter& w) {
    for (auto r : residuals()) w.values(std::span<const float>(r));
  }
  virtual void load_state(StateReader& r) {
    for (auto s : residuals()) r.values(s);
  }
};

namespace detail {

// Tensors laid end to end in one flat vector, each starting on an `align` boundary so
// no quantization block mixes two tensors.
struct FlatLayout {
  std::vector<std::size_t> offset, length;
  std::size_t total = 0;
  FlatLayout() = default;
  FlatLayout(const std::vector<std::size_t>& lengths, std::size_t align) : length(lengths) {
    for (std::size_t n : lengths) {
      offset.push_back(total);
      total += (n + align - 1) / align * align;
    }
  }
  std::span<float> part(std::vector<float>& flat, std::size_t i) const { return {flat.data() + offset[i], length[i]}; }
};

inline std::size_t codec_align(const Codec& c) { return c.encoding == Encoding::quantized ? c.quant.block : 1; }

inline std::vector<ErrorFeedback> make_residuals(const std::vector<TensorSpec>& specs) {
  std::vector<ErrorFeedback> ef;
  for (const auto& s : specs) ef.emplace_back(s.shape.numel());
  return ef;
}

inline std::vector<std::span<float>> residual_spans(std::vector<ErrorFeedback>& ef) {
  std::vector<std::span<float>> r;
  for (auto& e : ef) r.push_back(e.residual());
  return r;
}

inline std::uint64_t round_seed(std::uint64_t seed, std::uint64_t round, std::uint32_t salt) {
  return seed ^ (static_cast<std::uint64_t>(mix32(static_cast<std::uint32_t>(round) * 2654435761U + salt)) << 32) ^
         round;
}

// Decodes what this rank's own encoding of x carries (what it transmitted).
inline void local_round_trip(const Codec& c, std::span<const float> x, std::span<float> out,
                             std::vector<std::byte>& work) {
  work.resize(codec_payload_size(c, x.size()));
  encode(c, x, work);
  std::fill(out.begin(), out.end(), 0.0f);
  decode_add(read_payload(work), out);
}

}  // namespace detail

template <Communicator C>
class DenseCompressor final : public PseudoGradientCompressor<C> {
 public:
  DenseCompressor(C& comm, std::vector<TensorSpec> specs, Codec codec, ReduceAlgorithm algorithm,
                  bool error_feedback)
      : specs_(std::move(specs)), codec_(codec), reducer_(comm, codec, algorithm), ef_on_(error_feedback) {
    std::vector<std::size_t> lengths;
    for (const auto& s : specs_) lengths.push_back(s.shape.numel());
    layout_ = detail::FlatLayout(lengths, detail::codec_align(codec));
    flat_.assign(layout_.total, 0.0f);
    mean_.assign(layout_.total, 0.0f);
    if (ef_on_) {
      ef_ = detail::make_residuals(specs_);
      sent_.assign(layout_.total, 0.0f);
    }
  }
  std::string describe() const override {
    return "dense " + to_string(codec_) + (ef_on_ ? " + error feedback" : "") + ", " + to_string(reducer_.algorithm());
  }
  std::vector<std::span<float>> residuals() override { return detail::residual_spans(ef_); }

  SyncReport sync(std::span<const std::span<float>> x, const SyncInput& in,
                  std::span<const std::span<float>> delta) override {
    for (std::size_t i = 0; i < specs_.size(); ++i) {
      if (ef_on_) ef_[i].add_to(x[i]);
      std::copy(x[i].begin(), x[i].end(), layout_.part(flat_, i).begin());
    }
    SyncReport r;
    const auto res = reducer_.mean(flat_, in.contributes, mean_, detail::round_seed(seed_, in.round, 1));
    r.cost = res.cost, r.contributors = res.contributors;
    if (ef_on_) detail::local_round_trip(codec_, flat_, sent_, work_);
    for (std::size_t i = 0; i < specs_.size(); ++i) {
      const auto m = layout_.part(mean_, i);
      std::copy(m.begin(), m.end(), delta[i].begin());
      if (ef_on_) ef_[i].update(x[i], layout_.part(sent_, i));
    }
    return r;
  }

 private:
  std::vector<TensorSpec> specs_;
  Codec codec_;
  CompressedReducer<C> reducer_;
  bool ef_on_;
  std::uint64_t seed_ = 0x6a09e667f3bcc908ULL;
  detail::FlatLayout layout_;
  std::vector<float> flat_, mean_, sent_;  // (layout total) this rank's x, the mean, what it sent
  std::vector<ErrorFeedback> ef_;
  std::vector<std::byte> work_;
};

struct CocktailConfig {
  double random_fraction = 0.25;  // share of elements in the round's random subset (same on all replicas)
  double topk_fraction = 0.1;     // share of the subset sent, largest magnitudes first
  QuantConfig quant{.bits = 4, .block = 64};
};

template <Communicator C>
class CocktailCompressor final : public PseudoGradientCompressor<C> {
 public:
  CocktailCompressor(C& comm, std::vector<TensorSpec> specs, CocktailConfig config, std::uint64_t seed)
      : comm_(&comm), specs_(std::move(specs)), config_(config), seed_(seed) {
    detail::require(config.random_fraction > 0 && config.random_fraction <= 1, "CocktailConfig",
                    "random_fraction must be in (0, 1]");
    detail::require(config.topk_fraction > 0 && config.topk_fraction <= 1, "CocktailConfig",
                    "topk_fraction must be in (0, 1]");
    validate(config.quant);
    std::vector<std::size_t> lengths;
    for (const auto& s : specs_) lengths.push_back(s.shape.numel());
    layout_ = detail::FlatLayout(lengths, 1);
    detail::require(layout_.total < (std::size_t{1} << 32), "CocktailCompressor", "more than 2^32 elements");
    flat_.assign(layout_.total, 0.0f);
    mean_.assign(layout_.total, 0.0f);
    sent_.assign(layout_.total, 0.0f);
    ef_ = detail::make_residuals(specs_);
  }
  std::string describe() const override {
    return "cocktail random " + std::to_string(config_.random_fraction) + " x top-k " +
           std::to_string(config_.topk_fraction) + " + int" + std::to_string(config_.quant.bits) + " + error feedback";
  }
  std::vector<std::span<float>> residuals() override { return detail::residual_spans(ef_); }

  SyncReport sync(std::span<const std::span<float>> x, const SyncInput& in,
                  std::span<const std::span<float>> delta) override {
    const int k = comm_->size(), me = comm_->rank();
    for (std::size_t i = 0; i < specs_.size(); ++i) {
      ef_[i].add_to(x[i]);
      std::copy(x[i].begin(), x[i].end(), layout_.part(flat_, i).begin());
    }
    // The round's random subset: the same on every replica, so its size agrees too.
    const std::uint64_t rs = detail::round_seed(seed_, in.round, 2);
    subset_.clear();
    for (std::uint32_t i = 0; i < layout_.total; ++i)
      if (counter_uniform(rs, i) < config_.random_fraction) subset_.push_back(i);
    const auto keep = static_cast<std::uint32_t>(
        std::min<double>(subset_.size(), std::max(1.0, std::round(config_.topk_fraction * subset_.size()))));
    const std::uint32_t nnz = subset_.empty() ? 0 : keep;
    std::nth_element(subset_.begin(), subset_.begin() + nnz, subset_.end(), [&](std::uint32_t a, std::uint32_t b) {
      const float fa = std::fabs(flat_[a]), fb = std::fabs(flat_[b]);
      return fa != fb ? fa > fb : a < b;  // ties by index: deterministic
    });
    std::sort(subset_.begin(), subset_.begin() + nnz);

    PayloadHeader h{PayloadKind::sparse_quantized, {layout_.total}, config_.quant, nnz};
    h.quant.seed = rs ^ static_cast<std::uint64_t>(me);
    const std::size_t p = payload_size(h, "");
    send_.resize(p);
    recv_.resize(p * static_cast<std::size_t>(k));
    values_.resize(nnz);
    auto body = begin_payload(h, "", send_);
    const bool mine = in.contributes[me] != 0;
    for (std::uint32_t j = 0; j < nnz; ++j) {
      std::memcpy(body.data() + 4 * std::size_t{j}, &subset_[j], 4);
      values_[j] = mine ? flat_[subset_[j]] : 0.0f;
    }
    quantize(values_, body.subspan(4 * std::size_t{nnz}), h.quant);
    seal_payload(send_);
    comm_->allgather(send_, recv_);

    SyncReport r;
    std::fill(mean_.begin(), mean_.end(), 0.0f);
    for (int q = 0; q < k; ++q) {
      if (!in.contributes[q]) continue;
      const PayloadView v = read_payload(std::span<const std::byte>(recv_).subspan(q * p, p));
      detail::require(v.header.kind == PayloadKind::sparse_quantized && v.header.shape.numel() == layout_.total,
                      "CocktailCompressor", "rank " + std::to_string(q) + " sent a payload of another shape");
      decode_add(v, mean_);
      ++r.contributors;
    }
    const float inv = r.contributors ? 1.0f / static_cast<float>(r.contributors) : 0.0f;
    for (float& v : mean_) v *= inv;
    std::fill(sent_.begin(), sent_.end(), 0.0f);
    decode_add(read_payload(send_), sent_);
    for (std::size_t i = 0; i < specs_.size(); ++i) {
      const auto m = layout_.part(mean_, i);
      std::copy(m.begin(), m.end(), delta[i].begin());
      ef_[i].update(x[i], layout_.part(sent_, i));
    }
    r.cost = ring_allgather_cost(p, k);
    return r;
  }

 private:
  C* comm_;
  std::vector<TensorSpec> specs_;
  CocktailConfig config_;
  std::uint64_t seed_;
  detail::FlatLayout layout_;
  std::vector<float> flat_, mean_, sent_, values_;
  std::vector<std::uint32_t> subset_;
  std::vector<ErrorFeedback> ef_;
  std::vector<std::byte> send_, recv_;
};

struct LowRankCompressorConfig {
  int rank = 16;                                  // initial rank r0 of every matrix
  QuantConfig factor_quant{.bits = 4, .block = 64};   // P and Q on the wire
  QuantConfig small_quant{.bits = 8, .block = 64};    // vectors and small matrices
  double min_ratio = 4.0;    // low rank when (m + n) r0 < m n / min_ratio
  bool adaptive = true;
  AdaptiveConfig adaptive_config;
  bool error_feedback = true;   // keep what was not sent and add it to the next round
  std::uint64_t seed = 0;
};

template <Communicator C>
class LowRankCompressor final : public PseudoGradientCompressor<C> {
 public:
  LowRankCompressor(C& comm, std::vector<TensorSpec> specs, LowRankCompressorConfig config, ReduceAlgorithm algorithm)
      : specs_(std::move(specs)),
        config_(config),
        factor_codec_{Encoding::quantized, config.factor_quant},
        small_codec_{Encoding::quantized, config.small_quant},
        factors_(comm, factor_codec_, algorithm),
        small_(comm, small_codec_, algorithm) {
    ef_ = detail::make_residuals(specs_);
    std::vector<std::size_t> small_lengths;
    for (std::size_t i = 0; i < specs_.size(); ++i) {
      const auto [m, n] = matrix_shape(specs_[i].shape);
      const double r0 = config.rank;
      if (m > 1 && n > 1 && (static_cast<double>(m + n) * r0) < static_cast<double>(m) * n / config.min_ratio) {
        AdaptiveConfig ac = config.adaptive_config;
        if (!config.adaptive) ac.r_min = ac.r_max = config.rank;  // fixed rank: the controller only holds it
        matrices_.push_back({i, m, n,
                             std::make_unique<PowerIterationProjector>(
                                 m, n, LowRankConfig{.rank = config.rank, .seed = config.seed + i}),
                             AdaptiveRankController(ac, config.rank)});
      } else {
        small_index_.push_back(i);
        small_lengths.push_back(specs_[i].shape.numel());
      }
    }
    small_layout_ = detail::FlatLayout(small_lengths, config.small_quant.block);
    small_flat_.assign(small_layout_.total, 0.0f);
    small_mean_.assign(small_layout_.total, 0.0f);
    small_sent_.assign(small_layout_.total, 0.0f);
  }

  std::string describe() const override {
    return "low-rank r" + std::to_string(config_.rank) + " int" + std::to_string(config_.factor_quant.bits) +
           " factors (" + std::to_string(matrices_.size()) + " matrices, " + std::to_string(small_index_.size()) +
           " small tensors int" + std::to_string(config_.small_quant.bits) + ")" +
           (config_.error_feedback ? " + error feedback" : "") +
           (config_.adaptive ? " + adaptive rank" : "") + ", " + to_string(factors_.algorithm());
  }
  std::vector<std::span<float>> residuals() override {
    return config_.error_feedback ? detail::residual_spans(ef_) : std::vector<std::span<float>>{};
  }
  void save_state(StateWriter& w) override {
    PseudoGradientCompressor<C>::save_state(w);
    for (const auto& mx : matrices_) {
      mx.proj->save_state(w);
      mx.controller.save_state(w);
    }
  }
  void load_state(StateReader& r) override {
    PseudoGradientCompressor<C>::load_state(r);
    for (auto& mx : matrices_) {
      mx.proj->load_state(r);
      mx.controller.load_state(r);
    }
  }
  std::size_t matrix_count() const { return matrices_.size(); }
  int rank_of(std::size_t matrix) const { return matrices_[matrix].proj->rank(); }

  SyncReport sync(std::span<const std::span<float>> x, const SyncInput& in,
                  std::span<const std::span<float>> delta) override {
    if (config_.error_feedback)
      for (std::size_t i = 0; i < specs_.size(); ++i) ef_[i].add_to(x[i]);
    SyncReport r;
    // Phase 1: P_i = X_i Q_i on every replica; their mean, shared, orthonormalized.
    for (auto& mx : matrices_) {
      const int want = std::min<int>(mx.controller.rank(), static_cast<int>(std::min(mx.m, mx.n)));
      if (config_.adaptive && mx.proj->rank() != want) mx.proj->set_rank(want);
    }
    std::vector<std::size_t> p_len, q_len;
    for (auto& mx : matrices_) {
      p_len.push_back(mx.m * static_cast<std::size_t>(mx.proj->rank()));
      q_len.push_back(mx.n * static_cast<std::size_t>(mx.proj->rank()));
    }
    const detail::FlatLayout pl(p_len, config_.factor_quant.block), ql(q_len, config_.factor_quant.block);
    fill_flat(pl, [&](std::size_t j) { return matrices_[j].proj->left(view(x, j)).span(); });
    r.cost += reduce(factors_, pl.total, in, 10);
    scatter_flat(pl, [&](std::size_t j) { return matrices_[j].proj->left_factor(); });
    for (auto& mx : matrices_) mx.proj->orthonormalize_left();
    // Phase 2: Q_i = X_i^T P_i; keep what this replica sends (for error feedback), mean.
    fill_flat(ql, [&](std::size_t j) { return matrices_[j].proj->right(view(x, j)).span(); });
    local_sent_.resize(ql.total);
    detail::local_round_trip(factor_codec_, std::span<const float>(flat_).first(ql.total),
                             std::span<float>(local_sent_).first(ql.total), work_);
    r.cost += reduce(factors_, ql.total, in, 20);
    scatter_flat(ql, [&](std::size_t j) { return matrices_[j].proj->right_factor(); });
    double rank_sum = 0, ratio_sum = 0;
    for (std::size_t j = 0; j < matrices_.size(); ++j) {
      auto& mx = matrices_[j];
      const std::size_t t = mx.tensor;
      mx.proj->reconstruct({delta[t].data(), mx.m, mx.n});  // Delta = P mean(Q)^T
      if (config_.error_feedback) {
        // sent by this replica: P Q_local^T; residual e = x - sent, the product subtracted
        // in place (no (m, n) copy of what was sent: for a 100B model's embedding, GBs).
        using RowMatrix = PowerIterationProjector::RowMatrix;
        const auto m = static_cast<Eigen::Index>(mx.m), n = static_cast<Eigen::Index>(mx.n);
        const auto rr = static_cast<Eigen::Index>(mx.proj->rank());
        const auto p = mx.proj->left_factor();
        Eigen::Map<const RowMatrix> pm(p.data(), m, rr), q_local(local_sent_.data() + ql.offset[j], n, rr);
        Eigen::Map<RowMatrix> e(ef_[t].assign(x[t]).data(), m, n);
        e.noalias() -= pm * q_local.transpose();
      }
      rank_sum += mx.proj->rank();
      if (config_.adaptive)
        mx.controller.observe(mx.proj->singular_values(), mx.proj->sketch_energy(), in.mean_sq_norm[t]);
      ratio_sum += static_cast<double>(mx.controller.rank()) / mx.controller.initial_rank();
    }
    if (!matrices_.empty()) {
      r.mean_rank = rank_sum / static_cast<double>(matrices_.size());
      r.next_rank_ratio = config_.adaptive ? ratio_sum / static_cast<double>(matrices_.size()) : 1.0;
    }
    // Small tensors: quantized only.
    if (!small_index_.empty()) {
      for (std::size_t j = 0; j < small_index_.size(); ++j) {
        const auto& xs = x[small_index_[j]];
        std::copy(xs.begin(), xs.end(), small_layout_.part(small_flat_, j).begin());
      }
      const auto res = small_.mean(small_flat_, in.contributes, small_mean_, detail::round_seed(config_.seed, in.round, 30));
      r.cost += res.cost;
      detail::local_round_trip(small_codec_, small_flat_, small_sent_, work_);
      for (std::size_t j = 0; j < small_index_.size(); ++j) {
        const std::size_t t = small_index_[j];
        const auto m = small_layout_.part(small_mean_, j);
        std::copy(m.begin(), m.end(), delta[t].begin());
        if (config_.error_feedback) ef_[t].update(x[t], small_layout_.part(small_sent_, j));
      }
    }
    r.contributors = count_contributors(in.contributes);
    return r;
  }

 private:
  struct Matrix {
    std::size_t tensor, m, n;
    std::unique_ptr<PowerIterationProjector> proj;
    AdaptiveRankController controller;
  };

  MatrixView<const float> view(std::span<const std::span<float>> x, std::size_t j) const {
    return {x[matrices_[j].tensor].data(), matrices_[j].m, matrices_[j].n};
  }

  template <class Get>
  void fill_flat(const detail::FlatLayout& l, Get&& get) {
    flat_.assign(l.total, 0.0f);
    for (std::size_t j = 0; j < matrices_.size(); ++j) {
      const std::span<float> src = get(j);
      std::copy(src.begin(), src.end(), flat_.begin() + static_cast<std::ptrdiff_t>(l.offset[j]));
    }
  }
  template <class Get>
  void scatter_flat(const detail::FlatLayout& l, Get&& get) {
    for (std::size_t j = 0; j < matrices_.size(); ++j) {
      const std::span<float> dst = get(j);
      std::copy_n(mean_.begin() + static_cast<std::ptrdiff_t>(l.offset[j]), dst.size(), dst.begin());
    }
  }
  WireCost reduce(CompressedReducer<C>& red, std::size_t n, const SyncInput& in, std::uint32_t salt) {
    mean_.assign(n, 0.0f);
    if (n == 0) return {};
    return red.mean(std::span<const float>(flat_).first(n), in.contributes, mean_,
                    detail::round_seed(config_.seed, in.round, salt)).cost;
  }

  std::vector<TensorSpec> specs_;
  LowRankCompressorConfig config_;
  Codec factor_codec_, small_codec_;
  CompressedReducer<C> factors_, small_;
  std::vector<Matrix> matrices_;
  std::vector<std::size_t> small_index_;
  detail::FlatLayout small_layout_;
  std::vector<float> flat_, mean_, local_sent_;                 // factor workspaces
  std::vector<float> small_flat_, small_mean_, small_sent_;     // small-tensor workspaces
  std::vector<ErrorFeedback> ef_;
  std::vector<std::byte> work_;
};

}  // namespace dilocox
