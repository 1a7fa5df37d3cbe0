// dilocox-train: the reference trainer. One MPI rank per pipeline stage (S = 1 runs
// without mpirun); each rank holds only its stage's weights and AdamW state. Reads the
// token shards of scripts/prepare_data.sh, trains with warmup + cosine AdamW, evaluates,
// writes metrics (JSONL), checkpoints atomically, resumes bit-for-bit, and stops
// cleanly on a stop signal (stop_signals.hpp). Before any work every rank checks its
// inputs and all agree (run_agreement.hpp); a watchdog ends the run when a rank stops
// answering (watchdog.hpp); a run whose loss stays NaN/Inf ends with exit 1. Ends with
// one JSON summary line on stdout.
#include "checkpoint.hpp"
#include "checkpoint_folder.hpp"
#include "cluster_sync.hpp"
#include "data/batch_sampler.hpp"
#include "data/token_shard.hpp"
#include "layout.hpp"
#include "rank_comms.hpp"
#include "metrics_file.hpp"
#include "plan_report.hpp"
#include "progress.hpp"
#include "pseudo_gradient_dump.hpp"
#include "run_agreement.hpp"
#include "run_fingerprint.hpp"
#include "stage_trainer.hpp"
#include "stop_signals.hpp"
#include "train_options.hpp"
#include "watchdog.hpp"

#include <mpi.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>

namespace fs = std::filesystem;
using namespace dilocox::trainer;
using json = nlohmann::json;

namespace {

double now_seconds() {
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

// The run's rank layout, from its flags.
RankLayout layout_of(const TrainOptions& o) { return {.clusters = o.clusters, .dp = o.dp, .stages = o.stages}; }

// --micro-batches, or 1 on one stage and 2 x stages (at most a pipeline's batch) otherwise.
int micro_batches_of(const TrainOptions& o) {
  return o.micro_batches ? o.micro_batches : (o.stages == 1 ? 1 : std::min(o.batch / std::max(1, o.dp), 2 * o.stages));
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
  if (!o.rebase.empty())
    s.rebase = o.rebase == "keep"        ? dilocox::Rebase::keep
               : o.rebase == "overwrite" ? dilocox::Rebase::overwrite
               : o.rebase == "mix"       ? dilocox::Rebase::mix
                                         : dilocox::Rebase::blend;
  if (o.overlap_steps >= 0) s.overlap_steps = o.overlap_steps;
  if (!o.momentum_at.empty())
    s.momentum_at = o.momentum_at == "mean" ? dilocox::MomentumAt::mean : dilocox::MomentumAt::replica;
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

// "STEP:REPLICA" -> (step, replica), checked against the run; (-1, -1) when empty.
std::pair<std::int64_t, int> parse_fault(const std::string& s, int clusters, std::int64_t total_steps) {
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
std::string legacy_mismatch(const json& saved, const json& now) {
  for (const char* key : {"model", "stages", "clusters", "sync", "batch", "micro_batches", "seq_len", "seed"})
    if (saved.value(key, json()) != now.at(key))
      return std::string(key) + ": " + saved.value(key, json()).dump() + " in the checkpoint, " + now.at(key).dump() +
             " now";
  return "";
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

// What the ranks agree on after every step (one allreduce of these, MAX).
struct StepFlags {
  int signal = 0;           // a stop signal on some rank
  bool stop_after = false;  // --stop-after reached
  bool time_due = false;    // --checkpoint-minutes elapsed on some rank's clock
  bool nonfinite = false;   // some replica's loss was NaN/Inf
};

// ---------------------------------------------------------------------------------
// The run: check inputs, agree, build, train, finish
// ---------------------------------------------------------------------------------

class Run {
 public:
  Run(const TrainOptions& o, MPI_Comm world, Watchdog* watchdog) : o_(o), world_(world), watchdog_(watchdog) {
    MPI_Comm_rank(world_, &rank_);
    MPI_Comm_size(world_, &world_size_);
    layout_ = layout_of(o_);
    const RankCoord c = layout_.coord(rank_);
    replica_ = c.cluster, dp_rank_ = c.dp, stage_ = c.stage;
  }

  // This rank's report for the start agreement: every check of its own inputs, with
  // what failed caught and described (never throws).
  json check_inputs() {
    json r{{"parsed", true}, {"code", 0}, {"where", where()}};
    r["flags"] = flag_values(o_, /*outcome_only=*/false);
    if (o_.plan) return r;
    try {
      check_inputs_or_throw();
      r["flags"]["data"] = data_fingerprint_;
      r["checkpoint"] = {{"files", !own_steps_.empty()}, {"intact", intact_steps_}, {"removed_tmp", removed_tmp_}};
    } catch (const UsageError& e) {
      r["code"] = 2;
      r["message"] = e.what();
    } catch (const std::exception& e) {
      r["code"] = 1;
      r["message"] = e.what();
    }
    return r;
  }

  // After a go verdict: the step every rank resumes from (0: start), or the reason none
  // can (the same on every rank). Throws UsageError/dilocox::Error.
  std::int64_t agreed_start(const std::vector<json>& reports) {
    bool any_files = false;
    int removed = 0;
    std::vector<std::int64_t> common;
    for (std::size_t r = 0; r < reports.size(); ++r) {
      const auto& c = reports[r].at("checkpoint");
      any_files = any_files || c.at("files").get<bool>();
      removed += c.at("removed_tmp").get<int>();
      const auto steps = c.at("intact").get<std::vector<std::int64_t>>();
      if (r == 0) common = steps;
      std::erase_if(common, [&](std::int64_t s) { return std::find(steps.begin(), steps.end(), s) == steps.end(); });
    }
    if (removed > 0 && rank_ == 0)
      std::fprintf(stderr, "dilocox-train: removed %d temporary file(s) of a save cut short in %s\n", removed,
                   o_.checkpoint_dir.c_str());
    if (!o_.resume) return 0;
    if (!any_files) {
      if (!o_.resume_if_present)
        throw UsageError("--resume: no checkpoint in " + o_.checkpoint_dir +
                         " to resume (a wrong folder, or one not mounted here?); --resume-if-present starts at step 0 "
                         "when there is none");
      if (rank_ == 0)
        std::fprintf(stderr, "dilocox-train: no checkpoint in %s, starting at step 0 (--resume-if-present)\n",
                     o_.checkpoint_dir.c_str());
      return 0;
    }
    if (!common.empty()) return *std::max_element(common.begin(), common.end());
    // A rank with no checkpoint file at all, and none refused anywhere: no step was ever
    // saved by every rank (the first save was cut short, the other ranks' files of it
    // are all there is), so there is nothing to lose by starting over.
    bool some_never_saved = false, some_refused = false;
    for (const auto& rep : reports) {
      const auto& c = rep.at("checkpoint");
      const bool files = c.at("files").get<bool>(), intact = !c.at("intact").empty();
      some_never_saved = some_never_saved || !files;
      some_refused = some_refused || (files && !intact);
    }
    std::string who;
    for (std::size_t r = 0; r < reports.size(); ++r) {
      const auto steps = reports[r].at("checkpoint").at("intact").get<std::vector<std::int64_t>>();
      std::string list;
      for (auto s : steps) list += (list.empty() ? "" : ", ") + std::to_string(s);
      who += (who.empty() ? "" : "; ") + detail::who(reports, static_cast<int>(r)) + ": " +
             (steps.empty() ? (reports[r]["checkpoint"]["files"].get<bool>() ? "all refused" : "none") : "steps " + list);
    }
    if (some_never_saved && !some_refused) {
      if (rank_ == 0)
        std::fprintf(stderr, "dilocox-train: no step saved by every rank in %s (%s): the first save was cut short, "
                     "starting at step 0\n", o_.checkpoint_dir.c_str(), who.c_str());
      return 0;
    }
    throw dilocox::Error("no intact checkpoint for every rank in " + o_.checkpoint_dir + " at a common step (" + who + ")");
  }

  int train(std::int64_t start);

 private:
  std::string where() const {
    if (world_size_ == 1) return "";
    const std::string r = layout_.describe(rank_);  // "rank 5 (stage 1, dp 0, replica 1)": what is in ( )
    return r.substr(r.find('(') + 1, r.size() - r.find('(') - 2);
  }

  void check_inputs_or_throw() {
    const fs::path data(o_.data_dir);
    for (const char* f : {"train.bin", "val.bin"})
      if (!fs::exists(data / f))
        throw UsageError((data / f).string() + " not found: run scripts/prepare_data.sh (or pass --data-dir)");
    try {
      train_data_ = read_token_shard((data / "train.bin").string());
      val_data_ = read_token_shard((data / "val.bin").string());
    } catch (const dilocox::Error& e) {
      throw UsageError(e.what());
    }
    char fp[80];
    std::snprintf(fp, sizeof fp, "train %016llx, val %016llx",
                  static_cast<unsigned long long>(dilocox::checksum64(std::as_bytes(std::span(train_data_.tokens)))),
                  static_cast<unsigned long long>(dilocox::checksum64(std::as_bytes(std::span(val_data_.tokens)))));
    data_fingerprint_ = fp;
    shape_ = resolve_shape(o_, std::max(train_data_.vocab, val_data_.vocab), world_size_);
    sync_opts_ = resolve_sync(o_);
    step_tokens_ = shape_.tokens_per_step() * o_.clusters;  // all clusters together
    total_steps_ = (o_.tokens + step_tokens_ - 1) / step_tokens_;
    fault_ = parse_fault(o_.inject_nan, o_.clusters, total_steps_);
    try {
      train_sampler_.emplace(train_data_, shape_.seq_len, o_.seed, /*stream=*/replica_);
      val_sampler_.emplace(val_data_, shape_.seq_len, o_.seed, 0);
    } catch (const dilocox::Error& e) {
      throw UsageError(e.what());
    }
    if (!o_.dump_pseudo_gradients.empty()) {
      if (o_.clusters == 1 || sync_mode(o_.sync).per_step)
        throw UsageError("--dump-pseudo-gradients needs --clusters > 1 and an outer-loop --sync");
      if (o_.fragments != 1) throw UsageError("--dump-pseudo-gradients needs --fragments 1");
      if (o_.dp != 1) throw UsageError("--dump-pseudo-gradients needs --dp 1");
    }
    prefix_ = layout_.file_prefix(rank_);
    if (rank_ == 0 && !o_.metrics.empty() && !std::ofstream(o_.metrics, std::ios::app))
      throw UsageError("cannot write --metrics " + o_.metrics);
    if (!o_.checkpoint_dir.empty()) check_checkpoints();
  }

  // The folder takes a test write under the longest name the run will write; this run
  // locks it (rank 0 the folder, every rank its own files); stale temporaries go; a
  // fresh run refuses a folder that holds checkpoints; --resume verifies this rank's
  // files, newest first, and refuses another layout or a checkpoint whose outcome flags
  // differ from this run's.
  void check_checkpoints() {
    const fs::path dir(o_.checkpoint_dir);
    if (o_.resume && !o_.resume_if_present && !fs::is_directory(dir))
      throw UsageError("--resume: " + o_.checkpoint_dir + " does not exist here (a wrong folder, or one not mounted "
                       "here?); --resume-if-present starts at step 0 when there is no checkpoint");
    try {
      probe_checkpoint_dir(dir, prefix_, longest_checkpoint_name(prefix_, total_steps_));
      if (rank_ == 0) folder_lock_ = FolderLock(dir, "dilocox.lock");
      rank_lock_ = FolderLock(dir, prefix_ + ".lock");
    } catch (const dilocox::Error& e) {
      throw UsageError(e.what());
    }
    removed_tmp_ = remove_stale_temporaries(dir, prefix_);
    own_steps_ = list_checkpoints(dir, prefix_);
    const auto layouts = checkpoint_layouts(dir);
    std::string others;
    for (const auto& p : layouts)
      if (RankLayout::of_prefix(p) != RankLayout::of_prefix(prefix_)) others = RankLayout::of_prefix(p) + " (" + p + "-step*.ckpt)";
    if (!o_.resume && !layouts.empty())
      throw UsageError("--checkpoint-dir " + o_.checkpoint_dir + " already holds checkpoints (" +
                       (own_steps_.empty() ? "of " + others : "this run's, newest step " + std::to_string(own_steps_[0])) +
                       "): pass --resume to continue that run, or choose another folder");
    if (!o_.resume) return;
    if (own_steps_.empty() && !others.empty())
      throw UsageError("--resume: " + o_.checkpoint_dir + " holds checkpoints of " + others + ", not of this run's " +
                       RankLayout::of_prefix(prefix_) + ": resume with that layout, or start in another folder");
    for (auto s : own_steps_) {
      const auto path = checkpoint_path(dir, prefix_, s);
      try {
        auto c = Checkpoint::read(path);
        if (!loaded_) {
          check_resumable(c, s);
          loaded_ = std::move(c);
          loaded_step_ = s;
        }
        intact_steps_.push_back(s);
      } catch (const dilocox::Error& e) {
        std::fprintf(stderr, "dilocox-train: %s%s; trying an older one\n",
                     world_size_ > 1 ? (layout_.describe(rank_) + ": ").c_str() : "", e.what());
      }
    }
  }

  // Throws UsageError naming every outcome flag whose value differs from the checkpoint's
  // (the same words on every rank, so a refusal prints once).
  void check_resumable(const Checkpoint& c, std::int64_t step) {
    const json saved = json::parse(c.get_text("meta"));
    const json now = run_meta(0, false, 0);
    const std::string differ = saved.contains("flags") ? describe_resume_mismatches(saved["flags"], now["flags"])
                                                       : legacy_mismatch(saved, now);
    if (!differ.empty())
      throw UsageError("--resume: the checkpoint at step " + std::to_string(step) + " in " + o_.checkpoint_dir +
                       " is from a run with other flags that change the outcome: " + differ +
                       " (pass the checkpoint's values, or start in another folder)");
  }

  json run_meta(std::int64_t step, bool finished, double final_eval) const {
    json flags = flag_values(o_, /*outcome_only=*/true);
    flags["data"] = data_fingerprint_;
    json m{{"step", step},
           {"total_steps", total_steps_},
           {"model",
            {{"layers", shape_.model.n_layer},
             {"embd", shape_.model.n_embd},
             {"heads", shape_.model.n_head},
             {"vocab", shape_.model.vocab},
             {"max_seq", shape_.model.max_seq},
             {"ffn", shape_.model.ffn_hidden()}}},
           {"stages", shape_.stages},
           {"clusters", o_.clusters},
           {"sync", o_.clusters > 1 ? o_.sync : "none"},
           {"batch", shape_.batch},
           {"micro_batches", shape_.micro_batches},
           {"seq_len", shape_.seq_len},
           {"seed", o_.seed},
           {"flags", flags},
           {"finished", finished}};
    if (finished) m["final_eval_loss"] = final_eval;
    return m;
  }

  void at(Activity a, std::int64_t step) {
    if (watchdog_) watchdog_->at(a, step);
  }

  void build();
  void load(std::int64_t start);
  bool stopped_before_training();
  bool room_for_checkpoints();
  Checkpoint make_checkpoint(bool finished);
  void open_metrics(std::int64_t start);
  void write_metrics(const json& line);
  void release();
  void train_loop();
  std::string checkpoint_plan() const;
  void after_rounds_step(bool& skipped_since_sync);
  void log_step(const StepStats& st);
  StepFlags agree_after_step(const StepStats& st);
  void evaluate(std::int64_t at);
  void refresh_tied(bool first_stage_synced);
  void maybe_note_grace();
  void save(bool finished);
  int finish();
  json summary();
  bool data_parallel_identical();
  void sync_event(const dilocox::SyncStats& rs);

  TrainOptions o_;
  MPI_Comm world_;
  Watchdog* watchdog_;
  RankLayout layout_;
  int rank_ = 0, world_size_ = 1, replica_ = 0, dp_rank_ = 0, stage_ = 0;
  // Checked inputs.
  TokenShard train_data_, val_data_;
  std::string data_fingerprint_;
  TrainShape shape_;
  SyncOptions sync_opts_;
  std::int64_t step_tokens_ = 0, total_steps_ = 0;
  std::pair<std::int64_t, int> fault_{-1, -1};
  std::optional<BatchSampler> train_sampler_, val_sampler_;
  std::string prefix_;
  std::vector<std::int64_t> own_steps_, intact_steps_;
  int removed_tmp_ = 0;
  std::optional<Checkpoint> loaded_;
  std::int64_t loaded_step_ = -1;
  FolderLock folder_lock_, rank_lock_;  // held for the run's life
  // Built after the agreement.
  std::unique_ptr<RankComms> comms_;
  MPI_Comm cluster_ = MPI_COMM_NULL;  // comms_->pipeline(): this pipeline's S stages
  std::unique_ptr<StageLink> link_;
  std::unique_ptr<StageTrainer> trainer_;
  std::optional<ClusterSync> sync_;
  std::optional<PseudoGradientDump> dump_;
  std::uint64_t dump_index_ = 0;
  const ParamTensor* wte_ = nullptr;
  bool rounds_ = false;
  MetricsFile metrics_;
  std::unique_ptr<ProgressLine> progress_;
  std::vector<float> saved_params_;
  // The run's progress.
  double t_start_ = now_seconds(), train_seconds_ = 0, last_eval_ = std::numeric_limits<double>::quiet_NaN();
  std::int64_t step_ = 0, trained_here_ = 0, last_checkpoint_ = -1;
  double last_save_time_ = now_seconds(), last_save_seconds_ = 0, last_step_seconds_ = 0;
  bool interrupted_ = false, diverged_ = false, finished_before_ = false, grace_noted_ = false;
  int stop_signal_ = 0, nonfinite_streak_ = 0, mismatched_syncs_ = 0;
};

// ---------------------------------------------------------------------------------
// Build and load
// ---------------------------------------------------------------------------------

void Run::build() {
  const int S = shape_.stages;
  if (shape_.backend.device == Device::cuda) {  // one GPU per rank: the node-local rank's, unless --gpu
    MPI_Comm node;
    MPI_Comm_split_type(world_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node);
    int local = 0;
    MPI_Comm_rank(node, &local);
    MPI_Comm_free(&node);
    shape_.backend.gpu = o_.gpu >= 0 ? o_.gpu : local;
  }
  comms_ = std::make_unique<RankComms>(world_, layout_, rank_);
  cluster_ = comms_->pipeline();
  const MPI_Comm data_parallel = layout_.dp > 1 ? comms_->data_parallel() : MPI_COMM_NULL;
  const auto act = static_cast<std::size_t>(shape_.micro_batch()) * shape_.seq_len * shape_.model.n_embd;
  link_ = std::make_unique<StageLink>(cluster_, pipeline_slots(shape_.schedule, S, stage_, shape_.micro_batches), act);
  cpu::set_threads(o_.threads);
  shape_.dp_rank = dp_rank_;
  trainer_ = std::make_unique<StageTrainer>(shape_, o_.adamw, *link_, data_parallel, o_.seed);
  auto& model = trainer_->model();
  // On the GPU the host copy of the parameters is moved explicitly. In the outer-loop
  // modes it is pulled once per round, after the local steps, for end_round (and the
  // dump), and pushed after the round writes it: so between rounds, where begin_round,
  // evaluation and finish read it, host and device agree.
  wte_ = model.tied_embedding();
  if (o_.clusters > 1) {
    sync_.emplace(sync_opts_, comms_->clusters(), data_parallel, model, /*sync_tied=*/stage_ == 0,
                  /*resuming=*/step_ > 0);
    if (sync_->per_step())
      trainer_->set_gradient_hook([this](std::span<float> g, bool finite) { return sync_->average_gradients(g, finite); });
  }
  rounds_ = sync_ && !sync_->per_step();
  if (!o_.dump_pseudo_gradients.empty() && replica_ == 0) dump_.emplace(o_.dump_pseudo_gradients, stage_);
}

// Loads the agreed step's checkpoint (read again when this rank's newest is another) and
// drops this rank's checkpoints after it: they are not common to every rank.
void Run::load(std::int64_t start) {
  at(Activity::loading, start);
  const auto path = checkpoint_path(o_.checkpoint_dir, prefix_, start);
  if (loaded_step_ != start) {
    loaded_ = Checkpoint::read(path);
    check_resumable(*loaded_, start);
  }
  const json meta = json::parse(loaded_->get_text("meta"));
  finished_before_ = meta.value("finished", false);
  if (finished_before_) last_eval_ = meta.value("final_eval_loss", std::numeric_limits<double>::quiet_NaN());
  trainer_->load(*loaded_);
  if (sync_) {
    const std::string state = loaded_->get_text("cluster_sync");
    sync_->load_state(std::as_bytes(std::span<const char>(state.data(), state.size())));
  }
  loaded_.reset();
  for (auto s : own_steps_)
    if (s > start) fs::remove(checkpoint_path(o_.checkpoint_dir, prefix_, s));
  last_checkpoint_ = start;
}

// A resumed run (--resume at any step, --resume-if-present too) cuts the file back to
// its start step and appends; only a fresh run starts a new file.
void Run::open_metrics(std::int64_t start) {
  if (rank_ != 0 || o_.metrics.empty()) return;
  if (o_.resume && !finished_before_) {
    const auto dropped = cut_metrics_after(o_.metrics, start);
    if (dropped > 0)
      std::fprintf(stderr, "dilocox-train: %s: dropped %zu line(s) logged after step %lld by the interrupted run\n",
                   o_.metrics.c_str(), dropped, static_cast<long long>(start));
  }
  metrics_.open(o_.metrics, /*append=*/o_.resume);
}

void Run::write_metrics(const json& line) {
  const std::string note = metrics_.write(line.dump());
  if (!note.empty()) progress_->warn("dilocox-train: warning: " + note);
}

// A stop signal that arrived while the run was starting or loading: every rank agrees on
// it before the first step and the run ends with exit 0, nothing saved.
bool Run::stopped_before_training() {
  int sig = pending_stop_signal();
  MPI_Allreduce(MPI_IN_PLACE, &sig, 1, MPI_INT, MPI_MAX, world_);
  if (sig == 0) return false;
  interrupted_ = true;
  stop_signal_ = sig;
  if (rank_ == 0)
    progress_->warn("dilocox-train: " + signal_name(sig) + " during start-up: stopped before step " +
                    std::to_string(step_ + 1) + ", nothing trained" +
                    (step_ > 0 ? ", the checkpoints are as they were" : ""));
  return true;
}

// The folder must hold, per rank, the newest two checkpoints plus the one being written,
// each the size of this rank's first one; the ranks of one node share a filesystem (ranks
// on other nodes are counted on theirs). A shortfall ends every rank with exit 2, named
// by the rank that found it.
bool Run::room_for_checkpoints() {
  if (o_.checkpoint_dir.empty()) return true;
  const auto bytes = static_cast<double>(make_checkpoint(false).file_bytes());
  double held = 0;
  for (auto s : list_checkpoints(o_.checkpoint_dir, prefix_)) {
    std::error_code ec;
    const auto n = fs::file_size(checkpoint_path(o_.checkpoint_dir, prefix_, s), ec);
    if (!ec) held += static_cast<double>(n);
  }
  double need = std::max(0.0, 3 * bytes - held);
  MPI_Comm node;
  MPI_Comm_split_type(world_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node);
  int ranks_here = 1;
  MPI_Comm_size(node, &ranks_here);
  MPI_Allreduce(MPI_IN_PLACE, &need, 1, MPI_DOUBLE, MPI_SUM, node);
  MPI_Comm_free(&node);
  const double room = static_cast<double>(free_bytes(o_.checkpoint_dir));
  struct {
    double shortfall;
    int rank;
  } worst{std::max(0.0, need - room), rank_};
  MPI_Allreduce(MPI_IN_PLACE, &worst, 1, MPI_DOUBLE_INT, MPI_MAXLOC, world_);
  if (worst.shortfall <= 0) return true;
  if (worst.rank == rank_) {
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "dilocox-train: %s--checkpoint-dir %s has %.1f MB free, the run needs %.1f MB more there (%d rank(s) "
                  "on this node, each keeping 3 checkpoints of %.1f MB: the newest two and the one being written): "
                  "%.1f MB short; free space or choose another folder\n",
                  world_size_ > 1 ? (layout_.describe(rank_) + ": ").c_str() : "",
                  o_.checkpoint_dir.c_str(), room / 1e6, need / 1e6, ranks_here, bytes / 1e6, worst.shortfall / 1e6);
    std::fputs(buf, stderr);
    std::fflush(stderr);
  }
  return false;
}

// Frees what build() made (the communicators, the outer loop).
void Run::release() {
  if (sync_) sync_.reset();
  comms_.reset();
  cluster_ = MPI_COMM_NULL;
}

// ---------------------------------------------------------------------------------
// Training
// ---------------------------------------------------------------------------------

int Run::train(std::int64_t start) {
  step_ = start;
  build();
  if (start > 0) load(start);
  progress_ = std::make_unique<ProgressLine>(rank_ == 0 && !o_.quiet, total_steps_);
  if (stopped_before_training()) return finish();
  if (!room_for_checkpoints()) {
    release();
    return 2;
  }
  open_metrics(start);
  const int K = o_.clusters, S = shape_.stages;
  if (rank_ == 0 && !o_.quiet)
    progress_->note("dilocox-train: " + shape_.model.name + ", " + std::to_string(shape_.model.params()) +
                    " parameters, " + std::to_string(K) + " cluster(s) x " + std::to_string(S) + " stage(s), " +
                    std::to_string(total_steps_) + " steps of " + std::to_string(step_tokens_) + " tokens" +
                    (sync_ ? ", sync " + o_.sync + ": " + sync_->describe() : "") +
                    (start > 0 ? ", resuming at step " + std::to_string(start) : ""));
  if (rank_ == 0 && !o_.quiet && sync_ && !sync_->treatment().empty())
    progress_->note("dilocox-train: stage 0: " + sync_->treatment());
  if (rank_ == 0 && !o_.quiet) progress_->note("dilocox-train: " + checkpoint_plan());
  if (finished_before_) {
    if (rank_ == 0 && !o_.quiet) progress_->note("dilocox-train: the checkpoint is the end of the run: nothing to train");
  } else {
    train_loop();
  }
  return finish();
}

// Where and when this run saves, for the start banner: an operator knows before the
// first step what a stop or a kill will cost.
std::string Run::checkpoint_plan() const {
  if (o_.checkpoint_dir.empty())
    return "no --checkpoint-dir: nothing is saved, a stop or a kill loses the run";
  char minutes[32];
  std::snprintf(minutes, sizeof minutes, "%g", o_.checkpoint_minutes);
  std::string when;
  if (o_.checkpoint_every > 0) when += "every " + std::to_string(o_.checkpoint_every) + " steps, ";
  if (o_.checkpoint_minutes > 0) when += "every " + std::string(minutes) + " minutes, ";
  return "checkpoints in " + o_.checkpoint_dir + ": " + when +
         "on SIGTERM, SIGINT or SIGUSR1 (README: stopping a run) and at the end";
}

void Run::train_loop() {
  auto& model = trainer_->model();
  bool skipped_since_sync = false;
  if (dump_) dump_->begin_round(model);
  while (step_ < total_steps_) {
    at(Activity::training, step_);
    if (fault_.first == step_ + 1 && fault_.second == replica_) trainer_->inject_nan_next_step();
    const double t0 = now_seconds();
    const StepStats st = trainer_->train_step(step_, total_steps_, *train_sampler_);
    if (sync_) sync_->count_dense_step();
    ++step_;
    ++trained_here_;
    skipped_since_sync = skipped_since_sync || st.skipped;
    if (rounds_) after_rounds_step(skipped_since_sync);
    last_step_seconds_ = now_seconds() - t0;
    train_seconds_ += last_step_seconds_;
    log_step(st);
    const StepFlags f = agree_after_step(st);
    nonfinite_streak_ = f.nonfinite ? nonfinite_streak_ + 1 : 0;
    if (nonfinite_streak_ >= o_.max_nonfinite_steps) {
      diverged_ = true;
      return;
    }
    if ((f.signal != 0 || f.stop_after) && step_ < total_steps_) {
      interrupted_ = true;
      stop_signal_ = f.signal;
      if (rank_ == 0)
        progress_->note(f.signal != 0 ? "dilocox-train: " + signal_name(f.signal) + " at step " + std::to_string(step_) +
                                            (o_.checkpoint_dir.empty() ? " (no --checkpoint-dir: nothing saved)" : "")
                                      : "dilocox-train: --stop-after " + std::to_string(o_.stop_after) + " reached");
      return;
    }
    if (o_.eval_every > 0 && step_ % o_.eval_every == 0 && step_ < total_steps_) evaluate(step_);
    const bool due = (o_.checkpoint_every > 0 && step_ - std::max<std::int64_t>(last_checkpoint_, 0) >= o_.checkpoint_every) ||
                     f.time_due;
    if (!o_.checkpoint_dir.empty() && due && step_ < total_steps_) {
      if (nonfinite_streak_ == 0)
        save(false);
      else if (rank_ == 0)
        progress_->note("dilocox-train: no checkpoint at step " + std::to_string(step_) + ": the loss is not finite");
    }
    maybe_note_grace();
  }
}

// The outer loop, after every inner step: a sync when this step ends a fragment's turn.
void Run::after_rounds_step(bool& skipped_since_sync) {
  auto& model = trainer_->model();
  const bool due = sync_->next_step_syncs();
  if (due) {
    model.pull_params();
    // A replica that had to skip a step for a non-finite gradient sits the sync out:
    // the protocol leaves it out on every replica, reports it, and it restarts from theta.
    if (skipped_since_sync) sync_->drop_next_sync();
    skipped_since_sync = false;
    if (dump_) dump_->write(dump_index_++, model);
  }
  const auto stats = sync_->after_step(due);
  if (due) {
    refresh_tied(stage_ == 0);
    model.push_params();
    if (dump_) dump_->begin_round(model);
  } else {
    refresh_tied(false);
  }
  for (const auto& rs : stats) sync_event(rs);
}

void Run::log_step(const StepStats& st) {
  const int K = o_.clusters;
  const double tps = static_cast<double>(trained_here_ * step_tokens_) / train_seconds_;
  if (metrics_.is_open()) {
    json line{{"type", "step"}, {"step", step_}, {"tokens", step_ * step_tokens_}, {"loss", st.loss},
              {"lr", st.lr}, {"grad_norm", st.grad_norm}, {"skipped", st.skipped},
              {"tokens_per_second", tps}, {"seconds", now_seconds() - t_start_}};
    if (sync_ && sync_->per_step()) line["contributors"] = st.contributors;
    write_metrics(line);
  }
  if (st.skipped && rank_ == 0)
    progress_->note("step " + std::to_string(step_) + ": non-finite gradient, update skipped");
  if (sync_ && sync_->per_step() && st.contributors < K && rank_ == 0)
    progress_->note("step " + std::to_string(step_) + ": " + std::to_string(K - st.contributors) +
                    " replica(s) with a non-finite gradient left out of the average");
  progress_->step(step_, st.loss, tps,
                  static_cast<double>(total_steps_ - step_) * train_seconds_ / static_cast<double>(trained_here_));
}

// One allreduce over every rank after every step: stop signals, --stop-after, the
// checkpoint clock and non-finite losses. Each rank's clock only adds a vote.
StepFlags Run::agree_after_step(const StepStats& st) {
  const bool time_due = !o_.checkpoint_dir.empty() && o_.checkpoint_minutes > 0 &&
                        now_seconds() - last_save_time_ >= 60.0 * o_.checkpoint_minutes;
  int v[4] = {pending_stop_signal(), o_.stop_after > 0 && trained_here_ >= o_.stop_after ? 1 : 0, time_due ? 1 : 0,
              std::isfinite(st.loss) ? 0 : 1};
  MPI_Allreduce(MPI_IN_PLACE, v, 4, MPI_INT, MPI_MAX, world_);
  return {v[0], v[1] != 0, v[2] != 0, v[3] != 0};
}

// Evaluates the global model: in the outer-loop modes theta (identical on every
// replica), swapped in for the evaluation; otherwise the parameters as they are.
void Run::evaluate(std::int64_t at_step) {
  at(Activity::evaluating, at_step);
  auto& model = trainer_->model();
  if (rounds_) {
    saved_params_.assign(model.params().begin(), model.params().end());
    sync_->load_global();
    if (wte_ && shape_.stages > 1) link_->copy_tied(model.param(*wte_));
    model.push_params();
  }
  last_eval_ = trainer_->evaluate(*val_sampler_, static_cast<std::size_t>(o_.eval_sequences));
  if (rounds_) {
    std::copy(saved_params_.begin(), saved_params_.end(), model.params().begin());
    model.push_params();
  }
  if (metrics_.is_open())
    write_metrics({{"type", "eval"}, {"step", at_step}, {"tokens", at_step * step_tokens_}, {"eval_loss", last_eval_},
                   {"seconds", now_seconds() - t_start_}});
  char buf[96];
  std::snprintf(buf, sizeof buf, "eval at step %lld: val loss %.4f", static_cast<long long>(at_step), last_eval_);
  if (rank_ == 0) progress_->note(buf);
}

// The last stage's copy of the tied embedding follows the first stage's after the first
// stage synced: every stage of the cluster learns it from one flag (their schedules differ).
void Run::refresh_tied(bool first_stage_synced) {
  if (!wte_ || shape_.stages == 1) return;
  int flag = first_stage_synced ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &flag, 1, MPI_INT, MPI_MAX, cluster_);
  if (flag) link_->copy_tied(trainer_->model().param(*wte_));
}

// Rank 0, once: when mpirun's SIGTERM-to-SIGKILL grace is shorter than a step plus a
// checkpoint, a Ctrl-C or SIGTERM to mpirun keeps only the last checkpoint before it.
void Run::maybe_note_grace() {
  const double grace = launcher_kill_grace();
  if (grace_noted_ || rank_ != 0 || o_.quiet || grace <= 0 || o_.checkpoint_dir.empty() || trained_here_ < 2) return;
  const double need = last_step_seconds_ + last_save_seconds_;
  if (need < 0.5 * grace) return;
  grace_noted_ = true;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "dilocox-train: note: mpirun leaves the ranks %g s between SIGTERM and SIGKILL "
                "(odls_base_sigkill_timeout) and a step plus a checkpoint take %.1f s here: a Ctrl-C or SIGTERM to "
                "mpirun may keep only the last periodic checkpoint. Stop with `kill -USR1 <mpirun pid>`, or launch "
                "with `mpirun --mca odls_base_sigkill_timeout %d`",
                grace, need, static_cast<int>(std::ceil(4 * need)) + 5);
  progress_->note(buf);
}

void Run::sync_event(const dilocox::SyncStats& rs) {
  const bool agree = sync_->replicas_agree();
  if (!agree) ++mismatched_syncs_;
  if (metrics_.is_open()) {
    json dropped = json::array();
    for (const auto& d : rs.dropped) dropped.push_back({{"replica", d.replica}, {"tensor", d.tensor}});
    write_metrics({{"type", "sync"}, {"sync", rs.sync}, {"round", rs.round}, {"fragment", rs.fragment},
                   {"step", step_}, {"tokens", step_ * step_tokens_}, {"low_rank", rs.low_rank},
                   {"local_steps", rs.local_steps}, {"steps", rs.steps}, {"wire_bytes", rs.wire_bytes},
                   {"fp32_sync_bytes", rs.fp32_sync_bytes}, {"allreduce_step_bytes", rs.allreduce_step_bytes},
                   {"ratio_vs_fp32_sync", rs.ratio_vs_fp32_sync},
                   {"ratio_vs_allreduce_steps", rs.ratio_vs_allreduce_steps}, {"comm_seconds", rs.comm_seconds},
                   {"wait_seconds", rs.wait_seconds}, {"contributors", rs.contributors}, {"dropped", dropped},
                   {"replicas_identical", agree}});
  }
  for (const auto& d : rs.dropped)
    if (rank_ == 0)
      progress_->note("sync " + std::to_string(rs.sync) + ": replica " + std::to_string(d.replica) +
                      " dropped (non-finite " + d.tensor + ")");
}

// ---------------------------------------------------------------------------------
// Checkpoints and the end
// ---------------------------------------------------------------------------------

Checkpoint Run::make_checkpoint(bool finished) {
  Checkpoint c;
  trainer_->save(c);
  if (sync_) {
    const auto state = sync_->save_state();
    c.put("cluster_sync", std::span<const std::byte>(state));
  }
  c.put_text("meta", run_meta(step_, finished, last_eval_).dump());
  return c;
}

// Every rank writes its file; after a barrier (every file complete) the older ones go.
void Run::save(bool finished) {
  at(Activity::checkpointing, step_);
  const double t0 = now_seconds();
  const auto path = checkpoint_path(o_.checkpoint_dir, prefix_, step_);
  make_checkpoint(finished).write_atomically(path);
  at(Activity::waiting_for_saves, step_);
  MPI_Barrier(world_);
  const auto steps = list_checkpoints(o_.checkpoint_dir, prefix_);
  for (std::size_t i = 2; i < steps.size(); ++i) fs::remove(checkpoint_path(o_.checkpoint_dir, prefix_, steps[i]));
  last_checkpoint_ = step_;
  last_save_time_ = now_seconds();
  last_save_seconds_ = last_save_time_ - t0;
  if (rank_ == 0) progress_->note("checkpoint: step " + std::to_string(step_) + " -> " + path.string());
}

// After the loop: the final round and evaluation (unless stopped early), the last
// checkpoint (never of a diverged model), the summary. Returns the exit code.
int Run::finish() {
  at(Activity::finishing, step_);
  const bool finished = !interrupted_ && !diverged_ && !finished_before_;
  if (finished && rounds_) {
    const auto stats = sync_->finish();
    refresh_tied(true);
    trainer_->model().push_params();
    for (const auto& rs : stats) sync_event(rs);
  }
  if (finished) evaluate(step_);
  const bool bad_eval = finished && !std::isfinite(last_eval_);
  const bool save_now = !o_.checkpoint_dir.empty() && !diverged_ && !bad_eval && !finished_before_ &&
                        last_checkpoint_ != step_ && (trained_here_ > 0 || finished);
  if (save_now && nonfinite_streak_ == 0)
    save(finished);
  else if (save_now && rank_ == 0)
    progress_->note("dilocox-train: no checkpoint at step " + std::to_string(step_) + ": the loss is not finite");
  progress_->finish();
  const json s = summary();
  if (rank_ == 0) {
    if (diverged_)
      std::fprintf(stderr,
                   "dilocox-train: the loss was NaN/Inf on some replica for %d consecutive steps (to step %lld): the "
                   "run diverged; no checkpoint written (lower --lr, check the data; --max-nonfinite-steps)\n",
                   nonfinite_streak_, static_cast<long long>(step_));
    if (bad_eval)
      std::fprintf(stderr, "dilocox-train: the final evaluation loss is %s: the run diverged; no checkpoint written\n",
                   std::isnan(last_eval_) ? "NaN" : "infinite");
    if (interrupted_ && stop_signal_ != 0 && o_.checkpoint_dir.empty() && trained_here_ > 0)
      std::fprintf(stderr, "dilocox-train: stopped by %s at step %lld without --checkpoint-dir: the work is lost\n",
                   signal_name(stop_signal_).c_str(), static_cast<long long>(step_));
    if (metrics_.lost_lines() > 0)
      std::fprintf(stderr, "dilocox-train: warning: %zu line(s) of --metrics %s were lost (%s)\n",
                   metrics_.lost_lines(), metrics_.path().c_str(), metrics_.first_error().c_str());
    std::printf("%s\n", s.dump().c_str());
    std::fflush(stdout);
  }
  release();
  if (diverged_ || bad_eval) return 1;
  return interrupted_ && o_.checkpoint_dir.empty() && trained_here_ > 0 ? 1 : 0;
}

// The summary: wire and dense bytes of every rank, hidden fraction over all rounds.
// Whether the D ranks of every stage hold the same parameters, bit for bit (all ranks).
bool Run::data_parallel_identical() {
  auto& model = trainer_->model();
  model.pull_params();
  const std::uint64_t h = dilocox::checksum64(std::as_bytes(std::span<const float>(model.params())));
  std::uint64_t v[2] = {h, ~h};  // min of ~h = ~(max of h)
  MPI_Allreduce(MPI_IN_PLACE, v, 2, MPI_UINT64_T, MPI_MIN, comms_->data_parallel());
  int same = v[0] == ~v[1] ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &same, 1, MPI_INT, MPI_MIN, world_);
  return same != 0;
}

json Run::summary() {
  const int K = o_.clusters;
  json s{{"model", shape_.model.name},
         {"params", shape_.model.params()},
         {"clusters", K},
         {"stages", shape_.stages},
         {"steps", step_},
         {"tokens", step_ * step_tokens_},
         {"final_eval_loss", interrupted_ || diverged_ || !std::isfinite(last_eval_) ? json(nullptr) : json(last_eval_)},
         {"tokens_per_second", static_cast<double>(trained_here_ * step_tokens_) / std::max(train_seconds_, 1e-9)},
         {"wall_seconds", now_seconds() - t_start_},
         {"interrupted", interrupted_},
         {"diverged", diverged_ || (!interrupted_ && !std::isfinite(last_eval_))},
         {"checkpoint_step", last_checkpoint_ >= 0 && !o_.checkpoint_dir.empty() ? json(last_checkpoint_) : json(nullptr)}};
  if (metrics_.is_open()) s["metrics_lost_lines"] = metrics_.lost_lines();
  if (layout_.dp > 1) {  // the fast links inside clusters: data-parallel gradients, shared outer-loop shards
    s["dp"] = layout_.dp;
    s["dp_identical"] = data_parallel_identical();
    s["in_cluster_bytes"] = sum_over(world_, static_cast<double>(trainer_->data_parallel_bytes() +
                                                                 (sync_ ? sync_->group_bytes() : 0)));
  }
  if (sync_) {
    const double wire = sum_over(world_, static_cast<double>(sync_->wire_bytes()));
    const double dense = sum_over(world_, static_cast<double>(sync_->dense_bytes()));
    const double comm = sum_over(world_, sync_->per_step() ? sync_->link_seconds() : sync_->comm_seconds());
    const double hidden = sum_over(world_, sync_->hidden_seconds());
    const double rank_sum = sum_over(world_, sync_->last_rank());
    int bad = mismatched_syncs_;
    MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, world_);
    s["sync"] = o_.sync;
    s["wire_bytes"] = wire;
    s["dense_bytes"] = dense;
    s["compression_ratio"] = wire > 0 ? dense / wire : 0.0;
    s["comm_hidden_fraction"] = comm > 0 ? hidden / comm : 0.0;
    s["final_rank"] = rank_sum / world_size_;
    s["final_local_steps"] = rounds_ ? sync_->local_steps() : 1;
    s["syncs"] = sync_->syncs();
    s["dropped_syncs"] = sync_->dropped_syncs();
    s["replicas_identical"] = bad == 0;
    const auto m = sync_->memory();  // the largest of any rank, component by component
    std::uint64_t v[6] = {m.global, m.anchor, m.momentum, m.workspace, m.compressor, m.total()};
    MPI_Allreduce(MPI_IN_PLACE, v, 6, MPI_UINT64_T, MPI_MAX, world_);
    s["outer_state_bytes_per_rank"] = {{"global", v[0]}, {"anchor", v[1]}, {"momentum", v[2]},
                                       {"workspace", v[3]}, {"compressor", v[4]}, {"total", v[5]}};
  }
  return s;
}

// ---------------------------------------------------------------------------------
// main: parse, watchdog, agree, run
// ---------------------------------------------------------------------------------

// This rank's start-agreement report when its flags did not parse (or asked for --help).
json unparsed_report(const ParseExit& e) {
  json r{{"parsed", false}, {"code", e.code}, {"help", e.code == 0}};
  if (e.code != 0) r["message"] = e.text;
  return r;
}

// Prints the verdict's lines on rank 0 ("dilocox-train: " + line).
void print_verdict(const Verdict& v, int rank) {
  if (rank != 0) return;
  for (const auto& line : v.lines) std::fprintf(stderr, "dilocox-train: %s\n", line.c_str());
  std::fflush(stderr);
}

// The stop signal some rank received before the start agreement (0: none).
int stop_signal_in(const std::vector<json>& reports) {
  int sig = 0;
  for (const auto& r : reports) sig = std::max(sig, r.value("signal", 0));
  return sig;
}

// After a go: the step to start from, decided from the reports alike on every rank, so
// a refusal is printed once (rank 0) and every rank returns its code.
std::variant<std::int64_t, int> start_step(Run& run, const std::vector<json>& reports, int rank) {
  try {
    return run.agreed_start(reports);
  } catch (const UsageError& e) {
    if (rank == 0) std::fprintf(stderr, "dilocox-train: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    if (rank == 0) std::fprintf(stderr, "dilocox-train: %s\n", e.what());
    return 1;
  }
}

// Trains (or plans). An error on one rank from here on ends every rank: it prints its
// message with its rank, stage and replica, and MPI_Abort takes the others down.
int run_agreed(const TrainOptions& o, Run& run, std::int64_t start, int rank, int size) {
  try {
    if (o.plan) return rank == 0 ? run_plan(o) : 0;
    return run.train(start);
  } catch (const UsageError& e) {
    if (size == 1 || o.plan) {
      if (rank == 0) std::fprintf(stderr, "dilocox-train: %s\n", e.what());
      return 2;
    }
    std::fprintf(stderr, "dilocox-train: %s: %s\n", layout_of(o).describe(rank).c_str(), e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 2);  // the others would wait for this rank forever
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dilocox-train: %s: %s\n", (size > 1 ? layout_of(o).describe(rank) : "rank 0").c_str(), e.what());
    std::fflush(stderr);
    if (size > 1) MPI_Abort(MPI_COMM_WORLD, 1);
  }
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  install_stop_signals();  // first: a stop while the run starts or loads ends it cleanly, never kills it
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  auto parsed = parse_train_options(argc, argv);
  const auto* o = std::get_if<TrainOptions>(&parsed);
  std::optional<Watchdog> watchdog;  // its thread calls MPI beside the training's: MPI_THREAD_MULTIPLE
  if (size > 1 && provided < MPI_THREAD_MULTIPLE && rank == 0)
    std::fprintf(stderr, "dilocox-train: note: this MPI library does not provide MPI_THREAD_MULTIPLE: no watchdog, "
                         "a rank that stops answering will hang the others\n");
  if (size > 1 && provided >= MPI_THREAD_MULTIPLE)
    watchdog.emplace(MPI_COMM_WORLD, o ? o->collective_timeout : TrainOptions{}.collective_timeout,
                     o ? o->progress_timeout : TrainOptions{}.progress_timeout,
                     o ? layout_of(*o) : RankLayout{.stages = 0});
  std::optional<Run> run;
  json report;
  if (const auto missing = unclassified_flags(); !missing.empty()) {
    report = {{"parsed", false}, {"code", 1},
              {"message", "internal: flag " + missing.front() + " has no row in reference_trainer/run_fingerprint.hpp"}};
  } else if (o) {
    if (watchdog) watchdog->at(Activity::agreeing, 0);
    run.emplace(*o, MPI_COMM_WORLD, watchdog ? &*watchdog : nullptr);
    report = run->check_inputs();
  } else {
    report = unparsed_report(std::get<ParseExit>(parsed));
  }
  report["signal"] = pending_stop_signal();
  const auto reports = gather_reports(MPI_COMM_WORLD, report);
  const Verdict verdict = judge(reports);
  const int startup_signal = stop_signal_in(reports);
  int rc = verdict.code;
  if (verdict.stop) {
    print_verdict(verdict, rank);
    if (rank == 0 && !o && std::get<ParseExit>(parsed).code == 0) std::printf("%s", std::get<ParseExit>(parsed).text.c_str());
  } else if (startup_signal != 0) {
    if (rank == 0)
      std::fprintf(stderr, "dilocox-train: %s during start-up: stopped before step 1, nothing trained or saved\n",
                   signal_name(startup_signal).c_str());
    rc = 0;
  } else if (o->plan) {
    rc = run_agreed(*o, *run, 0, rank, size);
  } else {
    const auto start = start_step(*run, reports, rank);
    rc = std::holds_alternative<int>(start) ? std::get<int>(start)
                                            : run_agreed(*o, *run, std::get<std::int64_t>(start), rank, size);
  }
  run.reset();
  if (watchdog) watchdog->stop();
  MPI_Finalize();
  return rc;
}
