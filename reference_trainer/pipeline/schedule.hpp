// reference_trainer/pipeline/schedule.hpp: the order in which one pipeline stage runs
// the forward and backward passes of M micro-batches. GPipe: all forwards, then all
// backwards. 1F1B (PipeDream-flush): S - s - 1 warm-up forwards, then alternate one
// forward and one backward, then drain; it keeps at most S - s micro-batches in
// flight instead of M. Backwards run in micro-batch order in both, so gradients
// accumulate in the same order as on one stage. Pure functions, no communication.
#pragma once

#include <dilocox/config.hpp>

#include <algorithm>
#include <string>
#include <vector>

namespace dilocox::trainer {

enum class Schedule { gpipe, one_f_one_b };

struct PipeOp {
  enum Kind { forward, backward } kind;
  int micro;
  bool operator==(const PipeOp&) const = default;
};

inline std::vector<PipeOp> pipeline_schedule(Schedule schedule, int stages, int stage, int micro_batches) {
  dilocox::detail::require(stages >= 1 && stage >= 0 && stage < stages && micro_batches >= 1, "pipeline_schedule",
                  "need 0 <= stage < stages and micro_batches >= 1");
  std::vector<PipeOp> ops;
  if (schedule == Schedule::gpipe) {
    for (int m = 0; m < micro_batches; ++m) ops.push_back({PipeOp::forward, m});
    for (int m = 0; m < micro_batches; ++m) ops.push_back({PipeOp::backward, m});
    return ops;
  }
  const int warmup = std::min(stages - stage - 1, micro_batches);
  for (int m = 0; m < warmup; ++m) ops.push_back({PipeOp::forward, m});
  for (int m = warmup; m < micro_batches; ++m) {
    ops.push_back({PipeOp::forward, m});
    ops.push_back({PipeOp::backward, m - warmup});
  }
  for (int m = micro_batches - warmup; m < micro_batches; ++m) ops.push_back({PipeOp::backward, m});
  return ops;
}

// Activation slots a stage needs: the most micro-batches between forward and backward.
inline int pipeline_slots(Schedule schedule, int stages, int stage, int micro_batches) {
  return schedule == Schedule::gpipe ? micro_batches : std::min(micro_batches, stages - stage);
}

inline Schedule parse_schedule(const std::string& s) {
  if (s == "gpipe") return Schedule::gpipe;
  if (s == "1f1b") return Schedule::one_f_one_b;
  throw Error("unknown pipeline schedule '" + s + "' (gpipe, 1f1b)");
}

}  // namespace dilocox::trainer
