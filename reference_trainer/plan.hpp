// reference_trainer/plan.hpp: `dilocox-train --plan`, the arithmetic of a run before
// renting the hardware: parameters per stage, memory per rank (weights, gradients,
// AdamW, outer-loop state, error feedback, workspace) with the smallest sharding of a
// stage that fits the GPU, bytes on the wire and seconds per outer round for each
// sync mode on the given link, and the tokens/s that follow from a per-rank compute
// rate. Bytes and state come from each mode's compressor (wire_bytes, state_bytes), so
// the plan and a real run count the same way. Pure arithmetic; allocates nothing
// model-sized; no MPI.
#pragma once

#include "layout.hpp"
#include "model/gpt_config.hpp"
#include "sync_modes.hpp"

#include <dilocox/comm/cost.hpp>
#include <dilocox/wire.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace dilocox::trainer {

struct PlanInput {
  GptConfig model;
  std::int64_t params_override = 0;  // --params N: a model known only by its size
  int clusters = 2, stages = 1, shards = 0;  // shards: 0 = the fewest that fit gpu_memory
  int batch = 16, micro_batches = 1, seq_len = 128;
  SyncOptions sync;
  double rank_flops = 100e12;        // achieved training FLOP/s of one rank
  double gpu_memory = 80e9;          // bytes per rank
};

struct MemoryPlan {  // bytes per rank
  double weights = 0, grads = 0, adamw = 0, outer = 0, error_feedback = 0, workspace = 0, activations = 0;
  double total() const { return weights + grads + adamw + outer + error_feedback + workspace + activations; }
};

struct ModePlan {
  std::string mode;
  int steps_per_round = 1;
  double wire_bytes_per_round = 0;   // per rank (one stage shard), under the real algorithm
  double comm_seconds_per_round = 0;
  double compute_seconds_per_round = 0;
  double round_seconds = 0;          // with overlap: max(compute, comm); without: the sum
  double tokens_per_second = 0;      // all clusters together
};

struct Plan {
  GptConfig model;                   // the shape planned (synthesized for --params)
  std::int64_t params = 0;
  double stage_params = 0;           // the largest stage
  int shards = 1;
  MemoryPlan memory;                 // per rank, for the largest stage
  bool fits = false;
  double step_compute_seconds = 0;
  std::vector<ModePlan> modes;
};

struct PlanMatrix {
  std::int64_t rows, cols;
};

// The matrices and vectors of stage s (the tied embedding once, on the first stage).
inline void stage_tensors(const GptConfig& c, int stages, int s, std::vector<PlanMatrix>& matrices,
                          std::int64_t& vector_elems) {
  const std::int64_t C = c.n_embd, F = c.ffn_hidden(), Q = c.qkv_out();
  const auto r = stage_layers(c.n_layer, stages, s);
  matrices.clear();
  vector_elems = 0;
  if (s == 0) {
    matrices.push_back({c.vocab, C});
    matrices.push_back({c.max_seq, C});
  }
  for (int l = r.first; l < r.last; ++l) {
    matrices.insert(matrices.end(), {{Q, C}, {C, C}, {F, C}, {C, F}});
    vector_elems += 2 * C + Q + C + 2 * C + F + C;
  }
  if (s == stages - 1) vector_elems += 2 * C;
}

// A GPT shape of about n parameters: width by size class, depth from 12 L C^2 = n.
inline GptConfig shape_for_params(std::int64_t n) {
  GptConfig c;
  c.name = "params-" + std::to_string(n);
  c.n_embd = n >= 50'000'000'000 ? 12288 : n >= 5'000'000'000 ? 5120 : n >= 500'000'000 ? 2048 : 768;
  c.n_head = c.n_embd / 128;
  c.vocab = 50272;
  c.max_seq = 2048;
  c.n_layer = std::max<int>(1, static_cast<int>(std::llround(static_cast<double>(n) / (12.0 * c.n_embd * c.n_embd))));
  return c;
}

// The tensors of stage s as one rank of `shards` holds them (rows split), for the
// compressors' wire_bytes and state_bytes; the vectors as one tensor. A model known only
// by size (--params) has the matrices of shape_for_params: a compressor's bytes depend on
// them (low rank needs matrices), so it must not be planned as one flat vector.
inline std::vector<TensorSpec> stage_specs(const PlanInput& in, int s, int shards) {
  std::vector<PlanMatrix> mats;
  std::int64_t vec = 0;
  stage_tensors(in.model, in.stages, s, mats, vec);
  std::vector<TensorSpec> specs;
  for (std::size_t i = 0; i < mats.size(); ++i)
    specs.push_back({"m" + std::to_string(i),
                     {static_cast<std::size_t>((mats[i].rows + shards - 1) / shards), static_cast<std::size_t>(mats[i].cols)}});
  if (vec > 0) specs.push_back({"vectors", {static_cast<std::size_t>((vec + shards - 1) / shards)}});
  return specs;
}

// The options a mode runs with in this plan: the user's, with --bits only for the chosen mode.
inline SyncOptions options_for(const PlanInput& in, const SyncMode& m) {
  SyncOptions o = in.sync;
  o.mode = m.name;
  if (m.name != in.sync.mode) o.bits = 0;
  return o;
}

// Bytes one rank puts on the wire for one outer round of stage s (or one step, AllReduce).
inline double round_wire_bytes(const PlanInput& in, const SyncMode& m, int s, int shards) {
  const auto specs = stage_specs(in, s, shards);
  if (m.per_step) {  // the gradient of every parameter: exactly --params where given
    std::uint64_t n = 0;
    for (const auto& t : specs) n += t.shape.numel();
    if (in.params_override > 0) n = static_cast<std::uint64_t>(in.params_override / in.stages / shards);
    return static_cast<double>(ring_allreduce_cost(n * 4, in.clusters).bytes);
  }
  const auto bytes = m.make(options_for(in, m)).wire_bytes(specs, in.clusters);
  dilocox::detail::require(bytes.has_value(), "plan", "--sync " + m.name + ": its compressor does not report wire_bytes");
  return static_cast<double>(*bytes);
}

// Per-rank memory of stage s with the stage sharded `shards` ways (ZeRO-3 style: every
// per-parameter buffer split; activations are per micro-batch and not split).
inline MemoryPlan stage_memory(const PlanInput& in, const SyncMode& mode, double stage_params, int s, int shards) {
  MemoryPlan m;
  const double p = stage_params / shards;
  m.weights = 4 * p;  // fp32, as dilocox-train holds them
  m.grads = 4 * p;
  m.adamw = 8 * p;    // m and v
  if (!mode.per_step && in.clusters > 1) {
    m.outer = 12 * p;        // global theta, the anchor, Nesterov momentum
    m.workspace = 24 * p;    // OuterLoop's two sync slots: delta, its compressed copy, the mean
    const auto state = mode.make(options_for(in, mode)).state_bytes(stage_specs(in, s, shards));
    m.error_feedback = state ? static_cast<double>(*state) : 0;  // the compressor's own state
  }
  // Activations of the micro-batches in flight (1F1B: stages - s on stage s), per layer
  // per token: 8C + 2F + heads x T + 4 floats (what GptStage keeps for backward).
  const auto& c = in.model;
  const double tokens = static_cast<double>(in.batch) / in.micro_batches * in.seq_len / shards;
  const auto r = stage_layers(c.n_layer, in.stages, s);
  const double per_layer = (8.0 * c.n_embd + 2.0 * c.ffn_hidden() + c.n_head * in.seq_len + 4) * 4.0;
  const int in_flight = std::min(in.micro_batches, in.stages - s);
  m.activations = in_flight * tokens * per_layer * (r.last - r.first);
  if (s == in.stages - 1) m.activations += tokens * c.vocab * 4.0;
  return m;
}

inline Plan make_plan(PlanInput in) {
  Plan plan;
  if (in.params_override > 0) in.model = shape_for_params(in.params_override);
  in.model.validate();
  plan.model = in.model;
  plan.params = in.params_override > 0 ? in.params_override : in.model.params();
  // The largest stage decides the memory.
  int worst = 0;
  for (int s = 0; s < in.stages; ++s) {
    std::vector<PlanMatrix> mats;
    std::int64_t vec = 0;
    stage_tensors(in.model, in.stages, s, mats, vec);
    double n = static_cast<double>(vec);
    for (const auto& m : mats) n += static_cast<double>(m.rows) * static_cast<double>(m.cols);
    if (s == in.stages - 1 && in.stages > 1) n += static_cast<double>(in.model.vocab) * in.model.n_embd;
    if (in.params_override > 0) n = static_cast<double>(in.params_override) / in.stages;
    if (n > plan.stage_params) plan.stage_params = n, worst = s;
  }
  const SyncMode& chosen = sync_mode(in.sync.mode);
  plan.shards = in.shards > 0 ? in.shards : 1;
  if (in.shards == 0)
    while (stage_memory(in, chosen, plan.stage_params, worst, plan.shards).total() > in.gpu_memory &&
           plan.shards < 4096)
      ++plan.shards;
  plan.memory = stage_memory(in, chosen, plan.stage_params, worst, plan.shards);
  plan.fits = plan.memory.total() <= in.gpu_memory;

  // Compute: a cluster of stages x shards ranks runs one replica's step; the pipeline
  // bubble adds (S - 1) / M of a step.
  const double step_tokens = static_cast<double>(in.batch) * in.seq_len;
  const double ranks = RankLayout{.clusters = 1, .dp = plan.shards, .stages = in.stages}.world();
  const double bubble = 1.0 + static_cast<double>(in.stages - 1) / in.micro_batches;
  const double flops = in.params_override > 0 ? 6.0 * static_cast<double>(plan.params) : in.model.flops_per_token(in.seq_len);
  plan.step_compute_seconds = step_tokens * flops / (ranks * in.rank_flops) * bubble;

  for (const SyncMode& m : sync_modes()) {
    ModePlan mp;
    mp.mode = m.name;
    mp.steps_per_round = m.per_step ? 1 : in.sync.local_steps;
    double bytes = 0;
    for (int s = 0; s < in.stages; ++s) bytes = std::max(bytes, round_wire_bytes(in, m, s, plan.shards));
    mp.wire_bytes_per_round = bytes;
    const int hops = m.per_step ? 2 * (in.clusters - 1) : in.clusters - 1;
    mp.comm_seconds_per_round = link_seconds({static_cast<std::uint64_t>(bytes), hops}, in.sync.link);
    mp.compute_seconds_per_round = mp.steps_per_round * plan.step_compute_seconds;
    const bool overlap = !m.per_step && in.sync.overlap.value_or(m.overlap);
    mp.round_seconds = overlap ? std::max(mp.compute_seconds_per_round, mp.comm_seconds_per_round)
                               : mp.compute_seconds_per_round + mp.comm_seconds_per_round;
    mp.tokens_per_second = in.clusters * mp.steps_per_round * step_tokens / mp.round_seconds;
    plan.modes.push_back(mp);
  }
  return plan;
}

}  // namespace dilocox::trainer
