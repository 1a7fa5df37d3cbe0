// dilocox-train: the reference trainer. One MPI rank per pipeline stage (S = 1 runs
// without mpirun); each rank holds only its stage's weights and AdamW state. Reads the
// token shards of scripts/prepare_data.sh, trains with warmup + cosine AdamW, evaluates,
// writes metrics (JSONL), checkpoints atomically, resumes bit-for-bit, and stops
// cleanly on a stop signal (stop_signals.hpp). Before any work every rank checks its
// inputs and all agree (run_agreement.hpp); a watchdog ends the run when a rank stops
// answering (watchdog.hpp); a run whose loss stays NaN/Inf ends with exit 1. Ends with
// one JSON summary line on stdout.
#include "plan_report.hpp"
#include "run.hpp"
#include "run_agreement.hpp"
#include "run_fingerprint.hpp"
#include "stop_signals.hpp"

#include <mpi.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <variant>

using namespace dilocox::trainer;
using json = nlohmann::json;

namespace {

// --plan: arithmetic only, on rank 0; no data, no training.
int run_plan(const TrainOptions& o) {
  PlanInput in;
  in.model = resolve_model(o);
  in.params_override = static_cast<std::int64_t>(o.params);
  in.clusters = o.clusters;
  in.stages = o.stages;
  in.dp = o.dp;
  in.inner_sharded = o.inner_state == "sharded";
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

// ---------------------------------------------------------------------------------
// main: parse, watchdog, world, agree, run
// ---------------------------------------------------------------------------------

#ifdef DILOCOX_TRAINER_GLOO
// An elastic site's place in the run (--elastic): what a joining site must match is every
// flag the sites agree on and the data's checksums.
dilocox::ElasticOptions elastic_options(const TrainOptions& o) {
  dilocox::ElasticOptions e{.gloo = site_gloo(o), .site = o.site, .founders = o.elastic};
  std::string fingerprint;
  const json flags = flag_values(o, /*outcome_only=*/false);
  for (const auto& item : flags.items())
    fingerprint += item.key() + "=" + (item.value().is_string() ? item.value().get<std::string>() : item.value().dump()) + ";";
  for (const char* f : {"train.bin", "val.bin"}) {
    std::ifstream in(std::filesystem::path(o.data_dir) / f, std::ios::binary);
    const bool found = in.is_open();
    const std::vector<char> bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    char sum[40];
    std::snprintf(sum, sizeof sum, "%016llx",
                  static_cast<unsigned long long>(dilocox::checksum64(std::as_bytes(std::span<const char>(bytes)))));
    fingerprint += std::string("data ") + f + "=" + (found ? sum : "missing") + ";";
  }
  e.fingerprint = fingerprint;
  e.join_timeout = std::chrono::milliseconds(static_cast<std::int64_t>(o.progress_timeout * 1000));
  return e;
}
#endif

// The run's world: this job, or with --site the sites' jobs joined over Gloo; none after
// job rank 0 printed why the sites could not meet (every rank of the job learns it).
std::optional<World> make_world(const TrainOptions* o, int rank) {
#ifdef DILOCOX_TRAINER_GLOO
  if (o && o->site >= 0 && !o->plan) {
    try {
      if (o->elastic > 0) return std::optional<World>(std::in_place, MPI_COMM_WORLD, o->clusters, elastic_options(*o));
      return std::optional<World>(std::in_place, MPI_COMM_WORLD, o->site, o->clusters, site_gloo(*o));
    } catch (const dilocox::Error& e) {
      if (rank == 0) std::fprintf(stderr, "dilocox-train: site %d: %s\n", o->site, e.what());
      return std::nullopt;
    }
  }
#endif
  (void)o, (void)rank;
  return std::optional<World>(std::in_place, MPI_COMM_WORLD);
}

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

#ifdef DILOCOX_TRAINER_GLOO
// An elastic site admitted into a running group: its own inputs checked (the members
// compared its flags and data at admission), the run's state received, then trained on.
int run_joined(const TrainOptions& o, World& world) {
  Run run(o, world, nullptr);
  const json report = run.check_inputs();
  if (report.value("code", 0) != 0) {
    std::fprintf(stderr, "dilocox-train: site %d: %s\n", o.site, report.value("message", std::string()).c_str());
    return report.value("code", 1);
  }
  try {
    run.join_running();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dilocox-train: site %d: %s\n", o.site, e.what());
    return 1;
  }
  return run_agreed(o, run, run.step(), world.rank(), world.size());
}
#endif

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
                     o ? layout_of(*o) : RankLayout{.stages = 0}, o && o->site > 0 ? o->site * size : 0);
  if (watchdog) watchdog->at(Activity::agreeing, 0);
  std::optional<World> world = make_world(o, rank);
  if (!world) {
    if (watchdog) watchdog->stop();
    MPI_Finalize();
    return 1;
  }
#ifdef DILOCOX_TRAINER_GLOO
  if (world->elastic() && world->elastic()->newcomer()) {
    const int rc = run_joined(*o, *world);
    world.reset();
    MPI_Finalize();
    return rc;
  }
#endif
  std::optional<Run> run;
  json report;
  if (const auto missing = unclassified_flags(); !missing.empty()) {
    report = {{"parsed", false}, {"code", 1},
              {"message", "internal: flag " + missing.front() + " has no row in reference_trainer/run_fingerprint.hpp"}};
  } else if (o) {
    run.emplace(*o, *world, watchdog ? &*watchdog : nullptr);
    report = run->check_inputs();
  } else {
    report = unparsed_report(std::get<ParseExit>(parsed));
  }
  report["signal"] = pending_stop_signal();
  const auto reports = gather_reports(*world, report);
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
    rc = run_agreed(*o, *run, 0, world->rank(), world->size());
  } else {
    const auto start = start_step(*run, reports, rank);
    rc = std::holds_alternative<int>(start) ? std::get<int>(start)
                                            : run_agreed(*o, *run, std::get<std::int64_t>(start), world->rank(),
                                                         world->size());
  }
  run.reset();
  world.reset();
  if (watchdog) watchdog->stop();
  MPI_Finalize();
  return rc;
}
