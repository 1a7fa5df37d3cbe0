// dilocox/compress/dense.hpp: DenseCompressor, the whole pseudo-gradient on the wire in
// fp32 / fp16 / bf16 / int8 / int4: DiLoCo (fp32), OpenDiLoCo (fp16), Streaming DiLoCo
// (4-bit), with optional error feedback. Every tensor of a sync goes in one payload
// (blocks never straddle two tensors), reduced by all-gather or the re-quantizing ring.
// Not here: sparsification (cocktail.hpp, sparse.hpp), low rank (lowrank.hpp).
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
#include "dilocox/error_feedback.hpp"
#include "dilocox/random.hpp"
#include "dilocox/reduce.hpp"

namespace dilocox {

struct DenseConfig {
  // fp32: DiLoCo's pseudo-gradient as it is (the name says dense, so nothing is lost by
  // default). Streaming DiLoCo's 4 bits: {Encoding::quantized, {.bits = 4, .block = 128}},
  // the trainer's --sync diloco default (measured on tests/convergence, docs/RESULTS.md).
  Codec codec{Encoding::f32, {}};
  // all-gather: K-1 payloads received per rank, exact (no re-quantization); fine for small K.
  ReduceAlgorithm algorithm = ReduceAlgorithm::allgather;
  // off: DiLoCo and its 4-bit variants send the pseudo-gradient as it is.
  bool error_feedback = false;
  float error_decay = 1.0f;  // with error feedback: residual kept as decay (x - sent)
};

class DenseCompressor {
 public:
  explicit DenseCompressor(DenseConfig config = {}) : config_(config), reducer_(config.codec, config.algorithm) {
    detail::require(std::isfinite(config.error_decay) && config.error_decay >= 0 && config.error_decay <= 1,
                    "DenseConfig", "error_decay must be in [0, 1]");
  }

  const DenseConfig& config() const { return config_; }

  void setup(std::span<const TensorSpec> specs) {
    specs_.assign(specs.begin(), specs.end());
    ef_.clear();
    if (config_.error_feedback)
      for (const auto& s : specs_) ef_.emplace_back(s.shape.numel());
  }

  std::string describe() const {
    return "dense " + to_string(config_.codec) +
           (config_.error_feedback ? " + error feedback decay " + detail::number(config_.error_decay) : "") + ", " +
           to_string(config_.algorithm);
  }

  SyncReport sync(AnyCommunicator& comm, const SyncInput& in, TensorSpans x, TensorSpans mean) {
    const bool mine = in.contributes[static_cast<std::size_t>(comm.rank())] != 0;
    lengths_.clear();
    for (std::size_t t : in.tensors) lengths_.push_back(specs_[t].shape.numel());
    layout_.assign(lengths_, config_.codec.encoding == Encoding::quantized ? config_.codec.quant.block : 1);
    for (std::size_t j = 0; j < in.tensors.size() && config_.error_feedback; ++j) {
      if (mine) ef_[in.tensors[j]].add_to(x[j]);
      else ef_[in.tensors[j]].reset();
    }
    layout_.gather(x, flat_);
    mean_.assign(layout_.total(), 0.0f);
    const auto r = reducer_.mean(comm, flat_, in.contributes, mean_, stream_seed(seed_, in.sync, 1));
    layout_.scatter(mean_, mean);
    if (config_.error_feedback && mine) {
      sent_.resize(layout_.total());
      encode_then_decode(config_.codec, flat_, sent_, work_);
      for (std::size_t j = 0; j < in.tensors.size(); ++j)
        ef_[in.tensors[j]].update(x[j], layout_.part(std::span<const float>(sent_), j), config_.error_decay);
    }
    for (std::size_t j = 0; j < in.tensors.size(); ++j) {  // what is still owed
      if (config_.error_feedback) std::copy_n(ef_[in.tensors[j]].residual().begin(), x[j].size(), x[j].begin());
      else std::fill(x[j].begin(), x[j].end(), 0.0f);
    }
    SyncReport report;
    report.cost = r.cost;
    report.contributors = r.contributors;
    return report;
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

  std::uint64_t wire_bytes(std::span<const TensorSpec> specs, int replicas) const {
    std::uint64_t n = 0;
    const std::size_t align = config_.codec.encoding == Encoding::quantized ? config_.codec.quant.block : 1;
    for (const auto& s : specs) n += (s.shape.numel() + align - 1) / align * align;
    return CompressedReducer::cost(config_.codec, config_.algorithm, n, replicas).bytes;
  }

  std::uint64_t state_bytes(std::span<const TensorSpec> specs) const {
    std::uint64_t n = 0;
    for (const auto& s : specs) n += s.shape.numel();
    return config_.error_feedback ? 4 * n : 0;  // the residuals
  }

 private:
  static constexpr std::uint64_t seed_ = 0x6a09e667f3bcc908ULL;  // stochastic rounding streams
  DenseConfig config_;
  CompressedReducer reducer_;
  std::vector<TensorSpec> specs_;
  std::vector<ErrorFeedback> ef_;       // (tensors) residuals, when error feedback is on
  std::vector<std::size_t> lengths_;    // (tensors of this sync)
  FlatLayout layout_;
  std::vector<float> flat_, mean_, sent_;  // (layout total) this rank's x, the mean, what it sent
  std::vector<std::byte> work_;
};

static_assert(Compressor<DenseCompressor>);

}  // namespace dilocox
