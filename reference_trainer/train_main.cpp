// dilocox-train: the reference trainer. One MPI rank per pipeline stage (S = 1 runs
// without mpirun); each rank holds only its stage's weights and AdamW state. Reads the
// token shards of scripts/prepare_data.sh, trains with warmup + cosine AdamW, evaluates,
// writes metrics (JSONL), checkpoints atomically, resumes bit-for-bit, and stops
// cleanly on SIGINT/SIGTERM. Ends with one JSON summary line on stdout.
#include "checkpoint.hpp"
#include "data/batch_sampler.hpp"
#include "data/token_shard.hpp"
#include "progress.hpp"
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

TrainShape resolve_shape(const TrainOptions& o, int data_vocab, int world) {
  TrainShape s;
  s.model = gpt_preset(o.model);
  if (o.layers || o.embd || o.heads) s.model.name = o.model + "-custom";
  if (o.layers) s.model.n_layer = o.layers;
  if (o.embd) s.model.n_embd = o.embd;
  if (o.heads) s.model.n_head = o.heads;
  if (o.vocab) s.model.vocab = o.vocab;
  if (s.model.vocab < data_vocab)
    throw UsageError("the data's vocabulary (" + std::to_string(data_vocab) + ") is larger than the model's (" +
                     std::to_string(s.model.vocab) + "): raise --vocab");
  try {
    s.model.validate();
  } catch (const dilocox::Error& e) {
    throw UsageError(e.what());
  }
  if (!s.model.trainable())
    throw UsageError("--model " + o.model + " is a planning shape (grouped-query attention); train tiny, small or medium");
  s.stages = o.stages;
  if (s.stages > s.model.n_layer)
    throw UsageError(std::to_string(s.stages) + " stages for " + std::to_string(s.model.n_layer) + " layers");
  if (world != s.stages)
    throw UsageError("--stages " + std::to_string(s.stages) + " needs " + std::to_string(s.stages) +
                     " MPI ranks, this run has " + std::to_string(world) + " (mpirun -np " +
                     std::to_string(s.stages) + ")");
  s.seq_len = o.seq_len ? o.seq_len : s.model.max_seq;
  if (s.seq_len > s.model.max_seq)
    throw UsageError("--seq-len " + std::to_string(s.seq_len) + " exceeds the model's context of " +
                     std::to_string(s.model.max_seq));
  s.batch = o.batch;
  s.micro_batches = o.micro_batches ? o.micro_batches : (s.stages == 1 ? 1 : std::min(o.batch, 2 * s.stages));
  if (s.batch % s.micro_batches != 0)
    throw UsageError("--batch " + std::to_string(s.batch) + " is not divisible by " +
                     std::to_string(s.micro_batches) + " micro-batches");
  s.schedule = parse_schedule(o.schedule);
  return s;
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
          {"batch", s.batch},
          {"micro_batches", s.micro_batches},
          {"seq_len", s.seq_len},
          {"seed", o.seed}};
}

// The fields that must match for a resumed run to continue the same loss curve.
void check_compatible(const json& saved, const json& now, const std::string& path) {
  for (const char* key : {"model", "stages", "batch", "micro_batches", "seq_len", "seed"})
    if (saved.at(key) != now.at(key))
      throw dilocox::Error("checkpoint " + path + " is from a different run: " + key + " " + saved.at(key).dump() +
                           " there, " + now.at(key).dump() + " now");
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
    const std::int64_t total_steps = (o_.tokens + shape_.tokens_per_step() - 1) / shape_.tokens_per_step();
    const BatchSampler train_sampler(train, shape_.seq_len, o_.seed, /*stream=*/0);
    const BatchSampler val_sampler(val, shape_.seq_len, o_.seed, 0);

    MPI_Comm cluster;
    MPI_Comm_dup(world_, &cluster);
    const int stage = rank_;
    const auto act = static_cast<std::size_t>(shape_.micro_batch()) * shape_.seq_len * shape_.model.n_embd;
    StageLink link(cluster, pipeline_slots(shape_.schedule, shape_.stages, stage, shape_.micro_batches), act);
    StageTrainer trainer(shape_, o_.adamw, link, o_.seed);
    prefix_ = "stage" + std::to_string(stage) + "of" + std::to_string(shape_.stages);

    std::int64_t start = 0;
    if (o_.resume) start = resume(trainer, total_steps);
    std::ofstream metrics;
    if (rank_ == 0 && !o_.metrics.empty()) {
      metrics.open(o_.metrics, start > 0 ? std::ios::app : std::ios::trunc);
      if (!metrics) throw UsageError("cannot write --metrics " + o_.metrics);
    }
    ProgressLine progress(rank_ == 0 && !o_.quiet, total_steps);
    if (rank_ == 0 && !o_.quiet)
      progress.note("dilocox-train: " + shape_.model.name + ", " + std::to_string(shape_.model.params()) +
                    " parameters, " + std::to_string(shape_.stages) + " stage(s), " + std::to_string(total_steps) +
                    " steps of " + std::to_string(shape_.tokens_per_step()) + " tokens" +
                    (start > 0 ? ", resuming at step " + std::to_string(start) : ""));

    double train_seconds = 0, last_eval = std::numeric_limits<double>::quiet_NaN();
    std::int64_t step = start, trained_here = 0;
    bool interrupted = false;
    auto evaluate = [&](std::int64_t at) {
      last_eval = trainer.evaluate(val_sampler, static_cast<std::size_t>(o_.eval_sequences));
      if (metrics.is_open())
        metrics << json{{"type", "eval"}, {"step", at}, {"tokens", at * shape_.tokens_per_step()},
                        {"eval_loss", last_eval}}.dump()
                << '\n' << std::flush;
      char buf[96];
      std::snprintf(buf, sizeof buf, "eval at step %lld: val loss %.4f", static_cast<long long>(at), last_eval);
      if (rank_ == 0) progress.note(buf);
    };
    install_signal_handlers();
    while (step < total_steps) {
      const double t0 = now_seconds();
      const StepStats st = trainer.train_step(step, total_steps, train_sampler);
      train_seconds += now_seconds() - t0;
      ++step;
      ++trained_here;
      const double tps = static_cast<double>(trained_here * shape_.tokens_per_step()) / train_seconds;
      if (metrics.is_open())
        metrics << json{{"type", "step"}, {"step", step}, {"tokens", step * shape_.tokens_per_step()},
                        {"loss", st.loss}, {"lr", st.lr}, {"grad_norm", st.grad_norm},
                        {"skipped", st.skipped}, {"tokens_per_second", tps}}.dump()
                << '\n' << std::flush;
      if (st.skipped && rank_ == 0) progress.note("step " + std::to_string(step) + ": non-finite gradient, update skipped");
      progress.step(step, st.loss, tps, static_cast<double>(total_steps - step) * train_seconds /
                                            static_cast<double>(trained_here));
      if (o_.eval_every > 0 && step % o_.eval_every == 0 && step < total_steps) evaluate(step);
      if (o_.checkpoint_every > 0 && step % o_.checkpoint_every == 0 && step < total_steps)
        save(trainer, step, total_steps, progress);
      int stop = g_stop_signal.load();
      MPI_Allreduce(MPI_IN_PLACE, &stop, 1, MPI_INT, MPI_MAX, world_);
      if (stop != 0 && step < total_steps) {
        interrupted = true;
        if (rank_ == 0)
          progress.note(std::string("dilocox-train: ") + (stop == SIGTERM ? "SIGTERM" : "SIGINT") +
                        " at step " + std::to_string(step) +
                        (o_.checkpoint_dir.empty() ? " (no --checkpoint-dir: nothing saved)" : ""));
        break;
      }
      if (o_.stop_after > 0 && trained_here >= o_.stop_after && step < total_steps) {
        interrupted = true;
        if (rank_ == 0) progress.note("dilocox-train: --stop-after " + std::to_string(o_.stop_after) + " reached");
        break;
      }
    }
    if (!interrupted) evaluate(step);
    if (!o_.checkpoint_dir.empty()) save(trainer, step, total_steps, progress);
    progress.finish();
    MPI_Comm_free(&cluster);
    if (rank_ == 0) {
      json summary{{"model", shape_.model.name},
                   {"params", shape_.model.params()},
                   {"stages", shape_.stages},
                   {"steps", step},
                   {"tokens", step * shape_.tokens_per_step()},
                   {"final_eval_loss", interrupted ? json(nullptr) : json(last_eval)},
                   {"tokens_per_second", static_cast<double>(trained_here * shape_.tokens_per_step()) /
                                             std::max(train_seconds, 1e-9)},
                   {"wall_seconds", now_seconds() - t_start},
                   {"interrupted", interrupted}};
      std::printf("%s\n", summary.dump().c_str());
      std::fflush(stdout);
    }
    return 0;
  }

 private:
  void save(const StageTrainer& trainer, std::int64_t step, std::int64_t total_steps, ProgressLine& progress) {
    Checkpoint c;
    trainer.save(c);
    c.put_text("meta", run_meta(shape_, o_, step, total_steps).dump());
    fs::create_directories(o_.checkpoint_dir);
    const auto path = checkpoint_path(o_.checkpoint_dir, prefix_, step);
    c.write_atomically(path);
    MPI_Barrier(world_);  // every stage's file is complete before older ones go
    const auto steps = list_checkpoints(o_.checkpoint_dir, prefix_);
    for (std::size_t i = 2; i < steps.size(); ++i) fs::remove(checkpoint_path(o_.checkpoint_dir, prefix_, steps[i]));
    if (rank_ == 0) progress.note("checkpoint: step " + std::to_string(step) + " -> " + path.string());
  }

  // Loads the newest checkpoint every stage has intact; returns its step (0: none).
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
      throw dilocox::Error("no intact checkpoint for every stage in " + o_.checkpoint_dir + " (stage " +
                           std::to_string(rank_) + (mine == -2 ? ": all refused" : ": none") + ")");
    const auto path = checkpoint_path(o_.checkpoint_dir, prefix_, lo).string();
    if (mine != lo) loaded = Checkpoint::read(path);  // another stage is behind: use the common step
    check_compatible(json::parse(loaded->get_text("meta")), run_meta(shape_, o_, lo, total_steps), path);
    trainer.load(*loaded);
    return lo;
  }

  TrainOptions o_;
  MPI_Comm world_;
  int rank_ = 0, world_size_ = 1;
  TrainShape shape_;
  std::string prefix_;
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
