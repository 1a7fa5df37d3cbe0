// dilocox/compress/lowrank.hpp: LowRankCompressor, DiLoCoX's compressor. Matrices where
// low rank pays go through the power-iteration projector (P = X Q, reduce, orth, Q =
// X^T P, reduce, Delta = P Q^T) with int4 factors; vectors and small matrices are
// quantized only (int8); error feedback keeps what was not sent; the adaptive
// controller sets each matrix's rank from the reduced sketch, comparing the sketch's
// energy with the energy of the same (mean) matrix, estimated from random probes that
// travel with Q. Not here: the projector itself (lowrank.hpp), the H rule (diloco.hpp).
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dilocox/adaptive.hpp"
#include "dilocox/codec.hpp"
#include "dilocox/compress/compressor.hpp"
#include "dilocox/compress/flat_layout.hpp"
#include "dilocox/error_feedback.hpp"
#include "dilocox/lowrank.hpp"
#include "dilocox/random.hpp"
#include "dilocox/reduce.hpp"

namespace dilocox {

struct LowRankCompressorConfig {
  int rank = 8;                                     // initial rank r0 of every matrix (measured: docs/RESULTS.md)
  QuantConfig factor_quant{.bits = 4, .block = 64};  // P and Q on the wire: int4, as DiLoCoX
  QuantConfig small_quant{.bits = 8, .block = 64};   // vectors and small matrices: int8 keeps them near exact
  // Factors travel column by column, so that a quantization block holds one column (the
  // r columns differ in scale by sigma_1 / sigma_r); off: row by row, a block mixing them.
  bool factor_blocks_by_column = false;
  double min_ratio = 4.0;   // low rank only when (m + n) r0 < m n / min_ratio: else int8 sends less error per byte
  bool adaptive = true;     // AdaGC: rank (and H) from each round's sketch (DiLoCoX's adaptive compression)
  AdaptiveConfig adaptive_config{};  // r_min, r_max, rho, window (adaptive.hpp)
  int energy_probes = 2;    // random probes per matrix estimating the mean matrix's energy (adaptive only)
  bool error_feedback = true;  // keep what was not sent and add it to the next round (DiLoCoX)
  float error_decay = 1.0f;    // residual kept as decay (x - sent)
  ReduceAlgorithm algorithm = ReduceAlgorithm::allgather;  // exact for small K; ring for many replicas
  std::uint64_t seed = 0;   // initial Q, probes, replacement directions: same on every replica
};

// How one tensor travels: low rank (with its current rank) or quantized only.
struct TensorTreatment {
  std::string name;
  bool low_rank = false;
  int rank = 0;  // current rank (low rank only)
};

class LowRankCompressor {
 public:
  explicit LowRankCompressor(LowRankCompressorConfig config = {})
      : config_(config),
        factor_codec_{Encoding::quantized, config.factor_quant},
        small_codec_{Encoding::quantized, config.small_quant},
        factors_(factor_codec_, config.algorithm),
        small_(small_codec_, config.algorithm) {
    detail::require(config.rank >= 1, "LowRankCompressorConfig", "rank must be >= 1");
    detail::require(config.min_ratio > 0, "LowRankCompressorConfig", "min_ratio must be > 0");
    detail::require(config.energy_probes >= 1, "LowRankCompressorConfig", "energy_probes must be >= 1");
    detail::require(std::isfinite(config.error_decay) && config.error_decay >= 0 && config.error_decay <= 1,
                    "LowRankCompressorConfig", "error_decay must be in [0, 1]");
    if (config.adaptive) AdaptiveRankController(config.adaptive_config, clamp_r0());  // validates
  }
  LowRankCompressor(LowRankCompressor&&) noexcept = default;
  LowRankCompressor& operator=(LowRankCompressor&&) noexcept = default;

  const LowRankCompressorConfig& config() const { return config_; }

  void setup(std::span<const TensorSpec> specs) {
    specs_.assign(specs.begin(), specs.end());
    ef_.clear();
    matrix_of_.assign(specs_.size(), -1);
    matrices_.clear();
    for (std::size_t i = 0; i < specs_.size(); ++i) {
      ef_.emplace_back(config_.error_feedback ? specs_[i].shape.numel() : 0);
      const auto [m, n] = matrix_shape(specs_[i].shape);
      if (!goes_low_rank(m, n)) continue;
      const int r0 = std::min<int>(clamp_r0(), static_cast<int>(std::min(m, n)));
      AdaptiveConfig ac = config_.adaptive_config;
      ac.r_max = std::min<int>(ac.r_max, static_cast<int>(std::min(m, n)));
      ac.r_min = std::min(ac.r_min, ac.r_max);
      matrix_of_[i] = static_cast<int>(matrices_.size());
      const std::uint64_t key = stream_key(specs_[i]);
      matrices_.push_back({i, m, n, key,
                           std::make_unique<PowerIterationProjector>(
                               m, n, LowRankConfig{.rank = r0, .seed = stream_seed(config_.seed, key, 1)}),
                           config_.adaptive ? std::make_unique<AdaptiveRankController>(ac, std::clamp(r0, ac.r_min, ac.r_max))
                                            : nullptr});
    }
  }

  std::string describe() const {
    return "low-rank r" + std::to_string(config_.rank) + " int" + std::to_string(config_.factor_quant.bits) + "/b" +
           std::to_string(config_.factor_quant.block) + (config_.factor_blocks_by_column ? " column-blocked" : "") +
           " factors, small tensors int" +
           std::to_string(config_.small_quant.bits) + "/b" + std::to_string(config_.small_quant.block) +
           (config_.error_feedback ? " + error feedback decay " + detail::number(config_.error_decay) : "") +
           (config_.adaptive ? " + adaptive rank [" + std::to_string(config_.adaptive_config.r_min) + ", " +
                                   std::to_string(config_.adaptive_config.r_max) + "]"
                             : "") +
           ", min ratio " + detail::number(config_.min_ratio) + ", " + to_string(config_.algorithm);
  }

  // Which tensors go low rank, at which rank now (the rest: quantized only).
  std::vector<TensorTreatment> treatment() const {
    std::vector<TensorTreatment> t;
    for (std::size_t i = 0; i < specs_.size(); ++i) {
      const int j = matrix_of_[i];
      t.push_back({specs_[i].name, j >= 0, j >= 0 ? matrices_[static_cast<std::size_t>(j)].proj->rank() : 0});
    }
    return t;
  }

  // The Compressor contract (compressor.hpp); besides, mean[j] may be x[j]'s own memory
  // (a DDP hook reducing a gradient in place): it then receives the mean, and what is
  // still owed stays in the error feedback only.
  SyncReport sync(AnyCommunicator& comm, const SyncInput& in, TensorSpans x, TensorSpans mean) {
    const bool mine = in.contributes[static_cast<std::size_t>(comm.rank())] != 0;
    if (config_.error_feedback)
      for (std::size_t j = 0; j < in.tensors.size(); ++j) {
        if (mine) ef_[in.tensors[j]].add_to(x[j]);
        else ef_[in.tensors[j]].reset();
      }
    split(in, x, mean);
    SyncReport r;
    if (!mats_.empty()) sync_matrices(comm, in, mine, r);
    if (!smalls_.empty()) sync_small(comm, in, mine, r);
    for (std::size_t j = 0; j < in.tensors.size(); ++j) {  // what is still owed
      if (x[j].data() == mean[j].data()) continue;  // x's memory holds the mean
      if (config_.error_feedback) std::copy_n(ef_[in.tensors[j]].residual().begin(), x[j].size(), x[j].begin());
      else std::fill(x[j].begin(), x[j].end(), 0.0f);
    }
    r.contributors = count_contributors(in.contributes);
    return r;
  }

  void save_state(StateWriter& w) const {
    for (const auto& e : ef_) w.values(e.residual());
    for (const auto& mx : matrices_) {
      mx.proj->save_state(w);
      if (mx.controller) mx.controller->save_state(w);
    }
  }
  void forget_owed() {
    for (auto& e : ef_) std::fill(e.residual().begin(), e.residual().end(), 0.0f);
  }
  void load_state(StateReader& r) {
    for (auto& e : ef_) r.values(e.residual());
    for (auto& mx : matrices_) {
      mx.proj->load_state(r);
      if (mx.controller) mx.controller->load_state(r);
    }
  }

  // At the initial rank: P and Q (and the energy probes, when adaptive) of every matrix
  // that goes low rank, plus the small tensors quantized, per rank per sync.
  std::uint64_t wire_bytes(std::span<const TensorSpec> specs, int replicas) const {
    std::uint64_t p = 0, q = 0, small = 0;
    const std::size_t fb = config_.factor_quant.block, sb = config_.small_quant.block;
    auto up = [](std::size_t v, std::size_t b) { return (v + b - 1) / b * b; };
    for (const auto& s : specs) {
      const auto [m, n] = matrix_shape(s.shape);
      if (!goes_low_rank(m, n)) {
        small += up(s.shape.numel(), sb);
        continue;
      }
      const auto r = static_cast<std::size_t>(std::min<int>(clamp_r0(), static_cast<int>(std::min(m, n))));
      p += up(m * r, fb);
      q += up(n * r, fb) + (config_.adaptive ? up(n * static_cast<std::size_t>(config_.energy_probes), fb) : 0);
    }
    std::uint64_t bytes = 0;
    if (p) bytes += CompressedReducer::cost(factor_codec_, config_.algorithm, p, replicas).bytes;
    if (q) bytes += CompressedReducer::cost(factor_codec_, config_.algorithm, q, replicas).bytes;
    if (small) bytes += CompressedReducer::cost(small_codec_, config_.algorithm, small, replicas).bytes;
    return bytes;
  }

  // Residuals, and per low-rank matrix the warm-started Q and P at r_max.
  std::uint64_t state_bytes(std::span<const TensorSpec> specs) const {
    std::uint64_t n = 0;
    for (const auto& s : specs) {
      const auto [m, c] = matrix_shape(s.shape);
      if (config_.error_feedback) n += s.shape.numel();
      if (goes_low_rank(m, c)) n += (m + c) * static_cast<std::size_t>(config_.adaptive ? config_.adaptive_config.r_max : config_.rank);
    }
    return 4 * n;
  }

 private:
  struct Matrix {
    std::size_t tensor, m, n;
    std::uint64_t key;  // stream_key: its projector's and probes' streams
    std::unique_ptr<PowerIterationProjector> proj;
    std::unique_ptr<AdaptiveRankController> controller;  // null without adaptive rank
  };
  struct Part {  // one tensor of this sync
    std::size_t j;  // its index in x / mean
    Matrix* mx;     // null for a small tensor
  };
  using RowMatrix = detail::RowMatrixF;

  int clamp_r0() const {
    if (!config_.adaptive) return config_.rank;
    return std::clamp(config_.rank, config_.adaptive_config.r_min, config_.adaptive_config.r_max);
  }
  bool goes_low_rank(std::size_t m, std::size_t n) const {
    const double r0 = clamp_r0();
    return m > 1 && n > 1 &&
           static_cast<double>(m + n) * r0 < static_cast<double>(m) * static_cast<double>(n) / config_.min_ratio;
  }
  int probes() const { return config_.adaptive ? config_.energy_probes : 0; }

  // Sorts this sync's tensors into matrices and small tensors.
  void split(const SyncInput& in, TensorSpans x, TensorSpans mean) {
    mats_.clear(), smalls_.clear();
    x_ = x, mean_out_ = mean;
    for (std::size_t j = 0; j < in.tensors.size(); ++j) {
      const int mi = matrix_of_[in.tensors[j]];
      (mi >= 0 ? mats_ : smalls_).push_back({j, mi >= 0 ? &matrices_[static_cast<std::size_t>(mi)] : nullptr});
    }
    parts_.resize(std::max(2 * mats_.size(), smalls_.size()));
    if (z_.size() < mats_.size()) z_.resize(mats_.size());
  }

  MatrixView<const float> view(const Part& p) const { return {x_[p.j].data(), p.mx->m, p.mx->n}; }

  void sync_matrices(AnyCommunicator& comm, const SyncInput& in, bool mine, SyncReport& r) {
    // Phase 1: P_i = X_i Q_i on every replica; their mean, shared, orthonormalized.
    lengths_.clear(), cols_.clear();
    for (auto& p : mats_) {
      if (p.mx->controller && p.mx->proj->rank() != p.mx->controller->rank()) p.mx->proj->set_rank(p.mx->controller->rank());
      lengths_.push_back(p.mx->m * static_cast<std::size_t>(p.mx->proj->rank()));
      cols_.push_back(static_cast<std::size_t>(p.mx->proj->rank()));
    }
    layout_.assign(lengths_, config_.factor_quant.block);
    for (std::size_t k = 0; k < mats_.size(); ++k) parts_[k] = mats_[k].mx->proj->left(view(mats_[k])).span();
    r.cost += reduce_factors(comm, in, std::span(parts_).first(mats_.size()), 10);
    for (auto& p : mats_) p.mx->proj->orthonormalize_left();
    // Phase 2: [Q_i | Z_i] = X_i^T [P_i | G_i'] (Z: energy probes, G' = G - P P^T G);
    // this replica's decoded Q_i is what it sent (error feedback); then the means.
    right_factors(in);
    r.cost += reduce_factors(comm, in, std::span(parts_).first(2 * mats_.size()), 20);
    double rank_sum = 0, scale_sum = 0;
    for (std::size_t k = 0; k < mats_.size(); ++k) {
      Matrix& mx = *mats_[k].mx;
      const std::size_t j = mats_[k].j, n = mx.n;
      const auto rr = static_cast<std::size_t>(mx.proj->rank());
      std::copy_n(mean_flat_.begin() + static_cast<std::ptrdiff_t>(layout_.offset(2 * k)), n * rr,
                  mx.proj->right_factor().begin());
      // The residual reads x, which the mean may overwrite (mean[j] aliasing x[j]).
      if (config_.error_feedback && mine) residual(mats_[k], std::span<const float>(sent_).subspan(layout_.offset(2 * k), n * rr));
      mx.proj->reconstruct({mean_out_[j].data(), mx.m, n});  // Delta = P mean(Q)^T
      rank_sum += static_cast<double>(rr);
      if (mx.controller) {
        const auto z = std::span<const float>(mean_flat_).subspan(layout_.offset(2 * k + 1), n * probes());
        double resid = 0;
        for (float v : z) resid += static_cast<double>(v) * v;
        const double captured = mx.proj->sketch_energy();
        mx.controller->observe(mx.proj->singular_values(), captured, captured + resid / probes());
        scale_sum += static_cast<double>(mx.controller->rank()) / config_.rank;
      }
    }
    r.low_rank = rank_sum / static_cast<double>(mats_.size());
    if (config_.adaptive) r.local_steps_scale = scale_sum / static_cast<double>(mats_.size()),
                          r.local_steps_weight = static_cast<double>(mats_.size());
  }

  // parts_[2k] = Q_k (n, r), parts_[2k + 1] = Z_k (n, s) of matrix k of this sync; the
  // layout and, with error feedback, sent_ = what this replica's encoding decodes to.
  void right_factors(const SyncInput& in) {
    lengths_.clear(), cols_.clear();
    for (auto& p : mats_) {
      lengths_.push_back(p.mx->n * static_cast<std::size_t>(p.mx->proj->rank()));
      lengths_.push_back(p.mx->n * static_cast<std::size_t>(probes()));
      cols_.push_back(static_cast<std::size_t>(p.mx->proj->rank()));
      cols_.push_back(static_cast<std::size_t>(probes()));
    }
    layout_.assign(lengths_, config_.factor_quant.block);
    for (std::size_t k = 0; k < mats_.size(); ++k) {
      Matrix& mx = *mats_[k].mx;
      parts_[2 * k] = mx.proj->right(view(mats_[k])).span();
      if (!probes()) {
        parts_[2 * k + 1] = {};
        continue;
      }
      probe_directions(mx, in.sync);
      z_[k].resize(mx.n * static_cast<std::size_t>(probes()));
      Eigen::Map<RowMatrix> z(z_[k].data(), static_cast<Eigen::Index>(mx.n), probes());
      Eigen::Map<const RowMatrix> xm(x_[mats_[k].j].data(), static_cast<Eigen::Index>(mx.m),
                                     static_cast<Eigen::Index>(mx.n));
      z.noalias() = xm.transpose() * g_;
      parts_[2 * k + 1] = z_[k];
    }
  }

  // g_ (m, s) = G - P (P^T G), G standard normal for (seed, sync, tensor name): the same
  // on every replica, orthogonal to the shared subspace P.
  void probe_directions(const Matrix& mx, std::uint64_t sync) {
    const auto m = static_cast<Eigen::Index>(mx.m), s = static_cast<Eigen::Index>(probes());
    g_.resize(m, s);
    const std::uint64_t seed = stream_seed(config_.seed ^ probe_salt ^ mx.key, sync, 0);
    for (Eigen::Index i = 0; i < g_.size(); ++i) g_.data()[i] = counter_normal(seed, static_cast<std::uint64_t>(i));
    const auto pf = mx.proj->left_factor();
    Eigen::Map<const RowMatrix> p(pf.data(), m, mx.proj->rank());
    pg_.noalias() = p.transpose() * g_;
    g_.noalias() -= p * pg_;
  }

  // The mean of parts (laid out by layout_) into mean_flat_, written back into the
  // parts; with error feedback, sent_ = this replica's own encoding decoded.
  WireCost reduce_factors(AnyCommunicator& comm, const SyncInput& in, std::span<const std::span<float>> parts,
                          std::uint32_t salt) {
    layout_.gather(parts, flat_);
    if (config_.factor_blocks_by_column) transpose_parts(flat_, false);
    if (config_.error_feedback && salt == 20) {
      sent_.resize(flat_.size());
      encode_then_decode(factor_codec_, flat_, sent_, work_);
      if (config_.factor_blocks_by_column) transpose_parts(sent_, true);
    }
    mean_flat_.assign(flat_.size(), 0.0f);
    const auto res = factors_.mean(comm, flat_, in.contributes, mean_flat_, stream_seed(config_.seed, in.sync, salt));
    if (config_.factor_blocks_by_column) transpose_parts(mean_flat_, true);
    if (salt == 10) layout_.scatter(mean_flat_, parts);
    return res.cost;
  }

  // Each part of flat (laid out by layout_, a (rows, cols_[i]) row-major factor) from
  // row-major to column-major order, or back.
  void transpose_parts(std::vector<float>& flat, bool back) {
    for (std::size_t i = 0; i < layout_.size(); ++i) {
      const std::size_t cols = cols_[i], len = layout_.length(i);
      if (cols <= 1 || len == 0) continue;
      const auto rows = static_cast<Eigen::Index>(len / cols), c = static_cast<Eigen::Index>(cols);
      float* seg = flat.data() + layout_.offset(i);
      transposed_.assign(seg, seg + len);
      using ColMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor>;
      if (back) Eigen::Map<RowMatrix>(seg, rows, c) = Eigen::Map<const ColMatrix>(transposed_.data(), rows, c);
      else Eigen::Map<ColMatrix>(seg, rows, c) = Eigen::Map<const RowMatrix>(transposed_.data(), rows, c);
    }
  }

  // e = x - P Q_sent^T, in place (no (m, n) copy of what was sent: for a 100B model's
  // embedding, GBs).
  void residual(const Part& part, std::span<const float> q_sent) {
    Matrix& mx = *part.mx;
    const auto m = static_cast<Eigen::Index>(mx.m), n = static_cast<Eigen::Index>(mx.n);
    const auto rr = static_cast<Eigen::Index>(mx.proj->rank());
    const auto pf = mx.proj->left_factor();
    Eigen::Map<const RowMatrix> pm(pf.data(), m, rr), q(q_sent.data(), n, rr);
    Eigen::Map<RowMatrix> e(ef_[mx.tensor].assign(x_[part.j]).data(), m, n);
    e.noalias() -= pm * q.transpose();
    ef_[mx.tensor].scale(config_.error_decay);
  }

  // Vectors and small matrices: quantized only, one payload.
  void sync_small(AnyCommunicator& comm, const SyncInput& in, bool mine, SyncReport& r) {
    lengths_.clear();
    for (auto& p : smalls_) lengths_.push_back(x_[p.j].size());
    small_layout_.assign(lengths_, config_.small_quant.block);
    for (std::size_t k = 0; k < smalls_.size(); ++k) parts_[k] = x_[smalls_[k].j];
    small_layout_.gather(std::span(parts_).first(smalls_.size()), flat_);
    mean_flat_.assign(flat_.size(), 0.0f);
    r.cost += small_.mean(comm, flat_, in.contributes, mean_flat_, stream_seed(config_.seed, in.sync, 30)).cost;
    if (config_.error_feedback && mine) {  // before the mean is written: it may overwrite x
      sent_.resize(flat_.size());
      encode_then_decode(small_codec_, flat_, sent_, work_);
      for (std::size_t k = 0; k < smalls_.size(); ++k)
        ef_[in.tensors[smalls_[k].j]].update(x_[smalls_[k].j], small_layout_.part(std::span<const float>(sent_), k),
                                             config_.error_decay);
    }
    for (std::size_t k = 0; k < smalls_.size(); ++k) parts_[k] = mean_out_[smalls_[k].j];
    small_layout_.scatter(mean_flat_, std::span(parts_).first(smalls_.size()));
  }

  static constexpr std::uint64_t probe_salt = 0x3c6ef372fe94f82bULL;

  LowRankCompressorConfig config_;
  Codec factor_codec_, small_codec_;
  CompressedReducer factors_, small_;
  std::vector<TensorSpec> specs_;
  std::vector<ErrorFeedback> ef_;          // (tensors) residuals (empty buffers without error feedback)
  std::vector<int> matrix_of_;             // (tensors) index into matrices_, or -1
  std::vector<Matrix> matrices_;
  // This sync's working state.
  TensorSpans x_, mean_out_;
  std::vector<Part> mats_, smalls_;
  std::vector<std::size_t> lengths_, cols_;  // the parts of layout_: lengths, and columns of each factor
  FlatLayout layout_, small_layout_;
  std::vector<std::span<float>> parts_;    // views of the factors / tensors being reduced
  std::vector<std::vector<float>> z_;      // (matrices of the sync) (n, s) probe products, row-major
  RowMatrix g_, pg_;                       // (m, s) probe directions, (r, s) P^T G
  std::vector<float> flat_, mean_flat_, sent_;  // flat payload input, mean, what this replica sent
  std::vector<float> transposed_;               // one factor, while transpose_parts reorders it
  std::vector<std::byte> work_;
};

static_assert(Compressor<LowRankCompressor>);

}  // namespace dilocox
