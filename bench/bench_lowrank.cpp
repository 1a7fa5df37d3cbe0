// BM_PowerIterationStep/m/n/r: one warm-started power-iteration step of the projector
// (P = X Q, orthonormalize P, Q = X^T P), single thread, beside the floor it chases:
// the two Eigen GEMMs it contains, timed alone in the same benchmark (counters
// gemm_ms, gemm_GFLOPs, vs_gemm = step time / GEMM time). reconstruct (X = P Q^T) is
// reported separately as BM_Reconstruct.
#include <benchmark/benchmark.h>
#include <dilocox/lowrank.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>

namespace dx = dilocox;
using RowM = dx::PowerIterationProjector::RowMatrix;

namespace {

RowM make_matrix(Eigen::Index m, Eigen::Index n) {
  RowM x(m, n);
  for (Eigen::Index i = 0; i < x.size(); ++i) x.data()[i] = dx::counter_normal(5, static_cast<std::uint64_t>(i));
  return x;
}

template <class F>
double best_seconds(F&& f, int reps) {
  double best = INFINITY;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

void BM_PowerIterationStep(benchmark::State& state) {
  const auto m = state.range(0), n = state.range(1);
  const int r = static_cast<int>(state.range(2));
  const RowM x = make_matrix(m, n);
  const dx::MatrixView<const float> xv{x.data(), static_cast<std::size_t>(m), static_cast<std::size_t>(n)};
  dx::PowerIterationProjector proj(xv.rows, xv.cols, {.rank = r});

  // The floor: the same two products, as plain Eigen GEMMs into preallocated outputs.
  RowM q = make_matrix(n, r), p(m, r);
  const int reps = m * n >= 4096 * 4096 ? 3 : 10;
  const double gemm_s = best_seconds([&] {
    p.noalias() = x * q;
    q.noalias() = x.transpose() * p;
    benchmark::DoNotOptimize(q.data());
  }, reps);

  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    proj.left(xv);
    proj.orthonormalize_left();
    benchmark::DoNotOptimize(proj.right(xv).data);
    benchmark::ClobberMemory();
  }
  const double step_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
                        static_cast<double>(state.iterations());
  const double flops = 4.0 * static_cast<double>(m) * static_cast<double>(n) * r;
  state.counters["step_ms"] = step_s * 1e3;
  state.counters["gemm_ms"] = gemm_s * 1e3;
  state.counters["gemm_GFLOPs"] = flops / gemm_s / 1e9;
  state.counters["step_GFLOPs"] = flops / step_s / 1e9;
  state.counters["vs_gemm"] = step_s / gemm_s;
}

void BM_Reconstruct(benchmark::State& state) {
  const auto m = state.range(0), n = state.range(1);
  const int r = static_cast<int>(state.range(2));
  const RowM x = make_matrix(m, n);
  const dx::MatrixView<const float> xv{x.data(), static_cast<std::size_t>(m), static_cast<std::size_t>(n)};
  dx::PowerIterationProjector proj(xv.rows, xv.cols, {.rank = r});
  proj.left(xv);
  proj.orthonormalize_left();
  proj.right(xv);
  RowM out(m, n);
  for (auto _ : state) {
    proj.reconstruct({out.data(), xv.rows, xv.cols});
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.counters["GFLOPs"] = benchmark::Counter(2.0 * static_cast<double>(m) * static_cast<double>(n) * r / 1e9,
                                                benchmark::Counter::kIsIterationInvariantRate);
}

void shapes(benchmark::internal::Benchmark* b) {
  for (auto [m, n] : {std::pair{1024, 1024}, {4096, 4096}, {4096, 11008}})
    for (int r : {4, 16, 64}) b->Args({m, n, r});
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

}  // namespace

BENCHMARK(BM_PowerIterationStep)->Apply(shapes);
BENCHMARK(BM_Reconstruct)->Apply(shapes);

BENCHMARK_MAIN();
