// reference_trainer/train_options.hpp: the command line of dilocox-train (CLI11) and
// its checks. parse_train_options returns the options, or what to print and the exit
// code: 0 after --help (the help text), 2 after a bad flag (a one-line message). It
// prints nothing itself: under mpirun the ranks agree first (run_agreement.hpp) and
// rank 0 prints. Which flags must match across ranks and on --resume:
// run_fingerprint.hpp, which must classify every flag defined here.
#pragma once

#include "model/adamw.hpp"
#include "model/gpt_config.hpp"
#include "pipeline/schedule.hpp"
#include "sync_modes.hpp"

#include <dilocox/comm/cost.hpp>

#include <CLI/CLI.hpp>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

namespace dilocox::trainer {

struct TrainOptions {
  std::string model = "small";
  int layers = 0, embd = 0, heads = 0, vocab = 0;  // 0: the preset's (vocab: the preset's, at least the data's)
  int stages = 1;
  int dp = 1;                       // D: data-parallel pipelines per cluster, each stage on D ranks (layout.hpp)
  std::int64_t tokens = 2'000'000;  // training budget; steps = ceil(tokens / (batch x seq_len))
  int batch = 16;
  int micro_batches = 0;            // 0: 1 on one stage, 2 x stages otherwise
  int seq_len = 0;                  // 0: the model's context
  std::string schedule = "1f1b";
  std::string device = "cpu";       // cpu or cuda
  std::string precision = "bf16";   // CUDA compute type: bf16 or fp32 (master weights fp32)
  int gpu = -1;                     // CUDA device (modulo the count); -1: the rank's index on its node
  int threads = 1;                  // CPU kernels' threads per rank (results do not depend on it)
  AdamWConfig adamw;
  std::uint64_t seed = 1;
  std::string data_dir = "data/brown";
  std::string metrics;
  std::string checkpoint_dir;
  int checkpoint_every = 0;         // 0: only by time, at the end and on a stop signal
  double checkpoint_minutes = 10;   // wall-clock minutes between checkpoints (with --checkpoint-dir; 0: off):
                                    //   what a SIGKILL can cost at most
  bool resume = false;              // --resume, or --resume-if-present (which sets it too)
  bool resume_if_present = false;   // --resume that starts at step 0 when the folder holds no checkpoint
  std::int64_t stop_after = 0;      // 0: run to the end of the budget; N: stop (and checkpoint) after N steps
  int eval_every = 50;
  int eval_sequences = 128;
  bool quiet = false;
  double collective_timeout = 60;   // seconds of silence before a rank is declared lost (watchdog.hpp)
  double progress_timeout = 600;    // seconds a rank may stay at one step and activity (0: off); generous: a
                                    //   slow evaluation or save must not end a healthy run (watchdog.hpp)
  int max_nonfinite_steps = 10;     // consecutive steps with a NaN/Inf loss (any replica) that end the run
  // Across clusters: K replicas x D x S stages = mpirun -np K*D*S; modes: the registry's methods.
  int clusters = 1;
  std::string sync = SyncOptions{}.mode;  // the defaults below are SyncOptions' (sync_modes.hpp)
  int bits = SyncOptions{}.bits;
  int rank = SyncOptions{}.rank;
  int max_rank = SyncOptions{}.max_rank;
  int local_steps = SyncOptions{}.local_steps;
  int max_local_steps = SyncOptions{}.max_local_steps;
  bool overlap = true;              // --overlap / --no-overlap (when given; else the mode's default)
  bool overlap_given = false;
  bool no_adaptive = false;
  std::vector<std::string> knobs;   // --knob NAME=VALUE, repeatable: the mode's other knobs
  int fragments = SyncOptions{}.fragments;
  std::string rebase;               // "": the mode's
  int overlap_steps = -1;           // < 0: the mode's tau
  std::string momentum_at;          // "": the mode's
  std::string momentum_storage = to_string(SyncOptions{}.momentum_storage);
  float outer_lr = 0;               // 0: the mode's outer step
  float outer_momentum = -1;        // < 0: the mode's outer step
  double step_seconds = SyncOptions{}.step_seconds;
  std::string wan_bandwidth = "1Gbps", wan_latency = "0";
  std::string inject_nan;           // "STEP:REPLICA": that replica's step sees a NaN batch (tests)
  std::string dump_pseudo_gradients;  // folder: replica 0 writes each round's pseudo-gradient
  // One job per site (world.hpp): this job is cluster `site` (-1: one job holds every cluster).
  int site = -1;
  std::string rendezvous;           // the sites' store: redis://HOST:PORT or file:///DIR
  std::string run_id;               // the run's namespace in the store
  std::string gloo_interface;       // the interface the ranks listen on for the other sites
  int elastic = 0;                  // > 0: elastic sites, this many start the run (0 .. elastic - 1)
  // Planning (--plan): no training.
  bool plan = false;
  double params = 0;                // a model known only by its size
  double rank_flops = 100e12;       // achieved training FLOP/s per rank
  double gpu_memory_gb = 80;
  std::string inner_state = "sharded";  // --plan: weights, gradients, AdamW split over dp, or whole on each
};

inline std::vector<std::string> sync_mode_names_vector() {
  std::vector<std::string> v;
  for (const auto& m : sync_modes()) v.push_back(m.name);
  return v;
}

// Parse-time limits of the emulated link: below 1 kbit/s one sync of `tiny` takes
// minutes; over 60 s of latency per hop is no network this trainer can be used on.
inline constexpr double min_link_bits_per_second = 1e3;
inline constexpr double max_link_latency_seconds = 60;

namespace detail {
// CLI11's PositiveNumber prints its whole range (up to 1.8e308) and its Range lets NaN
// through; these refuse NaN and infinities and say the range in words. hi: the largest
// value (FLT_MAX for float options, so 1e39 is refused instead of becoming inf).
inline CLI::Validator number_in(double lo, bool inclusive, double hi = DBL_MAX) {
  return CLI::Validator(
      [lo, inclusive, hi](std::string& s) -> std::string {
        double v = 0;
        try {
          std::size_t used = 0;
          v = std::stod(s, &used);
          if (used != s.size()) return "'" + s + "' is not a number";
        } catch (const std::exception&) {
          return "'" + s + "' is not a number";
        }
        if (!std::isfinite(v)) return "must be a finite number, got " + s;
        if (v > hi) return "must be at most " + CLI::detail::to_string(hi) + ", got " + s;
        if (inclusive ? v >= lo : v > lo) return {};
        return "must be " + std::string(inclusive ? ">= " : "> ") + CLI::detail::to_string(lo) + ", got " + s;
      },
      inclusive ? "NONNEGATIVE" : "POSITIVE");
}
inline const CLI::Validator positive = number_in(0, false);
inline const CLI::Validator non_negative = number_in(0, true);
inline const CLI::Validator positive_float = number_in(0, false, FLT_MAX);
inline const CLI::Validator non_negative_float = number_in(0, true, FLT_MAX);

// --wan-bandwidth and --wan-latency: readable and inside the limits above.
inline void check_link(const std::string& bandwidth, const std::string& latency) {
  double bps = 0, seconds = 0;
  try {
    bps = parse_bits_per_second(bandwidth);
  } catch (const Error& e) {
    throw CLI::ValidationError("--wan-bandwidth: " + std::string(e.what()));
  }
  try {
    seconds = parse_seconds(latency);
  } catch (const Error& e) {
    throw CLI::ValidationError("--wan-latency: " + std::string(e.what()));
  }
  if (bps < min_link_bits_per_second)
    throw CLI::ValidationError("--wan-bandwidth " + bandwidth + " is below 1kbps: one sync would take minutes or hours");
  if (seconds > max_link_latency_seconds)
    throw CLI::ValidationError("--wan-latency " + latency + " is over 60s per hop");
}
}  // namespace detail

// What parse_train_options returns when the program should stop now: exit code 0 and
// the help text (stdout), or 2 and a one-line message (stderr, after "dilocox-train: ").
struct ParseExit {
  int code = 2;
  std::string text;
};

namespace detail {
// The model, the data's shape and the inner optimizer.
inline void define_model_flags(CLI::App& app, TrainOptions& o) {
  app.add_option("--model", o.model, "preset: tiny, small, medium (opt-1.3b, qwen1.5-107b: shapes for planning)")
      ->capture_default_str()->check(CLI::IsMember(gpt_preset_names()));
  app.add_option("--layers", o.layers, "override the preset's number of layers")->check(CLI::Range(1, 4096));
  app.add_option("--embd", o.embd, "override the preset's width")->check(CLI::Range(1, 1 << 16));
  app.add_option("--heads", o.heads, "override the preset's attention heads")->check(CLI::Range(1, 4096));
  app.add_option("--vocab", o.vocab, "model vocabulary (default: the preset's; at least the data's)")
      ->check(CLI::Range(2, 65536));
  app.add_option("--stages", o.stages, "pipeline stages, one MPI rank each (S > 1: run under mpirun -np S)")
      ->capture_default_str()->check(CLI::Range(1, 1024));
  app.add_option("--dp", o.dp,
                 "data-parallel pipelines per cluster: each stage on D ranks that split the batch, average their "
                 "gradients every step and share the stage's outer-loop state (mpirun -np clusters x D x stages)")
      ->capture_default_str()->check(CLI::Range(1, 1024));
  app.add_option("--tokens", o.tokens, "training budget in tokens")->capture_default_str()
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 50));
  app.add_option("--batch", o.batch, "sequences per optimizer step")->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--micro-batches", o.micro_batches, "micro-batches per step (default 1, or 2 x stages)")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--seq-len", o.seq_len, "tokens per sequence (default: the model's context)")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--schedule", o.schedule, "pipeline schedule: 1f1b or gpipe")->capture_default_str()
      ->check(CLI::IsMember({"1f1b", "gpipe"}));
  app.add_option("--device", o.device, "where the model runs: cpu, or cuda (cuBLAS + our kernels, one GPU per rank)")
      ->capture_default_str()->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--precision", o.precision, "CUDA compute type: bf16 or fp32 (master weights and AdamW are fp32)")
      ->capture_default_str()->check(CLI::IsMember({"bf16", "fp32"}));
  app.add_option("--threads", o.threads, "CPU threads per rank for the model's kernels (same results for any count)")
      ->capture_default_str()->check(CLI::Range(1, 1024));
  app.add_option("--gpu", o.gpu, "CUDA device of this rank, modulo the device count (default: the rank's index on its node)")
      ->check(CLI::Range(0, 1023));
  app.add_option("--lr", o.adamw.lr, "peak AdamW learning rate")->capture_default_str()
      ->check(detail::positive_float);
  app.add_option("--warmup", o.adamw.warmup_steps, "linear warmup steps")->capture_default_str()
      ->check(detail::non_negative);
  app.add_option("--weight-decay", o.adamw.weight_decay, "AdamW decoupled weight decay (matrices)")
      ->capture_default_str()->check(detail::non_negative_float);
  app.add_option("--grad-clip", o.adamw.grad_clip, "clip the global gradient norm (0: off)")->capture_default_str()
      ->check(detail::non_negative_float);
  app.add_option("--seed", o.seed, "initialization and data-order seed")->capture_default_str();
}

// Data, metrics, checkpoints, evaluation and the run's timeouts.
inline void define_run_flags(CLI::App& app, TrainOptions& o) {
  app.add_option("--data-dir", o.data_dir, "train.bin and val.bin from scripts/prepare_data.sh")
      ->capture_default_str();
  app.add_option("--metrics", o.metrics, "append one JSON object per step and per evaluation (rank 0)");
  app.add_option("--checkpoint-dir", o.checkpoint_dir, "where checkpoints go (one file per rank)");
  app.add_option("--checkpoint-every", o.checkpoint_every,
                 "steps between checkpoints (0: by --checkpoint-minutes, at the end and on a stop signal)")
      ->capture_default_str()->check(detail::non_negative);
  app.add_option("--checkpoint-minutes", o.checkpoint_minutes,
                 "minutes of wall clock between checkpoints, the most a SIGKILL can cost (0: off)")
      ->capture_default_str()->check(detail::number_in(0, true, 1e6));
  app.add_flag("--resume", o.resume,
               "continue from the newest valid checkpoint in --checkpoint-dir (none there: exit 2)");
  app.add_flag("--resume-if-present", o.resume_if_present,
               "--resume, or start at step 0 when --checkpoint-dir holds no checkpoint (jobs a scheduler restarts)");
  app.add_option("--stop-after", o.stop_after,
                 "end this invocation after N steps, with a checkpoint; --resume continues (job time limits)")
      ->check(detail::positive);
  app.add_option("--eval-every", o.eval_every, "steps between evaluations (0: at the end only)")
      ->capture_default_str()->check(detail::non_negative);
  app.add_option("--eval-sequences", o.eval_sequences, "validation sequences per evaluation")
      ->capture_default_str()->check(CLI::Range(1, 1 << 20));
  app.add_flag("--quiet", o.quiet, "no progress line");
  app.add_option("--collective-timeout", o.collective_timeout,
                 "seconds a rank may go unheard (heartbeats each second) before every rank ends the run naming it")
      ->capture_default_str()->check(detail::number_in(2, true, 86400));
  app.add_option("--progress-timeout", o.progress_timeout,
                 "seconds a rank may stay at one step and activity (a hung filesystem) before every rank ends the run "
                 "naming it; at least 5x the longest activity seen so far (0: off)")
      ->capture_default_str()->check(detail::number_in(0, true, 1e7));
  app.add_option("--max-nonfinite-steps", o.max_nonfinite_steps,
                 "end the run (exit 1) after this many consecutive steps with a NaN/Inf loss on any replica")
      ->capture_default_str()->check(CLI::Range(1, 1000000));
}

// Across clusters; returns the --overlap option (whether it was given decides between
// the flag and the mode's default).
inline CLI::Option* define_cluster_flags(CLI::App& app, TrainOptions& o) {
  auto* g = "Across clusters";
  app.add_option("--clusters", o.clusters, "K replicas joined by the emulated WAN (mpirun -np K x dp x stages)")
      ->capture_default_str()->check(CLI::Range(1, 1024))->group(g);
  std::string modes_help;
  for (const auto& m : sync_modes())
    modes_help += "\n  " + m.name + ": " + m.help + " [defaults: " + m.defaults + "]" +
                  (m.differs.empty() ? "" : " [differs from the published method: " + m.differs + "]");
  app.add_option("--sync", o.sync, "how clusters synchronize (with --clusters > 1):" + modes_help)
      ->capture_default_str()->check(CLI::IsMember(sync_mode_names_vector()))->group(g);
  app.add_option("--bits", o.bits, "diloco: 32, 16, 8 or 4 (default 4); cocktail, dilocox: 4 or 8 (default 4)")
      ->check(CLI::IsMember({2, 4, 8, 16, 32}))->group(g);
  app.add_option("--rank", o.rank, "dilocox: initial low rank r0")->capture_default_str()
      ->check(CLI::Range(1, 1024))->group(g);
  app.add_option("--local-steps", o.local_steps, "H0: inner steps per outer round")->capture_default_str()
      ->check(CLI::Range(1, 1000000))->group(g);
  app.add_option("--max-rank", o.max_rank, "dilocox adaptive: largest rank")->capture_default_str()
      ->check(CLI::Range(1, 4096))->group(g);
  app.add_option("--max-local-steps", o.max_local_steps, "adaptive H: largest H")->capture_default_str()
      ->check(CLI::Range(1, 1000000))->group(g);
  auto* overlap = app.add_flag("--overlap,!--no-overlap", o.overlap,
                               "one-step-delay overlap of each sync with the next round's compute (default: the mode's)")
                      ->group(g);
  app.add_flag("--no-adaptive", o.no_adaptive, "dilocox: fixed rank and H")->group(g);
  app.add_option("--knob", o.knobs,
                 "NAME=VALUE, repeatable: another knob of the --sync mode, e.g. k=32 or error_decay=0.9 "
                 "(sparseloco); an unknown name is refused with the mode's list")
      ->take_all()->group(g);
  app.add_option("--fragments", o.fragments, "streaming: F fragments, synced in turn through each round")
      ->capture_default_str()->check(CLI::Range(1, 4096))->group(g);
  app.add_option("--rebase", o.rebase,
                 "the local model after a sync: keep | overwrite | blend | mix (default: the mode's)")
      ->check(CLI::IsMember({"keep", "overwrite", "blend", "mix"}))->group(g);
  app.add_option("--overlap-steps", o.overlap_steps,
                 "overlap as Streaming DiLoCo: reduce this many steps before each turn (default: the mode's; "
                 "0: the one-step delay)")
      ->check(CLI::Range(0, 1000000))->group(g);
  app.add_option("--momentum-at", o.momentum_at,
                 "outer momentum on each replica's step before compression, or on the reduced mean (default: the mode's)")
      ->check(CLI::IsMember({"replica", "mean"}))->group(g);
  app.add_option("--momentum-storage", o.momentum_storage,
                 "the outer momentum's storage: bf16 halves it (2 bytes a parameter; measured: docs/RESULTS.md)")
      ->capture_default_str()->check(CLI::IsMember({"fp32", "bf16"}))->group(g);
  app.add_option("--outer-lr", o.outer_lr, "outer learning rate (default: the mode's)")
      ->check(detail::positive_float)->group(g);
  app.add_option("--outer-momentum", o.outer_momentum, "outer Nesterov momentum (default: the mode's)")
      ->check(detail::number_in(0, true, 0.999))->group(g);
  app.add_option("--step-seconds", o.step_seconds,
                 "modelled seconds of one inner step: H never drops below what hides a sync on the link (0: no floor)")
      ->capture_default_str()->check(detail::non_negative)->group(g);
  app.add_option("--wan-bandwidth", o.wan_bandwidth, "emulated link between two clusters, shared by all of a cluster's ranks (their bytes queue on it), e.g. 1Gbps, 20Mbps (at least 1kbps)")
      ->capture_default_str()->group(g);
  app.add_option("--wan-latency", o.wan_latency, "emulated latency per hop, e.g. 20ms (at most 60s)")->capture_default_str()
      ->group(g);
  app.add_option("--inject-nan", o.inject_nan, "STEP:REPLICA: that replica's step gets a NaN batch (fault test)")
      ->group(g);
  app.add_option("--dump-pseudo-gradients", o.dump_pseudo_gradients,
                 "folder where replica 0 writes each round's pseudo-gradient (stage files)")->group(g);
  return overlap;
}

// --plan and what only a plan reads.
inline void define_plan_flags(CLI::App& app, TrainOptions& o) {
  auto* p = "Planning";
  app.add_flag("--plan", o.plan, "print the plan of this run (memory, wire bytes, round times, tokens/s); no training")
      ->group(p);
  app.add_option("--params", o.params, "plan a model known only by its parameter count, e.g. 100e9")
      ->check(detail::positive)->group(p);
  app.add_option("--rank-flops", o.rank_flops, "achieved training FLOP/s per rank, e.g. 150e12")
      ->capture_default_str()->check(detail::positive)->group(p);
  app.add_option("--gpu-memory", o.gpu_memory_gb, "GB of memory per rank")->capture_default_str()
      ->check(detail::positive)->group(p);
  app.add_option("--inner-state", o.inner_state,
                 "the inner model state (weights, gradients, AdamW) of a stage's dp ranks: sharded over them (FSDP / "
                 "ZeRO-3, as a 100B trainer does) or whole on each (as dilocox-train holds it)")
      ->capture_default_str()->check(CLI::IsMember({"sharded", "whole"}))->group(p);
}
}  // namespace detail

// One job per site: the flags that place this job in the run.
inline void define_site_flags(CLI::App& app, TrainOptions& o) {
  auto* g = "Sites (one mpirun per site)";
  app.add_option("--site", o.site,
                 "this job is cluster I of --clusters: each site runs its own mpirun (-np dp x stages) with the same "
                 "flags and its own --site; the sites meet at --rendezvous and talk over Gloo (TCP)")
      ->check(CLI::Range(0, 1023))->group(g);
  app.add_option("--rendezvous", o.rendezvous, "with --site: where the sites meet: redis://HOST:PORT or file:///DIR "
                                               "(a folder every site sees)")->group(g);
  app.add_option("--run-id", o.run_id, "with --site: the run's name in the rendezvous store; a new one for each "
                                       "launch (a relaunch too: the store keeps the old addresses)")->group(g);
  app.add_option("--gloo-interface", o.gloo_interface,
                 "with --site: the network interface the ranks listen on for other sites (default: the address "
                 "of this host's name)")->group(g);
  app.add_option("--elastic", o.elastic,
                 "with --site: sites join, leave (SIGTERM) and fail while the others train on; N sites (0 to N - 1) "
                 "start the run, --clusters is the most it holds (site s trains on data shard s). One rank a site, "
                 "syncs without overlap, no --checkpoint-dir (a joining site takes the state from a live one)")
      ->check(CLI::Range(1, 1023))->group(g);
}

// The checks of the site flags among themselves.
inline void check_site_flags(const TrainOptions& o) {
  if (o.site < 0) {
    for (const auto& [given, name] : {std::pair{!o.rendezvous.empty(), "--rendezvous"}, {!o.run_id.empty(), "--run-id"},
                                      {!o.gloo_interface.empty(), "--gloo-interface"}, {o.elastic > 0, "--elastic"}})
      if (given) throw CLI::ValidationError(std::string(name) + " needs --site (one mpirun per site)");
    return;
  }
  if (o.clusters < 2) throw CLI::ValidationError("--site needs --clusters 2 or more (one cluster per site)");
  if (o.site >= o.clusters)
    throw CLI::ValidationError("--site " + std::to_string(o.site) + " needs --clusters > " + std::to_string(o.site) +
                               " (one cluster per site, sites 0 to clusters - 1)");
  if (o.rendezvous.empty()) throw CLI::ValidationError("--site needs --rendezvous (redis://HOST:PORT or file:///DIR)");
  if (o.run_id.empty()) throw CLI::ValidationError("--site needs --run-id (the run's name in the rendezvous store)");
  if (o.elastic > o.clusters)
    throw CLI::ValidationError("--elastic " + std::to_string(o.elastic) + " needs --clusters >= " +
                               std::to_string(o.elastic) + " (the most sites the run holds)");
  if (o.elastic > 0 && (o.stages != 1 || o.dp != 1))
    throw CLI::ValidationError("--elastic needs one rank a site (--stages 1 --dp 1)");
  if (o.elastic > 0 && (!o.checkpoint_dir.empty() || o.resume))
    throw CLI::ValidationError("--elastic does not write checkpoints yet (no --checkpoint-dir, --resume): a site that "
                               "joins takes the state from a live one");
  if (o.elastic > 0 && o.sync == "allreduce")
    throw CLI::ValidationError("--elastic needs an outer-loop --sync (sites change between rounds), not allreduce");
#ifndef DILOCOX_TRAINER_GLOO
  throw CLI::ValidationError("--site needs Gloo: this dilocox-train was built without it "
                             "(scripts/install_deps.sh --sites, then configure again)");
#endif
}

// Defines every flag of dilocox-train on app, bound to o; returns the --overlap option.
inline CLI::Option* define_train_options(CLI::App& app, TrainOptions& o) {
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // a later flag overrides
  detail::define_model_flags(app, o);
  detail::define_run_flags(app, o);
  auto* overlap = detail::define_cluster_flags(app, o);
  define_site_flags(app, o);
  detail::define_plan_flags(app, o);
  return overlap;
}

// The long name of every flag define_train_options defines ("--lr", ...; "--help" too).
inline std::vector<std::string> train_flag_names() {
  TrainOptions o;
  CLI::App app;
  define_train_options(app, o);
  std::vector<std::string> names;
  for (const auto* opt : app.get_options())
    if (!opt->get_lnames().empty()) names.push_back("--" + opt->get_lnames().front());
  return names;
}

// The emulated link of --wan-bandwidth and --wan-latency (checked at parse time).
inline LinkConfig link_of(const TrainOptions& o) {
  return {parse_bits_per_second(o.wan_bandwidth), parse_seconds(o.wan_latency)};
}

// Returns the options, or what to print and the exit code when the program should stop now.
inline std::variant<TrainOptions, ParseExit> parse_train_options(int argc, char** argv) {
  TrainOptions o;
  CLI::App app{"dilocox-train: the dilocox reference GPT trainer (CPU, Eigen; MPI pipeline stages)"};
  CLI::Option* overlap = define_train_options(app, o);
  try {
    app.parse(argc, argv);
    o.overlap_given = overlap->count() > 0;
    if (o.stop_after > 0 && o.checkpoint_dir.empty())
      throw CLI::ValidationError("--stop-after needs --checkpoint-dir");
    if (o.resume_if_present && o.checkpoint_dir.empty())
      throw CLI::ValidationError("--resume-if-present needs --checkpoint-dir");
    if (o.resume && o.checkpoint_dir.empty()) throw CLI::ValidationError("--resume needs --checkpoint-dir");
    o.resume = o.resume || o.resume_if_present;
    if (o.checkpoint_every > 0 && o.checkpoint_dir.empty())
      throw CLI::ValidationError("--checkpoint-every needs --checkpoint-dir");
    detail::check_link(o.wan_bandwidth, o.wan_latency);
    check_site_flags(o);
  } catch (const CLI::Success& e) {
    std::ostringstream out, err;
    app.exit(e, out, err);
    return ParseExit{0, out.str()};
  } catch (const CLI::ParseError& e) {
    return ParseExit{2, e.what()};
  }
  return o;
}

}  // namespace dilocox::trainer
