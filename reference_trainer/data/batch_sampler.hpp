// reference_trainer/data/batch_sampler.hpp: which tokens a step trains on. Training
// windows of T+1 tokens start at offsets drawn from a counter-based RNG keyed by
// (seed, stream, global sequence index): no state to save, so a resumed run reads
// exactly what an uninterrupted one would, and each replica (stream) reads its own
// windows. Evaluation uses fixed, non-overlapping windows from the start of the shard.
#pragma once

#include "data/token_shard.hpp"

#include <dilocox/random.hpp>

#include <cstdint>
#include <span>
#include <vector>

namespace dilocox::trainer {

class BatchSampler {
 public:
  BatchSampler(const TokenShard& shard, int seq_len, std::uint64_t seed, int stream)
      : shard_(&shard), T_(seq_len), key_(seed * 0x100000001b3ULL + static_cast<std::uint64_t>(stream) + 1) {
    dilocox::detail::require(shard.tokens.size() > static_cast<std::size_t>(seq_len) + 1, "BatchSampler",
                             "the shard holds " + std::to_string(shard.tokens.size()) +
                                 " tokens, fewer than one window of " + std::to_string(seq_len + 1));
  }

  // inputs and targets (count, T) for sequences [first, first + count) of the run.
  void fill(std::uint64_t first, std::size_t count, std::span<std::int32_t> inputs,
            std::span<std::int32_t> targets) const {
    const std::uint64_t windows = shard_->tokens.size() - static_cast<std::size_t>(T_);
    const std::uint32_t k = counter_key(key_, 0);
    for (std::size_t j = 0; j < count; ++j) {
      const std::uint64_t g = first + j;
      const std::uint64_t r = (static_cast<std::uint64_t>(counter_bits(k, 2 * g)) << 32) | counter_bits(k, 2 * g + 1);
      copy_window(r % windows, j, inputs, targets);
    }
  }

  // Evaluation sequence i: the i-th non-overlapping window.
  std::size_t eval_windows() const { return (shard_->tokens.size() - 1) / static_cast<std::size_t>(T_); }
  void fill_eval(std::size_t first, std::size_t count, std::span<std::int32_t> inputs,
                 std::span<std::int32_t> targets) const {
    for (std::size_t j = 0; j < count; ++j)
      copy_window((first + j) % eval_windows() * static_cast<std::size_t>(T_), j, inputs, targets);
  }

 private:
  void copy_window(std::uint64_t start, std::size_t j, std::span<std::int32_t> inputs,
                   std::span<std::int32_t> targets) const {
    const auto* t = shard_->tokens.data() + start;
    for (int i = 0; i < T_; ++i) {
      inputs[j * static_cast<std::size_t>(T_) + static_cast<std::size_t>(i)] = t[i];
      targets[j * static_cast<std::size_t>(T_) + static_cast<std::size_t>(i)] = t[i + 1];
    }
  }
  const TokenShard* shard_;
  int T_;
  std::uint64_t key_;
};

}  // namespace dilocox::trainer
