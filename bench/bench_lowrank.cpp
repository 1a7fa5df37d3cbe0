// BM_PowerIterationStep/m/n/r: PowerIterationProjector::step (one warm-started step,
// one sweep over X), one thread, beside its floors measured in the same run: read_ms
// (X streamed once) and gemm_ms (4 m n r flops at Eigen's compute-bound SGEMM rate on
// X); the two-phase path interleaved; both errors against the SVD optimum.
// BM_Reconstruct/m/n/r: X_hat = P Q^T against writing X and its flops. Times: medians
// of N calls (N from the flops, never from a time) in thread CPU time.
#include <benchmark/benchmark.h>
#include <dilocox/lowrank.hpp>

#include <algorithm>
#include <ctime>
#include <cmath>
#include <memory>
#include <vector>

namespace dx = dilocox;
using RowM = dx::PowerIterationProjector::RowMatrix;

namespace {

constexpr int gemm_rate_cols = 64;   // Eigen's SGEMM is compute-bound from here (RESULTS)
constexpr int error_steps = 8;       // warm-started steps before the error is measured
constexpr double spectrum_decay = 1.0;  // sigma_i = i^-decay

// X = H_U diag(sigma) H_V^T, sigma_i = i^-decay, H_* products of 4 random Householder
// reflections: full rank with known singular values, built in O(m n).
struct TestMatrix {
  RowM x;                          // (m, n) row-major
  std::vector<double> sigma;       // (min(m, n)) descending

  TestMatrix(Eigen::Index m, Eigen::Index n) : x(RowM::Zero(m, n)), sigma(std::min(m, n)) {
    for (Eigen::Index i = 0; i < std::min(m, n); ++i) {
      sigma[i] = std::pow(static_cast<double>(i + 1), -spectrum_decay);
      x(i, i) = static_cast<float>(sigma[i]);
    }
    std::uint64_t draw = 0;
    for (int h = 0; h < 4; ++h) {
      Eigen::VectorXf u(m), v(n);
      for (Eigen::Index i = 0; i < m; ++i) u[i] = dx::counter_normal(7, draw++);
      for (Eigen::Index i = 0; i < n; ++i) v[i] = dx::counter_normal(7, draw++);
      u.normalize();
      v.normalize();
      const Eigen::RowVectorXf ux = u.transpose() * x;  // X <- (I - 2 u u^T) X
      x.noalias() -= 2.0f * u * ux;
      const Eigen::VectorXf xv = x * v;                   // X <- X (I - 2 v v^T)
      x.noalias() -= 2.0f * xv * v.transpose();
    }
  }
  // ||X - X_r||_F of the best rank-r approximation.
  double optimal_error(int r) const {
    double s = 0.0;
    for (std::size_t i = static_cast<std::size_t>(r); i < sigma.size(); ++i) s += sigma[i] * sigma[i];
    return std::sqrt(s);
  }
};

// One matrix per shape, kept while the benchmarks of that shape run.
const TestMatrix& test_matrix(Eigen::Index m, Eigen::Index n) {
  static std::unique_ptr<TestMatrix> cached;
  if (!cached || cached->x.rows() != m || cached->x.cols() != n) {
    cached.reset();
    cached = std::make_unique<TestMatrix>(m, n);
  }
  return *cached;
}

// This thread's CPU time: the machine is shared, and wall-clock time would count the
// slices other jobs take (the floors are timed the same way, interleaved).
double thread_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Median seconds of f() over `reps` calls.
template <class F>
double median_seconds(F&& f, int reps) {
  std::vector<double> t(static_cast<std::size_t>(reps));
  for (auto& s : t) {
    const double t0 = thread_seconds();
    f();
    s = thread_seconds() - t0;
  }
  std::nth_element(t.begin(), t.begin() + reps / 2, t.end());
  return t[static_cast<std::size_t>(reps / 2)];
}

dx::MatrixView<const float> view(const RowM& x) {
  return {x.data(), static_cast<std::size_t>(x.rows()), static_cast<std::size_t>(x.cols())};
}
dx::MatrixView<float> view(RowM& x) {
  return {x.data(), static_cast<std::size_t>(x.rows()), static_cast<std::size_t>(x.cols())};
}

void two_phase_step(dx::PowerIterationProjector& proj, dx::MatrixView<const float> x) {
  proj.left(x);
  proj.orthonormalize_left();
  proj.right(x);
}

// Relative errors ||X - X_hat||_F / optimum of the one-sweep and two-sweep paths after
// error_steps steps from the same seed.
std::pair<double, double> errors_vs_optimum(const TestMatrix& t, int r) {
  const auto m = t.x.rows(), n = t.x.cols();
  dx::PowerIterationProjector one(m, n, {.rank = r}), two(m, n, {.rank = r});
  RowM out(m, n);
  for (int s = 0; s < error_steps; ++s) one.step(view(t.x)), two_phase_step(two, view(t.x));
  const double opt = t.optimal_error(r);
  one.reconstruct(view(out));
  const double e_one = (t.x - out).cast<double>().norm() / opt;
  two.reconstruct(view(out));
  const double e_two = (t.x - out).cast<double>().norm() / opt;
  return {e_one, e_two};
}

// Calls per measurement, from the work (flops), never from a measured time.
int calls_for(Eigen::Index m, Eigen::Index n, int r) {
  const double gflop = 4.0 * static_cast<double>(m) * static_cast<double>(n) * r / 1e9;
  return std::clamp(static_cast<int>(4.0 / gflop), 7, 101) | 1;
}

// X streamed once: the median over `reps` reads.
double read_seconds(const RowM& x, int reps) {
  volatile float sink = 0.0f;
  return median_seconds([&] { sink = x.sum(); }, reps);
}

// Eigen's SGEMM on X at a compute-bound width: the first `rows` rows of X times an
// (n, gemm_rate_cols) matrix. rate() times one product: flop/s.
struct SgemmRate {
  Eigen::Map<const RowM> x;
  RowM q, p;
  SgemmRate(const RowM& full, Eigen::Index rows)
      : x(full.data(), rows, full.cols()),
        q(RowM::Ones(full.cols(), gemm_rate_cols) / static_cast<float>(full.cols())),
        p(rows, gemm_rate_cols) {}
  // Rows whose product has about the flops of a rank-r step on all of X.
  static Eigen::Index rows_for(Eigen::Index m, int r) {
    return std::clamp<Eigen::Index>(m * r * 2 / gemm_rate_cols, std::min<Eigen::Index>(m, 64), m);
  }
  double rate() {
    const double s = median_seconds([&] {
      p.noalias() = x * q;
      benchmark::DoNotOptimize(p.data());
    }, 1);
    return 2.0 * static_cast<double>(x.size()) * gemm_rate_cols / s;
  }
};

void BM_PowerIterationStep(benchmark::State& state) {
  const auto m = state.range(0), n = state.range(1);
  const int r = static_cast<int>(state.range(2));
  const TestMatrix& t = test_matrix(m, n);
  const auto [e_one, e_two] = errors_vs_optimum(t, r);
  const int calls = calls_for(m, n, r);
  SgemmRate sgemm(t.x, SgemmRate::rows_for(m, r));

  dx::PowerIterationProjector one(m, n, {.rank = r}), two(m, n, {.rank = r});
  for (int s = 0; s < 2; ++s) one.step(view(t.x)), two_phase_step(two, view(t.x));  // warm
  double step_s = 0, two_s = 0, read_s = 0, gemm_rate = 0;
  const auto sweeps_before = one.second_sweeps();
  for (auto _ : state) {  // all four interleaved, so that load on the machine hits them alike
    std::vector<double> a, b, c, d;
    for (int i = 0; i < calls; ++i) {
      a.push_back(median_seconds([&] { one.step(view(t.x)); }, 1));
      b.push_back(median_seconds([&] { two_phase_step(two, view(t.x)); }, 1));
      c.push_back(read_seconds(t.x, 1));
      d.push_back(sgemm.rate());
    }
    for (auto* v : {&a, &b, &c, &d}) std::nth_element(v->begin(), v->begin() + calls / 2, v->end());
    step_s = a[calls / 2], two_s = b[calls / 2], read_s = c[calls / 2], gemm_rate = d[calls / 2];
    state.SetIterationTime(step_s);
  }
  const double flops = 4.0 * static_cast<double>(m) * static_cast<double>(n) * r;
  const double gemm_s = flops / gemm_rate, floor_s = std::max(read_s, gemm_s);
  state.counters["step_ms"] = step_s * 1e3;
  state.counters["read_ms"] = read_s * 1e3;
  state.counters["gemm_ms"] = gemm_s * 1e3;
  state.counters["vs_read"] = step_s / read_s;
  state.counters["vs_floor"] = step_s / floor_s;
  state.counters["step_GFLOPs"] = flops / step_s / 1e9;
  state.counters["sgemm_GFLOPs"] = gemm_rate / 1e9;
  state.counters["two_sweep_ms"] = two_s * 1e3;
  state.counters["second_sweeps"] =
      static_cast<double>(one.second_sweeps() - sweeps_before) / (calls * static_cast<double>(state.iterations()));
  state.counters["err_vs_opt"] = e_one;
  state.counters["two_err_vs_opt"] = e_two;
  if (std::abs(e_one - e_two) > 1e-4 * e_two)  // the one-sweep step must keep the iteration's error
    state.SkipWithError("step() error differs from the two-sweep path's");
}

void BM_Reconstruct(benchmark::State& state) {
  const auto m = state.range(0), n = state.range(1);
  const int r = static_cast<int>(state.range(2));
  const TestMatrix& t = test_matrix(m, n);
  dx::PowerIterationProjector proj(m, n, {.rank = r});
  proj.step(view(t.x));
  RowM out(m, n);
  const int calls = calls_for(m, n, r);
  SgemmRate sgemm(t.x, SgemmRate::rows_for(m, r / 2));
  double s = 0, write_s = 0, gemm_rate = 0;
  for (auto _ : state) {
    std::vector<double> a, b, d;
    for (int i = 0; i < calls; ++i) {
      a.push_back(median_seconds([&] { proj.reconstruct(view(out)); }, 1));
      b.push_back(median_seconds([&] { out.setZero(); }, 1));
      benchmark::DoNotOptimize(out.data());
      d.push_back(sgemm.rate());
    }
    for (auto* v : {&a, &b, &d}) std::nth_element(v->begin(), v->begin() + calls / 2, v->end());
    s = a[calls / 2], write_s = b[calls / 2], gemm_rate = d[calls / 2];
    state.SetIterationTime(s);
  }
  const double gemm_s = 2.0 * static_cast<double>(m) * static_cast<double>(n) * r / gemm_rate;
  state.counters["ms"] = s * 1e3;
  state.counters["write_ms"] = write_s * 1e3;
  state.counters["gemm_ms"] = gemm_s * 1e3;
  state.counters["vs_floor"] = s / std::max(write_s, gemm_s);
}

template <int... Ranks>
void shapes(benchmark::internal::Benchmark* b) {
  for (auto [m, n] : {std::pair{1024, 1024}, {2048, 2048}, {4096, 4096}, {1024, 4096}, {4096, 11008}})
    for (int r : {Ranks...}) b->Args({m, n, r});
  b->Unit(benchmark::kMillisecond)->Iterations(1)->UseManualTime();
}

}  // namespace

BENCHMARK(BM_PowerIterationStep)->Apply(shapes<4, 8, 16, 32, 64>);
BENCHMARK(BM_Reconstruct)->Apply(shapes<4, 16, 64>);

BENCHMARK_MAIN();
