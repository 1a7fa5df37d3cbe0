// dilocox-train: the reference trainer. One MPI rank per pipeline stage (S = 1 runs
// without mpirun); each rank holds only its stage's weights and AdamW state. Reads the
// token shards of scripts/prepare_data.sh, trains with warmup + cosine AdamW, evaluates,
// writes metrics (JSONL), checkpoints atomically, resumes bit-for-bit, and stops
// cleanly on SIGINT/SIGTERM. Ends with one JSON summary line on stdout.
#include "checkpoint.hpp"
#include "cluster_sync.hpp"
#include "data/batch_sampler.hpp"
#include "data/token_shard.hpp"
#include "plan_report.hpp"
#include "progress.hpp"
#include "pseudo_gradient_dump.hpp"
#include "stage_trainer.hpp"
#include "train_options.hpp"

#include <mpi.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>

namespace fs = std::filesystem;
using namespace dilocox::trainer;
using json = nlohmann::json;

namespace {

std::atomic<int> g_stop_signal{0};
extern "C" void on_stop_signal(int sig) { g_stop_signal.store(sig); }

void install_signal_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A bad combination of flags: one line, exit code 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The preset with the explicit dimensions applied, validated (for training and --plan).
GptConfig resolve_model(const TrainOptions& o) {
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

// --micro-batches, or 1 on one stage and 2 x stages (at most the batch) otherwise.
int micro_batches_of(const TrainOptions& o) {
  return o.micro_batches ? o.micro_batches : (o.stages == 1 ? 1 : std::min(o.batch, 2 * o.stages));
}

TrainShape resolve_shape(const TrainOptions& o, int data_vocab, int world) {
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
  const int need = s.stages * o.clusters;
  if (world != need)
    throw UsageError(std::to_string(o.clusters) + " cluster(s) x " + std::to_string(s.stages) + " stage(s) need " +
                     std::to_string(need) + " MPI ranks, this run has " + std::to_string(world) + " (mpirun -np " +
                     std::to_string(need) + ")");
  s.seq_len = o.seq_len ? o.seq_len : s.model.max_seq;
  if (s.seq_len > s.model.max_seq)
    throw UsageError("--seq-len " + std::to_string(s.seq_len) + " exceeds the model's context of " +
                     std::to_string(s.model.max_seq));
  s.batch = o.batch;
  s.micro_batches = micro_batches_of(o);
  if (s.batch % s.micro_batches != 0)
    throw UsageError("--batch " + std::to_string(s.batch) + " is not divisible by " +
                     std::to_string(s.micro_batches) + " micro-batches");
  s.schedule = parse_schedule(o.schedule);
  s.backend.device = o.device == "cuda" ? Device::cuda : Device::cpu;
  s.backend.precision = o.precision == "fp32" ? Precision::fp32 : Precision::bf16;
  return s;
}

SyncOptions resolve_sync(const TrainOptions& o) {
  SyncOptions s;
  s.mode = o.sync;
  s.bits = o.bits;
  s.rank = o.rank;
  s.max_rank = o.max_rank;
  s.local_steps = o.local_steps;
  s.max_local_steps = o.max_local_steps;
  if (o.overlap_given) s.overlap = o.overlap;
  s.adaptive = !o.no_adaptive;
  s.fragments = o.fragments;
  s.rebase = o.rebase == "keep" ? dilocox::Rebase::keep
             : o.rebase == "overwrite" ? dilocox::Rebase::overwrite : dilocox::Rebase::blend;
  if (o.outer_lr > 0) s.outer_lr = o.outer_lr;
  if (o.outer_momentum >= 0) s.outer_momentum = o.outer_momentum;
  s.step_seconds = o.step_seconds;
  try {
    s.link.bits_per_second = dilocox::parse_bits_per_second(o.wan_bandwidth);
    s.link.latency_seconds = dilocox::parse_seconds(o.wan_latency);
    validate(sync_mode(s.mode), s);
  } catch (const dilocox::Error& e) {
    throw UsageError(e.what());
  }
  return s;
}

// "STEP:REPLICA" -> (step, replica); (-1, -1) when empty.
std::pair<std::int64_t, int> parse_fault(const std::string& s) {
  if (s.empty()) return {-1, -1};
  const auto colon = s.find(':');
  try {
    if (colon == std::string::npos) throw std::invalid_argument("no colon");
    std::size_t a = 0, b = 0;
    const auto step = std::stoll(s.substr(0, colon), &a);
    const auto rep = std::stoi(s.substr(colon + 1), &b);
    if (a != colon || b != s.size() - colon - 1 || step < 1 || rep < 0) throw std::invalid_argument("range");
    return {step, rep};
  } catch (const std::exception&) {
    throw UsageError("--inject-nan '" + s + "': expected STEP:REPLICA, e.g. 7:1");
  }
}

json run_meta(const TrainShape& s, const TrainOptions& o, std::int64_t step, std::int64_t total_steps) {
  return {{"step", step},
          {"total_steps", total_steps},
          {"model",
           {{"layers", s.model.n_layer},
            {"embd", s.model.n_embd},
            {"heads", s.model.n_head},
            {"vocab", s.model.vocab},
            {"max_seq", s.model.max_seq},
            {"ffn", s.model.ffn_hidden()}}},
          {"stages", s.stages},
          {"clusters", o.clusters},
          {"sync", o.clusters > 1 ? o.sync : "none"},
          {"batch", s.batch},
          {"micro_batches", s.micro_batches},
          {"seq_len", s.seq_len},
          {"seed", o.seed}};
}

// The fields that must match for a resumed run to continue the same loss curve.
void check_compatible(const json& saved, const json& now, const std::string& path) {
  for (const char* key : {"model", "stages", "clusters", "sync", "batch", "micro_batches", "seq_len", "seed"})
    if (saved.value(key, json()) != now.at(key))
      throw dilocox::Error("checkpoint " + path + " is from a different run: " + key + " " +
                           saved.value(key, json()).dump() + " there, " + now.at(key).dump() + " now");
}

double sum_over(MPI_Comm comm, double v) {
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_SUM, comm);
  return v;
}

// --plan: arithmetic only, on rank 0; no data, no training.
int run_plan(const TrainOptions& o) {
  PlanInput in;
  in.model = resolve_model(o);
  in.params_override = static_cast<std::int64_t>(o.params);
  in.clusters = o.clusters;
  in.stages = o.stages;
  in.shards = o.shards;
  in.batch = o.batch;
  in.seq_len = o.seq_len ? o.seq_len : in.model.max_seq;
  in.micro_batches = micro_batches_of(o);
  in.sync = resolve_sync(o);
  in.rank_flops = o.rank_flops;
  in.gpu_memory = o.gpu_memory_gb * 1e9;
  const Plan plan = make_plan(in);
  print_plan(in, plan);
  std::printf("%s\n", plan_json(in, plan).dump().c_str());
  return 0;
}

class Run {
 public:
  Run(const TrainOptions& o, MPI_Comm world) : o_(o), world_(world) {
    MPI_Comm_rank(world_, &rank_);
    MPI_Comm_size(world_, &world_size_);
  }

  int main() {
    const double t_start = now_seconds();
    const fs::path data(o_.data_dir);
    for (const char* f : {"train.bin", "val.bin"})
      if (!fs::exists(data / f))
        throw UsageError((data / f).string() + " not found: run scripts/prepare_data.sh (or pass --data-dir)");
    const TokenShard train = read_token_shard((data / "train.bin").string());
    const TokenShard val = read_token_shard((data / "val.bin").string());
    shape_ = resolve_shape(o_, std::max(train.vocab, val.vocab), world_size_);
    const int K = o_.clusters, S = shape_.stages;
    const SyncOptions sync_opts = resolve_sync(o_);
    const auto [fault_step, fault_replica] = parse_fault(o_.inject_nan);
    replica_ = rank_ / S;
    const int stage = rank_ % S;
    const std::int64_t step_tokens = shape_.tokens_per_step() * K;  // all clusters together
    const std::int64_t total_steps = (o_.tokens + step_tokens - 1) / step_tokens;
    const BatchSampler train_sampler(train, shape_.seq_len, o_.seed, /*stream=*/replica_);
    const BatchSampler val_sampler(val, shape_.seq_len, o_.seed, 0);

    if (shape_.backend.device == Device::cuda) {  // one GPU per rank: the node-local rank's, unless --gpu
      MPI_Comm node;
      MPI_Comm_split_type(world_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node);
      int local = 0;
      MPI_Comm_rank(node, &local);
      MPI_Comm_free(&node);
      shape_.backend.gpu = o_.gpu >= 0 ? o_.gpu : local;
    }
    MPI_Comm cluster, stage_comm;
    MPI_Comm_split(world_, replica_, stage, &cluster);
    MPI_Comm_split(world_, stage, replica_, &stage_comm);
    const auto act = static_cast<std::size_t>(shape_.micro_batch()) * shape_.seq_len * shape_.model.n_embd;
    StageLink link(cluster, pipeline_slots(shape_.schedule, S, stage, shape_.micro_batches), act);
    cpu::set_threads(o_.threads);
    StageTrainer trainer(shape_, o_.adamw, link, o_.seed);
    prefix_ = "stage" + std::to_string(stage) + "of" + std::to_string(S) +
              (K > 1 ? "-replica" + std::to_string(replica_) + "of" + std::to_string(K) : "");
    auto& model = trainer.model();
    // On the GPU the host copy of the parameters is moved explicitly. In the outer-loop
    // modes it is pulled once per round, after the local steps, for end_round (and the
    // dump), and pushed after the round writes it: so between rounds, where begin_round,
    // evaluation and finish read it, host and device agree.
    const auto* wte = model.tied_embedding();
    std::optional<ClusterSync> sync;
    if (K > 1) {
      sync.emplace(sync_opts, stage_comm, model, /*sync_tied=*/stage == 0, /*resuming=*/o_.resume);
      if (sync->per_step())
        trainer.set_gradient_hook([&](std::span<float> g, bool finite) { return sync->average_gradients(g, finite); });
    }
    const bool rounds = sync && !sync->per_step();
    std::optional<PseudoGradientDump> dump;
    if (!o_.dump_pseudo_gradients.empty()) {
      if (!rounds) throw UsageError("--dump-pseudo-gradients needs --clusters > 1 and an outer-loop --sync");
      if (sync_opts.fragments != 1) throw UsageError("--dump-pseudo-gradients needs --fragments 1");
      if (replica_ == 0) dump.emplace(o_.dump_pseudo_gradients, stage);
    }
    std::uint64_t dump_index = 0;

    sync_ = sync ? &*sync : nullptr;
    std::int64_t start = 0;
    if (o_.resume) start = resume(trainer, total_steps);
    std::int64_t last_checkpoint = start;
    std::ofstream metrics;
    if (rank_ == 0 && !o_.metrics.empty()) {
      metrics.open(o_.metrics, start > 0 ? std::ios::app : std::ios::trunc);
      if (!metrics) throw UsageError("cannot write --metrics " + o_.metrics);
    }
    ProgressLine progress(rank_ == 0 && !o_.quiet, total_steps);
    if (rank_ == 0 && !o_.quiet)
      progress.note("dilocox-train: " + shape_.model.name + ", " + std::to_string(shape_.model.params()) +
                    " parameters, " + std::to_string(K) + " cluster(s) x " + std::to_string(S) + " stage(s), " +
                    std::to_string(total_steps) + " steps of " + std::to_string(step_tokens) + " tokens" +
                    (sync ? ", sync " + o_.sync + ": " + sync->describe() : "") +
                    (start > 0 ? ", resuming at step " + std::to_string(start) : ""));
    if (rank_ == 0 && !o_.quiet && sync && !sync->treatment().empty())
      progress.note("dilocox-train: stage 0: " + sync->treatment());

    double train_seconds = 0, last_eval = std::numeric_limits<double>::quiet_NaN();
    std::int64_t step = start, trained_here = 0;
    bool interrupted = false, skipped_since_sync = false;
    int mismatched_syncs = 0;
    // Evaluates the global model: in the outer-loop modes theta (identical on every
    // replica), swapped in for the evaluation; otherwise the parameters as they are.
    std::vector<float> saved;
    auto evaluate = [&](std::int64_t at) {
      if (rounds) {
        saved.assign(model.params().begin(), model.params().end());
        sync->load_global();
        if (wte && S > 1) link.copy_tied(model.param(*wte));
        model.push_params();
      }
      last_eval = trainer.evaluate(val_sampler, static_cast<std::size_t>(o_.eval_sequences));
      if (rounds) {
        std::copy(saved.begin(), saved.end(), model.params().begin());
        model.push_params();
      }
      if (metrics.is_open())
        metrics << json{{"type", "eval"}, {"step", at}, {"tokens", at * step_tokens}, {"eval_loss", last_eval},
                        {"seconds", now_seconds() - t_start}}.dump()
                << '\n' << std::flush;
      char buf[96];
      std::snprintf(buf, sizeof buf, "eval at step %lld: val loss %.4f", static_cast<long long>(at), last_eval);
      if (rank_ == 0) progress.note(buf);
    };
    // The last stage's copy of the tied embedding follows the first stage's after the first
    // stage synced: every stage of the cluster learns it from one flag (their schedules differ).
    auto refresh_tied = [&](bool first_stage_synced) {
      if (!wte || S == 1) return;
      int flag = first_stage_synced ? 1 : 0;
      MPI_Allreduce(MPI_IN_PLACE, &flag, 1, MPI_INT, MPI_MAX, cluster);
      if (flag) link.copy_tied(model.param(*wte));
    };
    // Whether to stop now (a signal on any rank, or --stop-after): every rank agrees.
    auto should_stop = [&] {
      int flags[2] = {g_stop_signal.load(), o_.stop_after > 0 && trained_here >= o_.stop_after ? 1 : 0};
      MPI_Allreduce(MPI_IN_PLACE, flags, 2, MPI_INT, MPI_MAX, world_);
      const int sig = flags[0];
      if ((sig == 0 && flags[1] == 0) || step >= total_steps) return false;
      if (rank_ == 0)
        progress.note(sig != 0 ? std::string("dilocox-train: ") + (sig == SIGTERM ? "SIGTERM" : "SIGINT") +
                                     " at step " + std::to_string(step) +
                                     (o_.checkpoint_dir.empty() ? " (no --checkpoint-dir: nothing saved)" : "")
                               : "dilocox-train: --stop-after " + std::to_string(o_.stop_after) + " reached");
      return true;
    };
    install_signal_handlers();
    if (dump) dump->begin_round(model);
    while (step < total_steps && !interrupted) {
      if (fault_step == step + 1 && fault_replica == replica_) trainer.inject_nan_next_step();
      const double t0 = now_seconds();
      const StepStats st = trainer.train_step(step, total_steps, train_sampler);
      if (sync) sync->count_dense_step();
      ++step;
      ++trained_here;
      skipped_since_sync = skipped_since_sync || st.skipped;
      // The outer loop, after every inner step: a sync when this step ends a fragment's turn.
      if (rounds) {
        const bool due = sync->next_step_syncs();
        if (due) {
          model.pull_params();
          // A replica that had to skip a step for a non-finite gradient sits the sync out:
          // the protocol leaves it out on every replica, reports it, and it restarts from theta.
          if (skipped_since_sync) sync->drop_next_sync();
          skipped_since_sync = false;
          if (dump) dump->write(dump_index++, model);
        }
        const auto stats = sync->after_step();
        if (due) {
          refresh_tied(stage == 0);
          model.push_params();
          if (dump) dump->begin_round(model);
        } else {
          refresh_tied(false);
        }
        for (const auto& rs : stats) sync_event(rs, step, step_tokens, metrics, progress, mismatched_syncs, *sync);
      }
      train_seconds += now_seconds() - t0;
      const double tps = static_cast<double>(trained_here * step_tokens) / train_seconds;
      if (metrics.is_open()) {
        json line{{"type", "step"}, {"step", step}, {"tokens", step * step_tokens}, {"loss", st.loss},
                  {"lr", st.lr}, {"grad_norm", st.grad_norm}, {"skipped", st.skipped},
                  {"tokens_per_second", tps}, {"seconds", now_seconds() - t_start}};
        if (sync && sync->per_step()) line["contributors"] = st.contributors;
        metrics << line.dump() << '\n' << std::flush;
      }
      if (st.skipped && rank_ == 0)
        progress.note("step " + std::to_string(step) + ": non-finite gradient, update skipped");
      if (sync && sync->per_step() && st.contributors < K && rank_ == 0)
        progress.note("step " + std::to_string(step) + ": " + std::to_string(K - st.contributors) +
                      " replica(s) with a non-finite gradient left out of the average");
      progress.step(step, st.loss, tps,
                    static_cast<double>(total_steps - step) * train_seconds / static_cast<double>(trained_here));
      if (o_.eval_every > 0 && step % o_.eval_every == 0 && step < total_steps) evaluate(step);
      if (o_.checkpoint_every > 0 && step - last_checkpoint >= o_.checkpoint_every && step < total_steps) {
        save(trainer, step, total_steps, progress);
        last_checkpoint = step;
      }
      interrupted = should_stop();
    }
    if (rounds && !interrupted) {
      const auto stats = sync->finish();
      refresh_tied(true);
      model.push_params();
      for (const auto& rs : stats) sync_event(rs, step, step_tokens, metrics, progress, mismatched_syncs, *sync);
    }
    if (!interrupted) evaluate(step);
    if (!o_.checkpoint_dir.empty()) save(trainer, step, total_steps, progress);
    progress.finish();

    // The summary: wire and dense bytes of every rank, hidden fraction over all rounds.
    json summary{{"model", shape_.model.name},
                 {"params", shape_.model.params()},
                 {"clusters", K},
                 {"stages", S},
                 {"steps", step},
                 {"tokens", step * step_tokens},
                 {"final_eval_loss", interrupted ? json(nullptr) : json(last_eval)},
                 {"tokens_per_second",
                  static_cast<double>(trained_here * step_tokens) / std::max(train_seconds, 1e-9)},
                 {"wall_seconds", now_seconds() - t_start},
                 {"interrupted", interrupted}};
    if (sync) {
      const double wire = sum_over(world_, static_cast<double>(sync->wire_bytes()));
      const double dense = sum_over(world_, static_cast<double>(sync->dense_bytes()));
      const double comm = sum_over(world_, sync->per_step() ? sync->link_seconds() : sync->comm_seconds());
      const double hidden = sum_over(world_, sync->hidden_seconds());
      const double rank_sum = sum_over(world_, sync->last_rank());
      int bad = mismatched_syncs;
      MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, world_);
      summary["sync"] = o_.sync;
      summary["wire_bytes"] = wire;
      summary["dense_bytes"] = dense;
      summary["compression_ratio"] = wire > 0 ? dense / wire : 0.0;
      summary["comm_hidden_fraction"] = comm > 0 ? hidden / comm : 0.0;
      summary["final_rank"] = rank_sum / world_size_;
      summary["final_local_steps"] = rounds ? sync->local_steps() : 1;
      summary["syncs"] = sync->syncs();
      summary["dropped_syncs"] = sync->dropped_syncs();
      summary["replicas_identical"] = bad == 0;
    }
    sync_ = nullptr;
    sync.reset();
    MPI_Comm_free(&stage_comm);
    MPI_Comm_free(&cluster);
    if (rank_ == 0) {
      std::printf("%s\n", summary.dump().c_str());
      std::fflush(stdout);
    }
    return 0;
  }

 private:
  void sync_event(const dilocox::SyncStats& rs, std::int64_t step, std::int64_t step_tokens, std::ofstream& metrics,
                  ProgressLine& progress, int& mismatched, ClusterSync& sync) {
    const bool agree = sync.replicas_agree();
    if (!agree) ++mismatched;
    if (metrics.is_open()) {
      json dropped = json::array();
      for (const auto& d : rs.dropped) dropped.push_back({{"replica", d.replica}, {"tensor", d.tensor}});
      metrics << json{{"type", "sync"}, {"sync", rs.sync}, {"round", rs.round}, {"fragment", rs.fragment},
                      {"step", step}, {"tokens", step * step_tokens}, {"low_rank", rs.low_rank},
                      {"local_steps", rs.local_steps}, {"steps", rs.steps}, {"wire_bytes", rs.wire_bytes},
                      {"fp32_sync_bytes", rs.fp32_sync_bytes}, {"allreduce_step_bytes", rs.allreduce_step_bytes},
                      {"ratio_vs_fp32_sync", rs.ratio_vs_fp32_sync},
                      {"ratio_vs_allreduce_steps", rs.ratio_vs_allreduce_steps}, {"comm_seconds", rs.comm_seconds},
                      {"wait_seconds", rs.wait_seconds}, {"contributors", rs.contributors}, {"dropped", dropped},
                      {"replicas_identical", agree}}
                     .dump()
              << '\n' << std::flush;
    }
    for (const auto& d : rs.dropped)
      if (rank_ == 0)
        progress.note("sync " + std::to_string(rs.sync) + ": replica " + std::to_string(d.replica) +
                      " dropped (non-finite " + d.tensor + ")");
  }

  void save(StageTrainer& trainer, std::int64_t step, std::int64_t total_steps, ProgressLine& progress) {
    Checkpoint c;
    trainer.save(c);
    if (sync_) {
      const auto state = sync_->save_state();
      c.put("cluster_sync", std::span<const std::byte>(state));
    }
    c.put_text("meta", run_meta(shape_, o_, step, total_steps).dump());
    fs::create_directories(o_.checkpoint_dir);
    const auto path = checkpoint_path(o_.checkpoint_dir, prefix_, step);
    c.write_atomically(path);
    MPI_Barrier(world_);  // every rank's file is complete before older ones go
    const auto steps = list_checkpoints(o_.checkpoint_dir, prefix_);
    for (std::size_t i = 2; i < steps.size(); ++i) fs::remove(checkpoint_path(o_.checkpoint_dir, prefix_, steps[i]));
    if (rank_ == 0) progress.note("checkpoint: step " + std::to_string(step) + " -> " + path.string());
  }

  // Loads the newest checkpoint every rank has intact; returns its step (0: none).
  std::int64_t resume(StageTrainer& trainer, std::int64_t total_steps) {
    std::int64_t mine = -1;  // -1: no file at all; -2: files, none intact
    std::optional<Checkpoint> loaded;
    const auto steps = list_checkpoints(o_.checkpoint_dir, prefix_);
    for (auto s : steps) {
      try {
        loaded = Checkpoint::read(checkpoint_path(o_.checkpoint_dir, prefix_, s));
        mine = s;
        break;
      } catch (const dilocox::Error& e) {
        std::fprintf(stderr, "dilocox-train: %s; trying an older one\n", e.what());
      }
    }
    if (mine == -1 && !steps.empty()) mine = -2;
    std::int64_t lo = mine, hi = mine;
    MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_INT64_T, MPI_MIN, world_);
    MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_INT64_T, MPI_MAX, world_);
    if (hi == -1) {
      if (rank_ == 0) std::fprintf(stderr, "dilocox-train: no checkpoint in %s, starting at step 0\n", o_.checkpoint_dir.c_str());
      return 0;
    }
    if (lo < 0)
      throw dilocox::Error("no intact checkpoint for every rank in " + o_.checkpoint_dir + " (" + prefix_ +
                           (mine == -2 ? ": all refused" : ": none") + ")");
    const auto path = checkpoint_path(o_.checkpoint_dir, prefix_, lo).string();
    if (mine != lo) loaded = Checkpoint::read(path);  // another rank is behind: use the common step
    check_compatible(json::parse(loaded->get_text("meta")), run_meta(shape_, o_, lo, total_steps), path);
    trainer.load(*loaded);
    if (sync_) {
      const std::string state = loaded->get_text("cluster_sync");
      sync_->load_state(std::as_bytes(std::span<const char>(state.data(), state.size())));
    }
    return lo;
  }

  TrainOptions o_;
  MPI_Comm world_;
  int rank_ = 0, world_size_ = 1, replica_ = 0;
  TrainShape shape_;
  std::string prefix_;
  ClusterSync* sync_ = nullptr;
};

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  auto parsed = parse_train_options(argc, argv);
  if (auto* code = std::get_if<int>(&parsed)) {
    MPI_Finalize();
    return *code;
  }
  int rc = 0;
  try {
    if (std::get<TrainOptions>(parsed).plan) {
      rc = rank == 0 ? run_plan(std::get<TrainOptions>(parsed)) : 0;
      MPI_Finalize();
      return rc;
    }
    rc = Run(std::get<TrainOptions>(parsed), MPI_COMM_WORLD).main();
  } catch (const UsageError& e) {
    if (rank == 0) std::fprintf(stderr, "dilocox-train: %s\n", e.what());
    rc = 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dilocox-train: rank %d: %s\n", rank, e.what());
    if (size > 1) MPI_Abort(MPI_COMM_WORLD, 1);  // the other stages would wait forever
    rc = 1;
  }
  MPI_Finalize();
  return rc;
}
