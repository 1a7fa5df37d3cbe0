// reference_trainer/run_inputs.hpp: what a run of dilocox-train makes of its flags
// before it starts: the model, the training shape (layout, batch split, micro-batches),
// the sync options, the fault to inject; UsageError, the one-line refusal of a bad input
// (exit code 2). Not here: the checks that need the data or the folder (run_start.cpp).
#pragma once

#include "layout.hpp"
#include "stage_trainer.hpp"
#include "sync_modes.hpp"
#include "train_options.hpp"

#include <dilocox/comm/throttled.hpp>
#ifdef DILOCOX_TRAINER_GLOO
#include <dilocox/comm/gloo.hpp>
#endif
#include <mpi.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>

namespace dilocox::trainer {

using json = nlohmann::json;


inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A bad input (flag, data, folder, checkpoint of another run): one line, exit code 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// ---------------------------------------------------------------------------------
// Flags -> the run's shape
// ---------------------------------------------------------------------------------

// The preset with the explicit dimensions applied, validated (for training and --plan).
inline GptConfig resolve_model(const TrainOptions& o) {
  GptConfig m = gpt_preset(o.model);
  if (o.layers || o.embd || o.heads) m.name = o.model + "-custom";
  if (o.layers) m.n_layer = o.layers;
  if (o.embd) m.n_embd = o.embd;
  if (o.heads) m.n_head = o.heads;
  if (o.vocab) m.vocab = o.vocab;
  try {
    m.validate();
  } catch (const dilocox::Error& e) {
    throw UsageError(e.what());
  }
  return m;
}

// The run's rank layout, from its flags.
inline RankLayout layout_of(const TrainOptions& o) { return {.clusters = o.clusters, .dp = o.dp, .stages = o.stages}; }

// --micro-batches, or 1 on one stage and 2 x stages (at most a pipeline's batch) otherwise.
inline int micro_batches_of(const TrainOptions& o) {
  return o.micro_batches ? o.micro_batches : (o.stages == 1 ? 1 : std::min(o.batch / std::max(1, o.dp), 2 * o.stages));
}

inline TrainShape resolve_shape(const TrainOptions& o, int data_vocab, int world) {
  TrainShape s;
  s.model = resolve_model(o);
  if (s.model.vocab < data_vocab)
    throw UsageError("the data's vocabulary (" + std::to_string(data_vocab) + ") is larger than the model's (" +
                     std::to_string(s.model.vocab) + "): raise --vocab");
  if (!s.model.trainable())
    throw UsageError("--model " + o.model + " is a planning shape (grouped-query attention); train tiny, small or medium");
  s.stages = o.stages;
  if (s.stages > s.model.n_layer)
    throw UsageError(std::to_string(s.stages) + " stages for " + std::to_string(s.model.n_layer) + " layers");
  const RankLayout layout = layout_of(o);
  if (world != layout.world())
    throw UsageError(layout.str() + " need " + std::to_string(layout.world()) + " MPI ranks, this run has " +
                     std::to_string(world) + " (mpirun -np " + std::to_string(layout.world()) + ")");
  s.seq_len = o.seq_len ? o.seq_len : s.model.max_seq;
  if (s.seq_len > s.model.max_seq)
    throw UsageError("--seq-len " + std::to_string(s.seq_len) + " exceeds the model's context of " +
                     std::to_string(s.model.max_seq));
  s.batch = o.batch;
  s.dp = o.dp;
  if (s.batch % s.dp != 0)
    throw UsageError("--batch " + std::to_string(s.batch) + " is not divisible by --dp " + std::to_string(s.dp));
  s.micro_batches = micro_batches_of(o);
  if (s.pipeline_batch() % s.micro_batches != 0)
    throw UsageError("--batch " + std::to_string(s.batch) + (s.dp > 1 ? " / --dp " + std::to_string(s.dp) : "") +
                     " is not divisible by " + std::to_string(s.micro_batches) + " micro-batches");
  s.schedule = parse_schedule(o.schedule);
  s.backend.device = o.device == "cuda" ? Device::cuda : Device::cpu;
  s.backend.precision = o.precision == "fp32" ? Precision::fp32 : Precision::bf16;
  return s;
}

// --knob NAME=VALUE flags -> knob values (each name once, each value a finite number).
inline KnobValues parse_knobs(const std::vector<std::string>& flags) {
  KnobValues k;
  for (const auto& f : flags) {
    const auto eq = f.find('=');
    if (eq == std::string::npos || eq == 0) throw UsageError("--knob '" + f + "': expected NAME=VALUE");
    const std::string name = f.substr(0, eq), text = f.substr(eq + 1);
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    if (text.empty() || *end != '\0' || !std::isfinite(v))
      throw UsageError("--knob '" + f + "': '" + text + "' is not a finite number");
    if (!k.emplace(name, v).second) throw UsageError("--knob " + name + " given twice");
  }
  return k;
}

inline SyncOptions resolve_sync(const TrainOptions& o) {
  SyncOptions s;
  s.mode = o.sync;
  s.bits = o.bits;
  s.rank = o.rank;
  s.max_rank = o.max_rank;
  s.local_steps = o.local_steps;
  s.max_local_steps = o.max_local_steps;
  if (o.overlap_given) s.overlap = o.overlap;
  s.adaptive = !o.no_adaptive;
  s.knobs = parse_knobs(o.knobs);
  s.fragments = o.fragments;
  if (!o.rebase.empty())
    s.rebase = o.rebase == "keep"        ? dilocox::Rebase::keep
               : o.rebase == "overwrite" ? dilocox::Rebase::overwrite
               : o.rebase == "mix"       ? dilocox::Rebase::mix
                                         : dilocox::Rebase::blend;
  if (o.overlap_steps >= 0) s.overlap_steps = o.overlap_steps;
  s.momentum_storage = o.momentum_storage == "bf16" ? dilocox::MomentumStorage::bf16 : dilocox::MomentumStorage::fp32;
  if (!o.momentum_at.empty())
    s.momentum_at = o.momentum_at == "mean" ? dilocox::MomentumAt::mean : dilocox::MomentumAt::replica;
  if (o.outer_lr > 0) s.outer_lr = o.outer_lr;
  if (o.outer_momentum >= 0) s.outer_momentum = o.outer_momentum;
  s.step_seconds = o.step_seconds;
  try {
    s.link = link_of(o);
    validate(sync_mode(s.mode), s);
  } catch (const dilocox::Error& e) {
    throw UsageError(e.what());
  }
  return s;
}

// "STEP:REPLICA" -> (step, replica), checked against the run; (-1, -1) when empty.
inline std::pair<std::int64_t, int> parse_fault(const std::string& s, int clusters, std::int64_t total_steps) {
  if (s.empty()) return {-1, -1};
  const auto colon = s.find(':');
  std::int64_t step = 0;
  int rep = 0;
  try {
    if (colon == std::string::npos) throw std::invalid_argument("no colon");
    std::size_t a = 0, b = 0;
    step = std::stoll(s.substr(0, colon), &a);
    rep = std::stoi(s.substr(colon + 1), &b);
    if (a != colon || b != s.size() - colon - 1 || step < 1 || rep < 0) throw std::invalid_argument("range");
  } catch (const std::exception&) {
    throw UsageError("--inject-nan '" + s + "': expected STEP:REPLICA, e.g. 7:1");
  }
  if (rep >= clusters)
    throw UsageError("--inject-nan " + s + ": replica " + std::to_string(rep) + " does not exist (--clusters " +
                     std::to_string(clusters) + ": replicas 0 to " + std::to_string(clusters - 1) + ")");
  if (step > total_steps)
    throw UsageError("--inject-nan " + s + ": step " + std::to_string(step) + " is past the run's " +
                     std::to_string(total_steps) + " steps");
  return {step, rep};
}

// The fields that had to match before checkpoints held every outcome flag ("flags").
inline std::string legacy_mismatch(const json& saved, const json& now) {
  for (const char* key : {"model", "stages", "clusters", "sync", "batch", "micro_batches", "seq_len", "seed"})
    if (saved.value(key, json()) != now.at(key))
      return std::string(key) + ": " + saved.value(key, json()).dump() + " in the checkpoint, " + now.at(key).dump() +
             " now";
  return "";
}


#ifdef DILOCOX_TRAINER_GLOO
// The sites' Gloo groups (--site): the run's store and name, the interface the ranks
// listen on, and --collective-timeout for the rendezvous and every operation.
inline GlooOptions site_gloo(const TrainOptions& o) {
  GlooOptions g{.store = o.rendezvous, .prefix = o.run_id, .interface = o.gloo_interface};
  g.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(o.collective_timeout * 1000));
  return g;
}
#endif

}  // namespace dilocox::trainer
