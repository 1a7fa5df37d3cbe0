// bench_cuda: the CUDA path on one GPU, timed with CUDA events (median of repeats after
// warm-up), each figure beside the floor it chases, like nccl-tests:
//   copy       device-to-device cudaMemcpy: the memory bandwidth floor (bytes read + written)
//   quantize   int4 / int8 encode and decode of 256 MiB of floats: GB/s of bytes read +
//              written, and that as a fraction of the copy bandwidth (goal >= 0.7)
//   projector  PowerSGD step (P = X Q, QR, Q = X^T P, P Q^T) against the same three cuBLAS
//              GEMMs alone (goal <= 1.3x)
//   train      one optimizer step of the GPT (forward, backward, norms, AdamW) in bf16:
//              tokens/s and MFU against the bf16 peak (--peak-tflops, default by device
//              name), and the cuBLAS bf16 GEMM rate measured here
// Prints a table, and one JSON object per line prefixed "RESULT " for scripts.
#include <dilocox/cuda/blas.hpp>
#include <dilocox/cuda/lowrank.cuh>
#include <dilocox/cuda/quantize.cuh>

#include "model/stage_model.hpp"
#include "synthetic_batch.hpp"

#include <cuda_bf16.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace dx = dilocox;
using dx::cuda::DeviceBuffer;

namespace {

// Median milliseconds of `reps` timed calls of f (after `warm` untimed ones) on `s`.
double median_ms(const std::function<void()>& f, cudaStream_t s, int reps = 20, int warm = 3) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int i = 0; i < warm; ++i) f();
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    cudaEventRecord(a, s);
    f();
    cudaEventRecord(b, s);
    dx::cuda::check(cudaEventSynchronize(b), "bench_cuda", "event");
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
  return t[t.size() / 2];
}

void result(const std::string& json) { std::printf("RESULT %s\n", json.c_str()); }

__global__ void fill(float* x, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    x[i] = dx::counter_normal(9, i);
}

double copy_bandwidth(cudaStream_t s) {
  const std::size_t bytes = std::size_t{1} << 30;
  DeviceBuffer<std::byte> a(bytes), b(bytes);
  a.zero(s);
  const double ms = median_ms([&] { cudaMemcpyAsync(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice, s); }, s);
  const double gbs = 2.0 * bytes / ms / 1e6;
  std::printf("%-34s %10.3f ms %10.1f GB/s (read + written)\n", "copy 1 GiB device-to-device", ms, gbs);
  result("{\"bench\":\"copy\",\"bytes\":" + std::to_string(bytes) + ",\"ms\":" + std::to_string(ms) +
         ",\"GBps\":" + std::to_string(gbs) + "}");
  return gbs;
}

void quantizers(cudaStream_t s, double copy_gbs) {
  const std::size_t n = std::size_t{64} << 20;  // 64 Mi floats = 256 MiB
  DeviceBuffer<float> x(n), y(n);
  fill<<<4096, 256, 0, s>>>(x.data(), n);
  dx::cuda::FaultFlag fault;
  for (int bits : {4, 8})
    for (auto rounding : {dx::Rounding::nearest, dx::Rounding::stochastic}) {
      const dx::QuantConfig c{.bits = bits, .block = 128, .rounding = rounding};
      const std::size_t enc = dx::encoded_size(n, c);
      DeviceBuffer<std::byte> code(enc);
      const double q_ms = median_ms([&] { dx::quantize(x.view(), code.view(), c, s, &fault); }, s);
      const double d_ms = median_ms([&] { dx::dequantize(code.view(), y.view(), c, s); }, s);
      const double traffic = static_cast<double>(n) * 4 + static_cast<double>(enc);
      const std::string name = "int" + std::to_string(bits) + (rounding == dx::Rounding::nearest ? " nearest" : " stochastic");
      for (int dir = 0; dir < 2; ++dir) {
        const double ms = dir == 0 ? q_ms : d_ms, gbs = traffic / ms / 1e6;
        std::printf("%-34s %10.3f ms %10.1f GB/s = %5.1f%% of copy  (%.1f GB/s of fp32 input)\n",
                    ((dir == 0 ? "quantize " : "dequantize ") + name).c_str(), ms, gbs, 100 * gbs / copy_gbs,
                    static_cast<double>(n) * 4 / ms / 1e6);
        result("{\"bench\":\"" + std::string(dir == 0 ? "quantize" : "dequantize") + "\",\"bits\":" +
               std::to_string(bits) + ",\"stochastic\":" + (rounding == dx::Rounding::stochastic ? "true" : "false") +
               ",\"ms\":" + std::to_string(ms) + ",\"GBps\":" + std::to_string(gbs) +
               ",\"vs_copy\":" + std::to_string(gbs / copy_gbs) + "}");
        if (rounding == dx::Rounding::stochastic) break;  // decoding does not depend on rounding
      }
    }
  fault.fetch(s);
  cudaStreamSynchronize(s);
  fault.throw_if_raised("bench_cuda quantize");
}

void projectors(cudaStream_t s) {
  struct Case { int m, n, r; };
  for (const Case k : {Case{4096, 4096, 8}, Case{4096, 4096, 32}, Case{8192, 8192, 16}, Case{16384, 4096, 16}}) {
    const std::size_t mn = static_cast<std::size_t>(k.m) * k.n;
    DeviceBuffer<float> x(mn), out(mn), p(static_cast<std::size_t>(k.m) * k.r), q(static_cast<std::size_t>(k.n) * k.r);
    fill<<<4096, 256, 0, s>>>(x.data(), mn);
    fill<<<256, 256, 0, s>>>(q.data(), q.size());
    dx::cuda::PowerIterationProjector proj(k.m, k.n, {.rank = k.r}, s);
    const dx::MatrixView<const float, dx::cuda_space> xv{x.data(), static_cast<std::size_t>(k.m), static_cast<std::size_t>(k.n)};
    const dx::MatrixView<float, dx::cuda_space> ov{out.data(), static_cast<std::size_t>(k.m), static_cast<std::size_t>(k.n)};
    const double proj_ms = median_ms([&] { proj.approximate(xv, ov); }, s);
    dx::cuda::BlasHandle h(s);
    const double gemm_ms = median_ms(
        [&] {
          dx::cuda::gemm_rm(h.get(), false, false, k.m, k.r, k.n, 1, x.data(), k.n, q.data(), k.r, 0, p.data(), k.r, {}, "bench");
          dx::cuda::gemm_rm(h.get(), true, false, k.n, k.r, k.m, 1, x.data(), k.n, p.data(), k.r, 0, q.data(), k.r, {}, "bench");
          dx::cuda::gemm_rm(h.get(), false, true, k.m, k.n, k.r, 1, p.data(), k.r, q.data(), k.r, 0, out.data(), k.n, {}, "bench");
        },
        s);
    const double gflop = 3.0 * 2.0 * mn * k.r / 1e9;
    char name[64];
    std::snprintf(name, sizeof name, "projector %dx%d r%d", k.m, k.n, k.r);
    std::printf("%-34s %10.3f ms  GEMMs alone %.3f ms  ratio %.2fx  (GEMMs %.1f TFLOP/s fp32)\n", name, proj_ms, gemm_ms,
                proj_ms / gemm_ms, gflop / gemm_ms / 1e3);
    result("{\"bench\":\"projector\",\"m\":" + std::to_string(k.m) + ",\"n\":" + std::to_string(k.n) + ",\"r\":" +
           std::to_string(k.r) + ",\"ms\":" + std::to_string(proj_ms) + ",\"gemm_ms\":" + std::to_string(gemm_ms) +
           ",\"ratio\":" + std::to_string(proj_ms / gemm_ms) + "}");
  }
}

double bf16_gemm_tflops(cudaStream_t s) {
  const int m = 8192;
  DeviceBuffer<__nv_bfloat16> a(static_cast<std::size_t>(m) * m), b(a.size()), c(a.size());
  a.zero(s);
  b.zero(s);
  dx::cuda::BlasHandle h(s);
  const dx::cuda::GemmTypes t{CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, CUBLAS_COMPUTE_32F};
  const double ms = median_ms(
      [&] { dx::cuda::gemm_rm(h.get(), false, true, m, m, m, 1, a.data(), m, b.data(), m, 0, c.data(), m, t, "bench"); }, s, 10);
  return 2.0 * m * m * static_cast<double>(m) / ms / 1e9;
}

void train(const std::string& preset, int batch, double peak_tflops, double gemm_tflops) {
  using namespace dilocox::trainer;
  const GptConfig cfg = gpt_preset(preset);
  const int T = cfg.max_seq;
  auto model = make_cuda_stage_model(cfg, 1, 0, batch, T, 1, Backend{Device::cuda, Precision::bf16, 0});
  model->init(1);
  const SyntheticBatch data(static_cast<std::size_t>(batch) * T, cfg.vocab);
  const auto& tokens = data.tokens;
  const auto& targets = data.targets;
  const AdamWConfig opt;
  std::vector<double> norms(static_cast<std::size_t>(2 + 12 * cfg.n_layer + 2), 0.0);
  std::int64_t t = 0;
  auto step = [&] {  // what StageTrainer does per step on one rank
    model->zero_grads();
    model->forward(0, tokens.data(), targets.data());
    model->backward(0, 1.0f / static_cast<float>(tokens.size()));
    model->finish_backward();
    model->grad_square_norms(norms);
    model->adamw_step(opt, 1e-4f, 1.0f, ++t);
  };
  for (int i = 0; i < 3; ++i) step();
  std::vector<double> secs;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 10; ++i) step();
    model->pull_params();  // waits for the last step
    secs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 10);
  }
  std::nth_element(secs.begin(), secs.begin() + 2, secs.end());
  const double step_s = secs[2], tps = static_cast<double>(tokens.size()) / step_s;
  const double tflops = tps * cfg.flops_per_token(T) / 1e12;
  char name[64];
  std::snprintf(name, sizeof name, "train %s (batch %d x %d, bf16)", preset.c_str(), batch, T);
  std::printf("%-34s %10.3f ms %10.0f tokens/s  %.1f TFLOP/s  MFU %.1f%% of %.0f  (cuBLAS bf16 GEMM %.0f)\n", name,
              step_s * 1e3, tps, tflops, 100 * tflops / peak_tflops, peak_tflops, gemm_tflops);
  result("{\"bench\":\"train\",\"model\":\"" + preset + "\",\"batch\":" + std::to_string(batch) + ",\"seq\":" +
         std::to_string(T) + ",\"step_ms\":" + std::to_string(step_s * 1e3) + ",\"tokens_per_s\":" + std::to_string(tps) +
         ",\"model_TFLOPs\":" + std::to_string(tflops) + ",\"mfu\":" + std::to_string(tflops / peak_tflops) +
         ",\"peak_TFLOPs\":" + std::to_string(peak_tflops) + ",\"gemm_TFLOPs\":" + std::to_string(gemm_tflops) + "}");
}

}  // namespace

int main(int argc, char** argv) {
  double peak = 0;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--peak-tflops" && i + 1 < argc) peak = std::atof(argv[++i]);
    else if (a == "--only" && i + 1 < argc) only = argv[++i];
    else {
      std::fprintf(stderr, "usage: bench_cuda [--peak-tflops X] [--only copy|quantize|projector|train]\n");
      return 2;
    }
  }
  try {
    if (!dx::cuda::device_available()) {
      std::fprintf(stderr, "bench_cuda: no CUDA device\n");
      return 1;
    }
    cudaDeviceProp prop{};
    cudaGetDeviceProperties(&prop, 0);
    if (peak <= 0) {  // dense bf16 tensor-core peak of the SXM parts; other GPUs: pass --peak-tflops
      const std::string name = prop.name;
      peak = name.find("H100") != std::string::npos || name.find("H200") != std::string::npos ? 989.4 : 0;
      if (peak <= 0) {
        std::fprintf(stderr, "bench_cuda: unknown bf16 peak for %s: pass --peak-tflops\n", prop.name);
        return 2;
      }
    }
    std::printf("bench_cuda on %s (%d SMs), bf16 peak %.1f TFLOP/s\n", prop.name, prop.multiProcessorCount, peak);
    cudaStream_t s;
    dx::cuda::check(cudaStreamCreate(&s), "bench_cuda", "stream");
    double copy_gbs = 0;
    if (only.empty() || only == "copy" || only == "quantize") copy_gbs = copy_bandwidth(s);
    if (only.empty() || only == "quantize") quantizers(s, copy_gbs);
    if (only.empty() || only == "projector") projectors(s);
    if (only.empty() || only == "train") {
      const double gemm = bf16_gemm_tflops(s);
      train("small", 64, peak, gemm);
      train("medium", 32, peak, gemm);
    }
    cudaStreamDestroy(s);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda: %s\n", e.what());
    return 1;
  }
  return 0;
}
