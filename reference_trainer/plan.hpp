// reference_trainer/plan.hpp: `dilocox-train --plan`, the arithmetic of a run before
// renting the hardware: parameters per stage, memory per rank (weights, gradients,
// AdamW, outer-loop state, error feedback, workspace) with the smallest sharding of a
// stage that fits the GPU, bytes on the wire and seconds per outer round for each
// sync mode on the given link, and the tokens/s that follow from a per-rank compute
// rate. Bytes come from the library's own payload sizes and ring costs, so the plan
// and a real run count the same way. Pure arithmetic; allocates nothing model-sized.
#pragma once

#include "cluster_sync.hpp"
#include "model/gpt_config.hpp"

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
  SyncKind kind;
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

inline double payload_bytes(PayloadKind kind, std::size_t n, const QuantConfig& q) {
  PayloadHeader h{kind, {n}, q, 0};
  return static_cast<double>(payload_size(h, ""));
}

// Bytes one rank puts on the wire for one outer round of stage s (or one step, AllReduce).
inline double round_wire_bytes(const PlanInput& in, SyncKind kind, int s, int shards) {
  std::vector<PlanMatrix> mats;
  std::int64_t vec = 0;
  stage_tensors(in.model, in.stages, s, mats, vec);
  double total = static_cast<double>(vec);
  for (const auto& m : mats) total += static_cast<double>(m.rows) * static_cast<double>(m.cols);
  if (in.params_override > 0) total = static_cast<double>(in.params_override) / in.stages;
  total /= shards;
  const int K = in.clusters;
  const auto n = static_cast<std::size_t>(total);
  const int bits = default_bits(in.sync.kind == kind ? in.sync : SyncOptions{.kind = kind});
  switch (kind) {
    case SyncKind::allreduce:
      return static_cast<double>(ring_allreduce_cost(n * 4, K).bytes);
    case SyncKind::diloco: {
      const double p = bits == 32   ? payload_bytes(PayloadKind::dense_f32, n, {})
                       : bits == 16 ? payload_bytes(PayloadKind::dense_f16, n, {})
                                    : payload_bytes(PayloadKind::quantized, n, {.bits = bits, .block = 128});
      return static_cast<double>(ring_allgather_cost(static_cast<std::uint64_t>(p), K).bytes);
    }
    case SyncKind::cocktail: {
      const CocktailConfig cc;
      const auto nnz = static_cast<std::size_t>(std::round(total * cc.random_fraction * cc.topk_fraction));
      PayloadHeader h{PayloadKind::sparse_quantized, {n}, {.bits = bits, .block = 64}, static_cast<std::uint32_t>(std::min<std::size_t>(nnz, UINT32_MAX))};
      return static_cast<double>(ring_allgather_cost(payload_size(h, ""), K).bytes);
    }
    case SyncKind::dilocox: {
      const LowRankCompressorConfig lc;
      const QuantConfig fq{.bits = bits, .block = lc.factor_quant.block};
      const std::int64_t r = in.sync.rank;
      double bytes = 0, small = static_cast<double>(vec) / shards;
      for (const auto& m : mats) {
        const double rows = static_cast<double>(m.rows) / shards;
        if ((rows + static_cast<double>(m.cols)) * static_cast<double>(r) <
            rows * static_cast<double>(m.cols) / lc.min_ratio) {
          bytes += payload_bytes(PayloadKind::quantized, static_cast<std::size_t>(rows * r), fq);
          bytes += payload_bytes(PayloadKind::quantized, static_cast<std::size_t>(m.cols * r), fq);
        } else {
          small += rows * static_cast<double>(m.cols);
        }
      }
      if (small > 0) bytes += payload_bytes(PayloadKind::quantized, static_cast<std::size_t>(small), lc.small_quant);
      return static_cast<double>(ring_allgather_cost(static_cast<std::uint64_t>(bytes), K).bytes);
    }
  }
  return 0;
}

// Per-rank memory of stage s with the stage sharded `shards` ways (ZeRO-3 style: every
// per-parameter buffer split; activations are per micro-batch and not split).
inline MemoryPlan stage_memory(const PlanInput& in, SyncKind kind, double stage_params, int s, int shards) {
  MemoryPlan m;
  const double p = stage_params / shards;
  m.weights = 4 * p;  // fp32, as dilocox-train holds them
  m.grads = 4 * p;
  m.adamw = 8 * p;    // m and v
  if (kind != SyncKind::allreduce && in.clusters > 1) {
    m.outer = 12 * p;        // global theta, the anchor, Nesterov momentum
    m.workspace = 24 * p;    // OuterLoop's two round slots: delta, its compressed copy, the mean
    m.error_feedback = (kind == SyncKind::cocktail || kind == SyncKind::dilocox) ? 4 * p : 0;
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
  const SyncKind kind = in.sync.kind;
  plan.shards = in.shards > 0 ? in.shards : 1;
  if (in.shards == 0)
    while (stage_memory(in, kind, plan.stage_params, worst, plan.shards).total() > in.gpu_memory &&
           plan.shards < 4096)
      ++plan.shards;
  plan.memory = stage_memory(in, kind, plan.stage_params, worst, plan.shards);
  plan.fits = plan.memory.total() <= in.gpu_memory;

  // Compute: a cluster of stages x shards ranks runs one replica's step; the pipeline
  // bubble adds (S - 1) / M of a step.
  const double step_tokens = static_cast<double>(in.batch) * in.seq_len;
  const double ranks = static_cast<double>(in.stages) * plan.shards;
  const double bubble = 1.0 + static_cast<double>(in.stages - 1) / in.micro_batches;
  const double flops = in.params_override > 0 ? 6.0 * static_cast<double>(plan.params) : in.model.flops_per_token(in.seq_len);
  plan.step_compute_seconds = step_tokens * flops / (ranks * in.rank_flops) * bubble;

  for (SyncKind k : {SyncKind::allreduce, SyncKind::diloco, SyncKind::cocktail, SyncKind::dilocox}) {
    ModePlan mp;
    mp.kind = k;
    mp.steps_per_round = k == SyncKind::allreduce ? 1 : in.sync.local_steps;
    double bytes = 0;
    for (int s = 0; s < in.stages; ++s) bytes = std::max(bytes, round_wire_bytes(in, k, s, plan.shards));
    mp.wire_bytes_per_round = bytes;
    const int hops = k == SyncKind::allreduce ? 2 * (in.clusters - 1) : in.clusters - 1;
    mp.comm_seconds_per_round = link_seconds({static_cast<std::uint64_t>(bytes), hops}, in.sync.link);
    mp.compute_seconds_per_round = mp.steps_per_round * plan.step_compute_seconds;
    const bool overlap = k == SyncKind::dilocox && in.sync.overlap;
    mp.round_seconds = overlap ? std::max(mp.compute_seconds_per_round, mp.comm_seconds_per_round)
                               : mp.compute_seconds_per_round + mp.comm_seconds_per_round;
    mp.tokens_per_second = in.clusters * mp.steps_per_round * step_tokens / mp.round_seconds;
    plan.modes.push_back(mp);
  }
  return plan;
}

}  // namespace dilocox::trainer
