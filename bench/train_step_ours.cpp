// train_step_ours: the dilocox side of bench/train_vs_torch.py: optimizer steps of the
// reference trainer's CPU model on one rank (CpuStageModel: forward, backward, the global
// gradient norm, clipping to 1.0, AdamW; what StageTrainer does with one stage), batch 16
// x the preset's context, the benchmarks' synthetic tokens, GPT-2 init from seed 1.
//   train_step_ours --model P [--threads N] [--steps K] [--warmup W]   one JSON line: step seconds
//   train_step_ours --model P --dump FILE [--steps K] [--lr LR]       the loss check's weights and losses
#include "model/cpu/gemm.hpp"
#include "model/stage_model.hpp"
#include "synthetic_batch.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <set>
#include <string>
#include <vector>

using namespace dilocox::trainer;

namespace {

struct Args {
  std::string model = "small", dump;
  int threads = 1, steps = 4, warmup = 1;
  float lr = 1e-4f;
};

// One step as StageTrainer::train_step takes it on a single stage; returns (loss, norm).
std::pair<double, double> train_step(CpuStageModel& m, const SyntheticBatch& batch, const AdamWConfig& opt,
                                     float lr, std::int64_t t, std::vector<double>& norms) {
  m.zero_grads();
  const double loss_sum = m.forward(0, batch.tokens.data(), batch.targets.data());
  m.backward(0, 1.0f / static_cast<float>(batch.tokens.size()));
  m.finish_backward();
  std::fill(norms.begin(), norms.end(), 0.0);
  m.grad_square_norms(norms);
  double sq = 0;
  for (double s : norms) sq += s;
  const double norm = std::sqrt(sq);
  m.adamw_step(opt, lr, clip_scale(opt, norm), t);
  return {loss_sum / static_cast<double>(batch.tokens.size()), norm};
}

// The BLAS libraries mapped into this process (what the dynamic linker picked).
std::vector<std::string> loaded_blas() {
  std::ifstream maps("/proc/self/maps");
  std::set<std::string> found;
  for (std::string line; std::getline(maps, line);) {
    const auto slash = line.find('/');
    if (slash == std::string::npos) continue;
    const std::string path = line.substr(slash), base = path.substr(path.rfind('/') + 1);
    if (base.find("blas") != std::string::npos) found.insert(path);
  }
  return {found.begin(), found.end()};
}

void write_dump(const Args& a, CpuStageModel& m, const SyntheticBatch& batch, const GptConfig& cfg, int B) {
  const std::vector<float> init(m.params().begin(), m.params().end());
  std::vector<double> stats, norms(static_cast<std::size_t>(4 + 12 * cfg.n_layer), 0.0);
  AdamWConfig opt;
  for (int s = 0; s < a.steps; ++s) {
    const auto [loss, norm] = train_step(m, batch, opt, a.lr, s + 1, norms);
    stats.push_back(loss);
    stats.push_back(norm);
  }
  std::ofstream f(a.dump, std::ios::binary);
  const std::int32_t head[4] = {B, cfg.max_seq, static_cast<std::int32_t>(init.size()), a.steps};
  f.write("DLXSTEP1", 8);
  f.write(reinterpret_cast<const char*>(head), sizeof head);
  const auto bytes = [&](const auto& v) {
    f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(v[0])));
  };
  bytes(batch.tokens);
  bytes(batch.targets);
  bytes(init);
  bytes(stats);
  if (!f) throw dilocox::Error("train_step_ours: cannot write " + a.dump);
}

// CPU time of the whole process (all its threads), in seconds.
double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

void time_steps(const Args& a, CpuStageModel& m, const SyntheticBatch& batch, const GptConfig& cfg) {
  std::vector<double> seconds, cpu_seconds, norms(static_cast<std::size_t>(4 + 12 * cfg.n_layer), 0.0);
  AdamWConfig opt;
  for (int s = 0; s < a.warmup + a.steps; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = process_cpu_seconds();
    train_step(m, batch, opt, a.lr, s + 1, norms);
    if (s < a.warmup) continue;
    cpu_seconds.push_back(process_cpu_seconds() - c0);
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  const auto list = [](const char* name, const std::vector<double>& v) {
    std::printf("\"%s\": [", name);
    for (std::size_t i = 0; i < v.size(); ++i) std::printf("%s%.6f", i ? ", " : "", v[i]);
    std::printf("], ");
  };
  std::printf("{");
  list("seconds", seconds);
  list("cpu_seconds", cpu_seconds);
  std::printf("\"threads\": %d, \"gemm\": \"%s\", \"blas\": [", a.threads, cpu::gemm_backend());
  const auto blas = loaded_blas();
  for (std::size_t i = 0; i < blas.size(); ++i) std::printf("%s\"%s\"", i ? ", " : "", blas[i].c_str());
  std::printf("]}\n");
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) throw dilocox::Error("train_step_ours: " + k + " needs a value");
    const char* v = argv[++i];
    if (k == "--model") a.model = v;
    else if (k == "--dump") a.dump = v;
    else if (k == "--threads") a.threads = std::atoi(v);
    else if (k == "--steps") a.steps = std::atoi(v);
    else if (k == "--warmup") a.warmup = std::atoi(v);
    else if (k == "--lr") a.lr = std::strtof(v, nullptr);
    else throw dilocox::Error("train_step_ours: unknown option " + k);
  }
  if (a.steps < 1 || a.warmup < 0) throw dilocox::Error("train_step_ours: --steps >= 1, --warmup >= 0");
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args a = parse(argc, argv);
    cpu::set_threads(a.threads);
    const GptConfig cfg = gpt_preset(a.model);
    const int B = 16;
    CpuStageModel model(cfg, 1, 0, B, cfg.max_seq, 1);
    model.init(1);
    const SyntheticBatch batch(static_cast<std::size_t>(B) * cfg.max_seq, cfg.vocab);
    if (!a.dump.empty())
      write_dump(a, model, batch, cfg, B);
    else
      time_steps(a, model, batch, cfg);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
