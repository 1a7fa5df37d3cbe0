// bench/synthetic_batch.hpp: the token and target ids the training-step benchmarks feed
// (CPU and CUDA alike): counter-based, uniform over the vocabulary, the same every run.
#pragma once

#include <dilocox/random.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

struct SyntheticBatch {
  std::vector<std::int32_t> tokens, targets;  // (n) each

  SyntheticBatch(std::size_t n, int vocab) : tokens(n), targets(n) {
    const auto v = static_cast<std::uint32_t>(vocab);
    for (std::size_t i = 0; i < n; ++i) {
      tokens[i] = static_cast<std::int32_t>(dilocox::counter_bits(1, i) % v);
      targets[i] = static_cast<std::int32_t>(dilocox::counter_bits(2, i) % v);
    }
  }
};
