// BM_<mode>/<bytes of fp32 data>: single-thread quantizer throughput in GB/s of fp32
// data, beside the floor it chases: a memcpy of the same fp32 buffer, timed in the same
// benchmark in batches interleaved with the quantizer's (counters GBps, memcpy_GBps,
// vs_memcpy: the fastest batch of each, thread CPU time, so that a shared machine's
// other processes weigh on neither). The label names the kernel that ran (avx2 or
// portable; DILOCOX_QUANT_KERNEL=portable forces the reference). Run with
// --benchmark_repetitions=5 --benchmark_report_aggregates_only=true for medians.
#include <benchmark/benchmark.h>
#include <dilocox/quantize.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <span>
#include <vector>

#include <time.h>

namespace dx = dilocox;

namespace {

// The fp32 input of n elements (standard normal), made once per size: repetitions
// and modes reuse it. It starts on a 64-byte boundary, as a training framework's
// tensors do (malloc's 16-byte alignment makes every fourth 32-byte load straddle a
// cache line: ~10% of an in-cache quantize, and the memcpy is timed on the same input).
std::span<const float> input(std::size_t n) {
  static std::map<std::size_t, std::vector<float>> made;
  auto [it, fresh] = made.try_emplace(n);
  std::vector<float>& v = it->second;  // (n + 16) host
  if (fresh) v.resize(n + 16);
  auto* x = reinterpret_cast<float*>((reinterpret_cast<std::uintptr_t>(v.data()) + 63) & ~std::uintptr_t{63});
  if (fresh)
    for (std::size_t i = 0; i < n; ++i) x[i] = dx::counter_normal(7, i);
  return {x, n};
}

// Seconds of CPU time this thread has used.
double thread_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// memcpy's destinations: dst - src at 0, 512 and 2048 bytes past a multiple of 4 KiB,
// used in turn (glibc's memcpy runs up to 25x slower on Zen 3 where dst - src is a
// few bytes past a multiple of 4 KiB: no such offset here, and the best batch counts).
class CopyTargets {
 public:
  CopyTargets(const float* src, std::size_t bytes) : src_(src), bytes_(bytes), buffer_(bytes + 8192) {}
  void copy(std::size_t turn) {
    static constexpr std::size_t offsets[] = {0, 512, 2048};
    const auto gap = static_cast<std::size_t>(reinterpret_cast<std::uintptr_t>(buffer_.data()) -
                                              reinterpret_cast<std::uintptr_t>(src_));
    std::memcpy(buffer_.data() + (offsets[turn % 3] - gap) % 4096, src_, bytes_);
  }

 private:
  const float* src_;
  std::size_t bytes_;
  std::vector<std::byte> buffer_;  // (bytes + 8 KiB) host: room for every offset
};

// Runs `body` in batches (enough calls for 4 MiB of fp32 data, at least one), each
// followed by a batch of memcpys of the input; reports the fastest batch of each as
// GB/s of fp32 data. The benchmark's own time is the quantizer's batches (mean).
template <class F>
void run(benchmark::State& state, std::span<const float> x, std::size_t encoded, F&& body) {
  state.SetLabel(dx::detail::quant_kernel_name(dx::detail::quant_kernel()));
  const std::size_t bytes = x.size() * 4, calls = std::max<std::size_t>(1, (std::size_t{4} << 20) / bytes);
  CopyTargets targets(x.data(), bytes);
  double best_body = INFINITY, best_copy = INFINITY;
  std::size_t turn = 0;
  for (auto _ : state) {
    const double t0 = thread_seconds();
    for (std::size_t k = 0; k < calls; ++k) {
      body();
      benchmark::ClobberMemory();
    }
    const double t1 = thread_seconds();
    for (std::size_t k = 0; k < calls; ++k) {
      targets.copy(turn);
      benchmark::ClobberMemory();
    }
    const double t2 = thread_seconds();
    best_body = std::min(best_body, t1 - t0);
    best_copy = std::min(best_copy, t2 - t1);
    state.SetIterationTime(t1 - t0);
    ++turn;
  }
  const double batch_bytes = static_cast<double>(bytes) * static_cast<double>(calls);
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * calls * bytes));
  state.counters["GBps"] = batch_bytes / best_body / 1e9;
  state.counters["memcpy_GBps"] = batch_bytes / best_copy / 1e9;
  state.counters["vs_memcpy"] = best_copy / best_body;
  state.counters["compression_ratio"] = static_cast<double>(bytes) / static_cast<double>(encoded);
}

template <int Bits, dx::Rounding R = dx::Rounding::nearest>
void BM_Quantize(benchmark::State& state) {
  const std::size_t n = static_cast<std::size_t>(state.range(0)) / 4;
  const dx::QuantConfig c{.bits = Bits, .block = 128, .rounding = R, .seed = 3};
  const auto x = input(n);
  std::vector<std::byte> enc(dx::encoded_size(n, c));  // (encoded_size) host
  run(state, x, enc.size(), [&] {
    dx::quantize(x, enc, c);
    benchmark::DoNotOptimize(enc.data());
  });
}

// Dequantize (out = decoded) or, with Accumulate, dequantize_add (out += decoded).
template <int Bits, bool Accumulate = false>
void BM_Dequantize(benchmark::State& state) {
  const std::size_t n = static_cast<std::size_t>(state.range(0)) / 4;
  const dx::QuantConfig c{.bits = Bits, .block = 128};
  const auto x = input(n);
  std::vector<std::byte> enc(dx::encoded_size(n, c));
  dx::quantize(x, enc, c);
  std::vector<float> out(n, 0.0f);  // (n) host
  run(state, x, enc.size(), [&] {
    Accumulate ? dx::dequantize_add(enc, out, c) : dx::dequantize(enc, out, c);
    benchmark::DoNotOptimize(out.data());
  });
}

// 4 KiB, 64 KiB, 1 MiB (in cache), 16, 64, 256 MiB of fp32 data.
void sizes(benchmark::internal::Benchmark* b) {
  for (std::int64_t bytes = 4 << 10; bytes <= (std::int64_t{256} << 20); bytes *= 16) b->Arg(bytes);
  b->Arg(std::int64_t{64} << 20);
  b->Unit(benchmark::kMicrosecond)->UseManualTime();
}

}  // namespace

BENCHMARK(BM_Quantize<8>)->Name("BM_Int8Quantize")->Apply(sizes);
BENCHMARK(BM_Dequantize<8>)->Name("BM_Int8Dequantize")->Apply(sizes);
BENCHMARK(BM_Quantize<4>)->Name("BM_Int4Quantize")->Apply(sizes);
BENCHMARK(BM_Dequantize<4>)->Name("BM_Int4Dequantize")->Apply(sizes);
BENCHMARK(BM_Quantize<8, dx::Rounding::stochastic>)->Name("BM_StochasticInt8Quantize")->Apply(sizes);
BENCHMARK(BM_Quantize<4, dx::Rounding::stochastic>)->Name("BM_StochasticInt4Quantize")->Apply(sizes);
BENCHMARK(BM_Dequantize<8, true>)->Name("BM_Int8DequantizeAdd")->Apply(sizes);
BENCHMARK(BM_Dequantize<4, true>)->Name("BM_Int4DequantizeAdd")->Apply(sizes);

BENCHMARK_MAIN();
