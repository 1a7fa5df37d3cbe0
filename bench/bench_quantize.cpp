// BM_Int{8,4}{Quantize,Dequantize}/<bytes of fp32 input>: single-thread quantizer
// throughput in GB/s of fp32 data, each beside the floor it chases: a memcpy of the
// same fp32 buffer timed in the same benchmark (counters memcpy_GBps, vs_memcpy).
// Run with --benchmark_repetitions=5 --benchmark_report_aggregates_only=true for medians.
#include <benchmark/benchmark.h>
#include <dilocox/quantize.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <vector>

namespace dx = dilocox;

namespace {

std::vector<float> make_input(std::size_t n) {
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = dx::counter_normal(7, i);
  return x;
}

// GB/s of a memcpy of `bytes` from src to dst: the best of a few copies, so a single
// slow copy from the noisy machine does not set the floor too low.
double memcpy_rate(const void* src, void* dst, std::size_t bytes) {
  double best = INFINITY;
  const int reps = bytes >= (std::size_t{64} << 20) ? 3 : 20;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(dst, src, bytes);
    benchmark::ClobberMemory();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return static_cast<double>(bytes) / best / 1e9;
}

// Runs `body` in the benchmark loop and reports GB/s of fp32 input beside memcpy's.
template <class F>
void run(benchmark::State& state, std::size_t n, double memcpy_gbps, std::size_t encoded, F&& body) {
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    body();
    benchmark::ClobberMemory();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double bytes = static_cast<double>(n) * 4;
  const double gbps = bytes * static_cast<double>(state.iterations()) / seconds / 1e9;
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(bytes));
  state.counters["GBps"] = gbps;
  state.counters["memcpy_GBps"] = memcpy_gbps;
  state.counters["vs_memcpy"] = gbps / memcpy_gbps;
  state.counters["compression_ratio"] = bytes / static_cast<double>(encoded);
}

template <int Bits, dx::Rounding R = dx::Rounding::nearest>
void BM_Quantize(benchmark::State& state) {
  const std::size_t n = static_cast<std::size_t>(state.range(0)) / 4;
  const dx::QuantConfig c{.bits = Bits, .block = 128, .rounding = R, .seed = 3};
  const auto x = make_input(n);
  std::vector<std::byte> enc(dx::encoded_size(n, c));
  std::vector<float> copy(n);
  const double floor = memcpy_rate(x.data(), copy.data(), n * 4);
  run(state, n, floor, enc.size(), [&] {
    dx::quantize(x, enc, c);
    benchmark::DoNotOptimize(enc.data());
  });
}

template <int Bits>
void BM_Dequantize(benchmark::State& state) {
  const std::size_t n = static_cast<std::size_t>(state.range(0)) / 4;
  const dx::QuantConfig c{.bits = Bits, .block = 128};
  const auto x = make_input(n);
  std::vector<std::byte> enc(dx::encoded_size(n, c));
  dx::quantize(x, enc, c);
  std::vector<float> out(n);
  const double floor = memcpy_rate(x.data(), out.data(), n * 4);
  run(state, n, floor, enc.size(), [&] {
    dx::dequantize(enc, out, c);
    benchmark::DoNotOptimize(out.data());
  });
}

void sizes(benchmark::internal::Benchmark* b) {
  for (std::int64_t bytes = 4 << 10; bytes <= (std::int64_t{256} << 20); bytes *= 16) b->Arg(bytes);
  b->Arg(std::int64_t{64} << 20);
  b->Unit(benchmark::kMicrosecond)->UseRealTime();
}

}  // namespace

BENCHMARK(BM_Quantize<8>)->Name("BM_Int8Quantize")->Apply(sizes);
BENCHMARK(BM_Dequantize<8>)->Name("BM_Int8Dequantize")->Apply(sizes);
BENCHMARK(BM_Quantize<4>)->Name("BM_Int4Quantize")->Apply(sizes);
BENCHMARK(BM_Dequantize<4>)->Name("BM_Int4Dequantize")->Apply(sizes);
BENCHMARK(BM_Quantize<4, dx::Rounding::stochastic>)->Name("BM_StochasticInt4Quantize")->Apply(sizes);

BENCHMARK_MAIN();
