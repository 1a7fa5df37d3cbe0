// BM_TrainStep/<preset>: one optimizer step of the reference GPT on one rank (forward,
// backward, AdamW), single thread, batch 16 x the preset's context. Beside it, the
// floor it chases: the single-thread SGEMM rate of the product the model runs on (BLAS,
// or Eigen without one: cpu::gemm), measured in the same run on the model's largest
// GEMM (the MLP, (B*T, C) x (C, 4C)) and on a 1024^3 product. Counters: tokens_per_s
// and model_GFLOPs (wall clock; 6 N + attention per token, GptConfig::flops_per_token),
// tokens_per_cpu_s and model_GFLOPs_cpu (by CPU time), gemm_GFLOPs (the larger of the
// two, by CPU time), vs_gemm = model_GFLOPs_cpu / gemm_GFLOPs. Goal (issue 4): vs_gemm
// >= 0.4 for small. The side by side with PyTorch is train_vs_torch.py.
#include "model/adamw.hpp"
#include "model/gpt_stage.hpp"
#include "synthetic_batch.hpp"

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <vector>

using namespace dilocox::trainer;

namespace {

// CPU time of this process: on a machine shared with other work, the floor and the step
// are both rated by the time they ran, so their ratio does not depend on the load.
double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}
double cpu_seconds_of(const auto& f) {
  const double t0 = cpu_seconds();
  f();
  return cpu_seconds() - t0;
}

// Best-of-5 single-thread SGEMM rate of cpu::gemm, (m, k) x (k, n), in GFLOP/s of CPU time.
double gemm_gflops(int m, int k, int n) {
  std::vector<float> a(static_cast<std::size_t>(m) * k), b(static_cast<std::size_t>(k) * n), c(static_cast<std::size_t>(m) * n);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(dilocox::counter_normal(1, i));
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(dilocox::counter_normal(2, i));
  const auto product = [&] {
    cpu::gemm(cpu::Op::none, cpu::Op::none, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f, c.data(), n);
  };
  product();
  double best = INFINITY;
  for (int r = 0; r < 5; ++r) best = std::min(best, cpu_seconds_of(product));
  benchmark::DoNotOptimize(c.data());
  return 2.0 * m * k * n / best / 1e9;
}

void BM_TrainStep(benchmark::State& state, const std::string& preset) {
  const GptConfig cfg = gpt_preset(preset);
  const int B = 16, T = cfg.max_seq;
  GptStage<float> model(cfg, 1, 0, B, T, 1);
  model.init(1);
  AdamW adam(model.params().size());
  AdamWConfig opt;
  const SyntheticBatch batch(static_cast<std::size_t>(B) * T, cfg.vocab);
  const auto& tokens = batch.tokens;
  const auto& targets = batch.targets;
  std::int64_t t = 0;
  auto step = [&] {
    model.zero_grads();
    benchmark::DoNotOptimize(model.forward(0, tokens.data(), targets.data()));
    model.backward(0, 1.0f / static_cast<float>(tokens.size()));
    model.finish_backward();
    adam.step(model.params(), model.grads(), model.tensors(), opt, 1e-4f, 1.0f, ++t);
  };
  step();
  const double t0 = cpu_seconds();
  for (auto _ : state) step();
  const double loop_cpu_s = cpu_seconds() - t0;
  const double gemm = std::max(gemm_gflops(B * T, cfg.n_embd, 4 * cfg.n_embd), gemm_gflops(1024, 1024, 1024));
  const double tokens_per_step = static_cast<double>(B) * T;
  state.counters["tokens_per_s"] = benchmark::Counter(tokens_per_step, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["model_GFLOPs"] = benchmark::Counter(tokens_per_step * cfg.flops_per_token(T) / 1e9,
                                                      benchmark::Counter::kIsIterationInvariantRate);
  state.counters["gemm_GFLOPs"] = gemm;
  const double steps = static_cast<double>(state.iterations());
  const double achieved = steps * tokens_per_step * cfg.flops_per_token(T) / loop_cpu_s / 1e9;
  state.counters["tokens_per_cpu_s"] = steps * tokens_per_step / loop_cpu_s;
  state.counters["model_GFLOPs_cpu"] = achieved;
  state.counters["vs_gemm"] = achieved / gemm;
  state.counters["MFLOP_per_token"] = cfg.flops_per_token(T) / 1e6;
  state.SetLabel(preset + ", " + std::to_string(cfg.params()) + " params, batch 16 x " + std::to_string(T) +
                ", gemm on " + cpu::gemm_backend());
}

}  // namespace

BENCHMARK_CAPTURE(BM_TrainStep, tiny, std::string("tiny"))->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_TrainStep, small, std::string("small"))->Unit(benchmark::kMillisecond)->UseRealTime()
    ->MinTime(5.0);
BENCHMARK_CAPTURE(BM_TrainStep, medium, std::string("medium"))->Unit(benchmark::kMillisecond)->UseRealTime()
    ->Iterations(3);

BENCHMARK_MAIN();
