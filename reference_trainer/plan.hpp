// reference_trainer/plan.hpp: `dilocox-train --plan`, the arithmetic of a run before
// renting the hardware: parameters per stage, memory per rank of a K x S x D layout
// (weights, gradients, AdamW; the outer loop's state by component, sharded over the D
// ranks of a stage as dilocox/shard.hpp does; activations), the smallest layouts that fit
// the GPU with the outer state sharded, whole on every rank, or absent (AllReduce), bytes
// on the wire and seconds per outer round for each sync mode on the shared site link,
// and the tokens/s that follow from a per-rank compute rate. Bytes and state come from each mode's compressor (wire_bytes, state_bytes), so
// the plan and a real run count the same way. Pure arithmetic; allocates nothing
// model-sized; no MPI.
#pragma once

#include "layout.hpp"
#include "model/gpt_config.hpp"
#include "sync_modes.hpp"

#include <dilocox/comm/cost.hpp>
#include <dilocox/diloco.hpp>
#include <dilocox/shard.hpp>
#include <dilocox/wire.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace dilocox::trainer {

struct PlanInput {
  GptConfig model;
  std::int64_t params_override = 0;  // --params N: a model known only by its size
  int clusters = 2, stages = 1, dp = 1;
  bool inner_sharded = true;         // weights, gradients, AdamW split over the dp ranks (FSDP / ZeRO-3)
  int batch = 16, micro_batches = 1, seq_len = 128;
  SyncOptions sync;
  double rank_flops = 100e12;        // achieved training FLOP/s of one rank
  double gpu_memory = 80e9;          // bytes per rank
};

struct MemoryPlan {  // bytes per rank
  double weights = 0, grads = 0, adamw = 0, activations = 0;
  OuterMemory outer;  // the outer loop's state, by component (dilocox::outer_memory)
  double total() const { return weights + grads + adamw + activations + static_cast<double>(outer.total()); }
};

struct ModePlan {
  std::string mode;
  int steps_per_round = 1;
  double wire_bytes_per_round = 0;   // the busiest rank's, under the real algorithm
  double site_bytes_per_round = 0;   // every rank of a cluster together: what its site link carries
  double comm_seconds_per_round = 0; // the site link's seconds for them
  double compute_seconds_per_round = 0;
  double round_seconds = 0;          // with overlap: max(compute, comm); without: the sum
  double tokens_per_second = 0;      // all clusters together
};

// The fewest ranks per cluster (stages x dp) whose every rank fits the GPU, for one way of
// holding the outer state; found = false when no layout up to the model's layers does.
struct LayoutFit {
  std::string outer;                 // "sharded" (over dp), "whole" (on every rank), "none" (AllReduce)
  bool found = false;
  int at_stages = 0;                 // the stage count searched at (0: every count)
  int stages = 0, dp = 0;            // when found
  int ranks() const { return RankLayout{.clusters = 1, .dp = dp, .stages = stages}.world(); }  // per cluster
  double memory = 0;                 // per rank, the largest stage
};

struct Plan {
  GptConfig model;                   // the shape planned (synthesized for --params)
  std::int64_t params = 0;
  double stage_params = 0;           // the largest stage
  MemoryPlan memory;                 // per rank, for the largest stage
  bool fits = false;
  double step_compute_seconds = 0;
  std::vector<ModePlan> modes;
  // The smallest layouts that fit, the outer state sharded and whole (modes with an outer
  // loop) and none (AllReduce): over every stage count, then at the plan's stages.
  std::vector<LayoutFit> layouts;
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

// The tensors of stage s, whole (the outer loop shards by whole tensors), for the
// compressors' wire_bytes and state_bytes; the vectors as one tensor. A model known only
// by size (--params) has the matrices of shape_for_params: a compressor's bytes depend on
// them (low rank needs matrices), so it must not be planned as one flat vector.
inline std::vector<TensorSpec> stage_specs(const GptConfig& model, int stages, int s) {
  std::vector<PlanMatrix> mats;
  std::int64_t vec = 0;
  stage_tensors(model, stages, s, mats, vec);
  std::vector<TensorSpec> specs;
  for (std::size_t i = 0; i < mats.size(); ++i)
    specs.push_back({"m" + std::to_string(i), {static_cast<std::size_t>(mats[i].rows), static_cast<std::size_t>(mats[i].cols)}});
  if (vec > 0) specs.push_back({"vectors", {static_cast<std::size_t>(vec)}});
  return specs;
}

// The parts of stage s's tensors the dp ranks' outer loops hold (dilocox/shard.hpp).
inline std::vector<std::vector<TensorSpec>> stage_shards(const GptConfig& model, int stages, int s, int dp) {
  const auto specs = stage_specs(model, stages, s);
  const auto owner = shard_tensors(specs, dp);
  std::vector<std::vector<TensorSpec>> parts(static_cast<std::size_t>(dp));
  for (std::size_t i = 0; i < specs.size(); ++i) parts[static_cast<std::size_t>(owner[i])].push_back(specs[i]);
  return parts;
}

// The options a mode runs with in this plan: the user's, with --bits and --knob only for
// the chosen mode.
inline SyncOptions options_for(const PlanInput& in, const SyncMode& m) {
  SyncOptions o = in.sync;
  o.mode = m.name;
  if (m.name != in.sync.mode) o.bits = 0, o.knobs.clear();
  return o;
}

// The parameters of stage s: its tensors', or exactly --params / stages when given.
inline double stage_param_count(const PlanInput& in, int s) {
  if (in.params_override > 0) return static_cast<double>(in.params_override) / in.stages;
  double n = 0;
  for (const auto& t : stage_specs(in.model, in.stages, s)) n += static_cast<double>(t.shape.numel());
  return n;
}

// Bytes each dp rank of stage s puts on the wire for one outer round (or one step,
// AllReduce, whose gradient the dp ranks split evenly).
inline std::vector<double> round_wire_bytes(const PlanInput& in, const SyncMode& m, int s) {
  std::vector<double> out;
  if (m.per_step) {  // the gradient of every parameter: exactly --params where given
    const auto n = static_cast<std::uint64_t>(stage_param_count(in, s));
    out.assign(static_cast<std::size_t>(in.dp), static_cast<double>(ring_allreduce_cost(n * 4 / in.dp, in.clusters).bytes));
    return out;
  }
  const AnyCompressor c = make_compressor(m, options_for(in, m));
  for (const auto& part : stage_shards(in.model, in.stages, s, in.dp)) {
    const auto bytes = c.wire_bytes(part, in.clusters);
    dilocox::detail::require(bytes.has_value(), "plan", "--sync " + m.name + ": its compressor does not report wire_bytes");
    out.push_back(static_cast<double>(*bytes));
  }
  return out;
}

// Per-rank memory of stage s on dp ranks: the inner state split over them when
// inner_sharded, the batch split over them, the outer state by whole tensors (the
// largest part) when outer_sharded, else whole on every rank.
inline MemoryPlan stage_memory(const PlanInput& in, const SyncMode& mode, int s, bool outer_sharded) {
  MemoryPlan m;
  const double n = stage_param_count(in, s), p = in.inner_sharded ? n / in.dp : n;
  m.weights = 4 * p;  // fp32, as dilocox-train holds them
  m.grads = 4 * p;
  m.adamw = 8 * p;    // m and v
  if (!mode.per_step && in.clusters > 1) {
    const AnyCompressor c = make_compressor(mode, options_for(in, mode));
    if (!outer_sharded || in.dp == 1) {
      m.outer = outer_memory(stage_specs(in.model, in.stages, s), c, in.sync.momentum_storage);
    } else {
      for (const auto& part : stage_shards(in.model, in.stages, s, in.dp))
        if (const auto o = outer_memory(part, c, in.sync.momentum_storage); o.total() > m.outer.total()) m.outer = o;
    }
  }
  // Activations of the micro-batches in flight (1F1B: stages - s on stage s), per layer
  // per token: 8C + 2F + heads x T + 4 floats (what GptStage keeps for backward).
  const auto& c = in.model;
  const double tokens = static_cast<double>(in.batch) / in.micro_batches * in.seq_len / in.dp;
  const auto r = stage_layers(c.n_layer, in.stages, s);
  const double per_layer = (8.0 * c.n_embd + 2.0 * c.ffn_hidden() + c.n_head * in.seq_len + 4) * 4.0;
  const int in_flight = std::min(in.micro_batches, in.stages - s);
  m.activations = in_flight * tokens * per_layer * (r.last - r.first);
  if (s == in.stages - 1) m.activations += tokens * c.vocab * 4.0;
  return m;
}

// The largest per-rank memory of the layout: stage 0 (the most layers, the embeddings,
// the most micro-batches in flight) or the last (the head and its logits).
inline MemoryPlan largest_stage_memory(const PlanInput& in, const SyncMode& mode, bool outer_sharded) {
  const MemoryPlan first = stage_memory(in, mode, 0, outer_sharded);
  if (in.stages == 1) return first;
  const MemoryPlan last = stage_memory(in, mode, in.stages - 1, outer_sharded);
  return last.total() > first.total() ? last : first;
}

// The fewest stages x dp ranks per cluster that fit (ties: fewer stages, the smaller
// bubble), over every stage count or at `stages` (> 0). Sharded outer state: dp at most
// the tensors of a stage (whole tensors).
inline LayoutFit smallest_layout(PlanInput in, const SyncMode& mode, bool outer_sharded, int stages) {
  LayoutFit best{.outer = mode.per_step ? "none" : outer_sharded ? "sharded" : "whole", .at_stages = stages};
  for (int s = stages > 0 ? stages : 1; s <= (stages > 0 ? stages : in.model.n_layer); ++s) {
    in.stages = s;
    const int most = outer_sharded && !mode.per_step ? static_cast<int>(stage_specs(in.model, s, s - 1).size()) : 4096;
    for (int d = 1; d <= most && (!best.found || RankLayout{.clusters = 1, .dp = d, .stages = s}.world() < best.ranks()); ++d) {
      in.dp = d;
      const double mem = largest_stage_memory(in, mode, outer_sharded).total();
      if (mem > in.gpu_memory) continue;
      best.found = true, best.stages = s, best.dp = d, best.memory = mem;
      break;
    }
  }
  return best;
}

inline ModePlan plan_mode(const PlanInput& in, const SyncMode& m, double step_compute_seconds) {
  ModePlan mp;
  mp.mode = m.name;
  mp.steps_per_round = m.per_step ? 1 : in.sync.local_steps;
  for (int s = 0; s < in.stages; ++s)
    for (double b : round_wire_bytes(in, m, s)) {
      mp.wire_bytes_per_round = std::max(mp.wire_bytes_per_round, b);
      mp.site_bytes_per_round += b;
    }
  const int hops = m.per_step ? 2 * (in.clusters - 1) : in.clusters - 1;
  mp.comm_seconds_per_round = link_seconds({static_cast<std::uint64_t>(mp.site_bytes_per_round), hops}, in.sync.link);
  mp.compute_seconds_per_round = mp.steps_per_round * step_compute_seconds;
  const bool overlap = !m.per_step && in.sync.overlap.value_or(m.overlap);
  mp.round_seconds = overlap ? std::max(mp.compute_seconds_per_round, mp.comm_seconds_per_round)
                             : mp.compute_seconds_per_round + mp.comm_seconds_per_round;
  const double step_tokens = static_cast<double>(in.batch) * in.seq_len;
  mp.tokens_per_second = in.clusters * mp.steps_per_round * step_tokens / mp.round_seconds;
  return mp;
}

inline Plan make_plan(PlanInput in) {
  Plan plan;
  if (in.params_override > 0) in.model = shape_for_params(in.params_override);
  in.model.validate();
  plan.model = in.model;
  plan.params = in.params_override > 0 ? in.params_override : in.model.params();
  dilocox::detail::require(in.stages >= 1 && in.stages <= in.model.n_layer, "plan",
                           "--stages " + std::to_string(in.stages) + " for " + std::to_string(in.model.n_layer) +
                               " layers: need 1 <= stages <= layers");
  for (int s = 0; s < in.stages; ++s) plan.stage_params = std::max(plan.stage_params, stage_param_count(in, s));
  const SyncMode& chosen = sync_mode(in.sync.mode);
  plan.memory = largest_stage_memory(in, chosen, true);
  plan.fits = plan.memory.total() <= in.gpu_memory;

  // Compute: a cluster of stages x dp ranks runs one replica's step; the pipeline bubble
  // adds (S - 1) / M of a step.
  const double step_tokens = static_cast<double>(in.batch) * in.seq_len;
  const double ranks = RankLayout{.clusters = 1, .dp = in.dp, .stages = in.stages}.world();
  const double bubble = 1.0 + static_cast<double>(in.stages - 1) / in.micro_batches;
  const double flops = in.params_override > 0 ? 6.0 * static_cast<double>(plan.params) : in.model.flops_per_token(in.seq_len);
  plan.step_compute_seconds = step_tokens * flops / (ranks * in.rank_flops) * bubble;
  for (const SyncMode& m : sync_modes()) plan.modes.push_back(plan_mode(in, m, plan.step_compute_seconds));
  for (const int stages : {0, in.stages}) {
    if (!chosen.per_step)
      for (const bool sharded : {true, false}) plan.layouts.push_back(smallest_layout(in, chosen, sharded, stages));
    plan.layouts.push_back(smallest_layout(in, sync_mode("allreduce"), true, stages));
  }
  return plan;
}

}  // namespace dilocox::trainer
