// reference_trainer/model/cuda/kernels.cuh: the GPT layers' non-GEMM work on the GPU,
// templated on the compute type Tc (float or __nv_bfloat16); arithmetic in fp32. The
// matmuls are cuBLAS calls in cuda_stage_model.cu. Conventions follow cpu/kernels.hpp:
// activations (B, T, C) row-major, weights (out, in), parameter gradients fp32 and
// accumulated (+=), activation gradients written (or added where noted).
// Not bit-reproducible run to run: embedding and LayerNorm weight gradients use atomics.
#pragma once

#include "model/adamw.hpp"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace dilocox::trainer::cuda_kernels {

template <class T>
__device__ inline float f32(T v) {
  if constexpr (std::is_same_v<T, float>) return v;
  else return __bfloat162float(v);
}
template <class T>
__device__ inline T from_f32(float v) {
  if constexpr (std::is_same_v<T, float>) return v;
  else return __float2bfloat16(v);
}

__device__ inline float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffU, v, o);
  return v;
}
__device__ inline float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffU, v, o));
  return v;
}

// Sum (or max) over a block of up to 1024 threads; every thread gets the result.
template <bool Max>
__device__ inline float block_reduce(float v, float* shared32) {
  const unsigned lane = threadIdx.x & 31U, warp = threadIdx.x >> 5;
  v = Max ? warp_max(v) : warp_sum(v);
  __syncthreads();  // shared32 may still be read by a previous call
  if (lane == 0) shared32[warp] = v;
  __syncthreads();
  const unsigned warps = (blockDim.x + 31) / 32;
  float r = lane < warps ? shared32[lane] : (Max ? -INFINITY : 0.0f);
  return Max ? warp_max(r) : warp_sum(r);
}

#define DILOCOX_GRID_STRIDE(i, n)                                                                     \
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)

template <class T>
__global__ void convert(T* __restrict__ dst, const float* __restrict__ src, std::size_t n) {
  DILOCOX_GRID_STRIDE(i, n) dst[i] = from_f32<T>(src[i]);
}
template <class T>
__global__ void to_float(float* __restrict__ dst, const T* __restrict__ src, std::size_t n) {
  DILOCOX_GRID_STRIDE(i, n) dst[i] = f32(src[i]);
}

// out (N, C) = wte[tokens] + wpe[t]
template <class T>
__global__ void embedding_forward(T* out, const std::int32_t* tokens, const T* wte, const T* wpe, int N, int Tn, int C) {
  DILOCOX_GRID_STRIDE(i, static_cast<std::size_t>(N) * C) {
    const std::size_t n = i / C, c = i % C, t = n % Tn;
    out[i] = from_f32<T>(f32(wte[static_cast<std::size_t>(tokens[n]) * C + c]) + f32(wpe[t * C + c]));
  }
}

template <class T>
__global__ void embedding_backward(float* dwte, float* dwpe, const T* dout, const std::int32_t* tokens, int N, int Tn,
                                   int C) {
  DILOCOX_GRID_STRIDE(i, static_cast<std::size_t>(N) * C) {
    const std::size_t n = i / C, c = i % C, t = n % Tn;
    const float d = f32(dout[i]);
    atomicAdd(dwte + static_cast<std::size_t>(tokens[n]) * C + c, d);
    atomicAdd(dwpe + t * C + c, d);
  }
}

// One warp per row: out = (x - mean) * rstd * w + b; keeps mean and rstd (N).
template <class T>
__global__ void layernorm_forward(T* out, float* mean, float* rstd, const T* x, const T* w, const T* b, int N, int C) {
  const int row = blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
  const unsigned lane = threadIdx.x & 31U;
  if (row >= N) return;
  const T* xi = x + static_cast<std::size_t>(row) * C;
  float s = 0;
  for (int i = lane; i < C; i += 32) s += f32(xi[i]);
  const float m = warp_sum(s) / C;
  float v = 0;
  for (int i = lane; i < C; i += 32) {
    const float d = f32(xi[i]) - m;
    v += d * d;
  }
  const float r = rsqrtf(warp_sum(v) / C + 1e-5f);
  T* o = out + static_cast<std::size_t>(row) * C;
  for (int i = lane; i < C; i += 32) o[i] = from_f32<T>((f32(xi[i]) - m) * r * f32(w[i]) + f32(b[i]));
  if (lane == 0) mean[row] = m, rstd[row] = r;
}

// dx += LayerNorm'(dout); dw, db accumulate (in shared memory per block, then atomics).
// Dynamic shared memory: 2 C floats.
template <class T>
__global__ void layernorm_backward(T* dx, float* dw, float* db, const T* dout, const T* x, const T* w,
                                   const float* mean, const float* rstd, int N, int C) {
  extern __shared__ float acc[];  // (2, C): dw, db of this block
  for (int i = threadIdx.x; i < 2 * C; i += blockDim.x) acc[i] = 0;
  __syncthreads();
  const unsigned lane = threadIdx.x & 31U, warps = blockDim.x / 32;
  for (int row = blockIdx.x * warps + (threadIdx.x >> 5); row < N; row += gridDim.x * warps) {
    const std::size_t off = static_cast<std::size_t>(row) * C;
    const float m = mean[row], r = rstd[row];
    float a = 0, bsum = 0;
    for (int i = lane; i < C; i += 32) {
      const float norm = (f32(x[off + i]) - m) * r, dn = f32(w[i]) * f32(dout[off + i]);
      a += dn;
      bsum += dn * norm;
    }
    const float dnorm_mean = warp_sum(a) / C, dnorm_norm_mean = warp_sum(bsum) / C;
    for (int i = lane; i < C; i += 32) {
      const float d = f32(dout[off + i]), norm = (f32(x[off + i]) - m) * r;
      atomicAdd(acc + i, norm * d);
      atomicAdd(acc + C + i, d);
      dx[off + i] = from_f32<T>(f32(dx[off + i]) + (f32(w[i]) * d - dnorm_mean - norm * dnorm_norm_mean) * r);
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < C; i += blockDim.x) {
    atomicAdd(dw + i, acc[i]);
    atomicAdd(db + i, acc[C + i]);
  }
}

template <class T>
__global__ void add_bias(T* out, const T* b, int N, int OC) {
  DILOCOX_GRID_STRIDE(i, static_cast<std::size_t>(N) * OC) out[i] = from_f32<T>(f32(out[i]) + f32(b[i % OC]));
}

// db (OC) += column sums of dout (N, OC): blocks of 32 columns x 8 row groups.
template <class T>
__global__ void bias_backward(float* db, const T* dout, int N, int OC) {
  __shared__ float part[8][33];
  const int c = blockIdx.x * 32 + threadIdx.x;
  float s = 0;
  if (c < OC)
    for (int n = threadIdx.y; n < N; n += 8) s += f32(dout[static_cast<std::size_t>(n) * OC + c]);
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < OC) {
    float t = 0;
    for (int y = 0; y < 8; ++y) t += part[y][threadIdx.x];
    db[c] += t;
  }
}

__device__ inline float gelu(float x) {
  const float k = 0.7978845608028654f, c = 0.044715f;
  return 0.5f * x * (1.0f + tanhf(k * (x + c * x * x * x)));
}
__device__ inline float gelu_grad(float x) {
  const float k = 0.7978845608028654f, c = 0.044715f;
  const float th = tanhf(k * (x + c * x * x * x));
  return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * k * (1.0f + 3.0f * c * x * x);
}
template <class T>
__global__ void gelu_forward(T* out, const T* x, std::size_t n) {
  DILOCOX_GRID_STRIDE(i, n) out[i] = from_f32<T>(gelu(f32(x[i])));
}
// dx = gelu'(x) * dout (dx may be dout).
template <class T>
__global__ void gelu_backward(T* dx, const T* x, const T* dout, std::size_t n) {
  DILOCOX_GRID_STRIDE(i, n) dx[i] = from_f32<T>(gelu_grad(f32(x[i])) * f32(dout[i]));
}

template <class T>
__global__ void add_into(T* y, const T* x, std::size_t n) {
  DILOCOX_GRID_STRIDE(i, n) y[i] = from_f32<T>(f32(y[i]) + f32(x[i]));
}

// qkv (B, T, 3, NH, hs) <-> q, k, v (B, NH, T, hs) each; Pack: the reverse direction.
template <class T, bool Pack>
__global__ void qkv_permute(T* qkv, T* q, T* k, T* v, int B, int Tn, int NH, int hs) {
  const int C = NH * hs;
  DILOCOX_GRID_STRIDE(i, static_cast<std::size_t>(B) * Tn * 3 * C) {
    const std::size_t bt = i / (3 * C);
    const int rem = static_cast<int>(i % (3 * C)), which = rem / C, h = (rem % C) / hs, d = rem % hs;
    const std::size_t b = bt / Tn, t = bt % Tn;
    T* dst = which == 0 ? q : which == 1 ? k : v;
    T& e = dst[((b * NH + h) * Tn + t) * hs + d];
    if constexpr (Pack) qkv[i] = e;
    else e = qkv[i];
  }
}

// y (B, NH, T, hs) <-> out (B, T, C); Pack: (B, T, C) -> (B, NH, T, hs).
template <class T, bool Pack>
__global__ void heads_permute(T* btc, T* bhts, int B, int Tn, int NH, int hs) {
  const int C = NH * hs;
  DILOCOX_GRID_STRIDE(i, static_cast<std::size_t>(B) * Tn * C) {
    const std::size_t bt = i / C, b = bt / Tn, t = bt % Tn;
    const int h = static_cast<int>(i % C) / hs, d = static_cast<int>(i % C) % hs;
    T& e = bhts[((b * NH + h) * Tn + t) * hs + d];
    if constexpr (Pack) e = btc[i];
    else btc[i] = e;
  }
}

// Fused causal softmax over rows of (B * NH * T, T) scores (already scaled), in place:
// one warp per row; entries above the diagonal become 0.
template <class T>
__global__ void softmax_causal_forward(T* att, std::size_t rows, int Tn) {
  const std::size_t row = blockIdx.x * static_cast<std::size_t>(blockDim.x / 32) + (threadIdx.x >> 5);
  const unsigned lane = threadIdx.x & 31U;
  if (row >= rows) return;
  const int t = static_cast<int>(row % Tn);
  T* a = att + row * Tn;
  float mx = -INFINITY;
  for (int j = lane; j <= t; j += 32) mx = fmaxf(mx, f32(a[j]));
  mx = warp_max(mx);
  float sum = 0;
  for (int j = lane; j <= t; j += 32) sum += __expf(f32(a[j]) - mx);
  const float inv = 1.0f / warp_sum(sum);
  for (int j = lane; j < Tn; j += 32) a[j] = from_f32<T>(j <= t ? __expf(f32(a[j]) - mx) * inv : 0.0f);
}

// d(scores) = p * (d(p) - <p, d(p)>) * scale, in place on d(p); zero above the diagonal.
template <class T>
__global__ void softmax_causal_backward(T* dp, const T* att, std::size_t rows, int Tn, float scale) {
  const std::size_t row = blockIdx.x * static_cast<std::size_t>(blockDim.x / 32) + (threadIdx.x >> 5);
  const unsigned lane = threadIdx.x & 31U;
  if (row >= rows) return;
  const int t = static_cast<int>(row % Tn);
  T* d = dp + row * Tn;
  const T* p = att + row * Tn;
  float dot = 0;
  for (int j = lane; j <= t; j += 32) dot += f32(p[j]) * f32(d[j]);
  dot = warp_sum(dot);
  for (int j = lane; j < Tn; j += 32) d[j] = from_f32<T>(j <= t ? f32(p[j]) * (f32(d[j]) - dot) * scale : 0.0f);
}

// One block per row of logits (N, V): loss = logsumexp - logit[target]; keeps lse.
template <class T>
__global__ void cross_entropy_forward(float* losses, float* lse, const T* logits, const std::int32_t* targets, int V) {
  __shared__ float shared32[32];
  const std::size_t n = blockIdx.x;
  const T* row = logits + n * V;
  float mx = -INFINITY;
  for (int i = threadIdx.x; i < V; i += blockDim.x) mx = fmaxf(mx, f32(row[i]));
  mx = block_reduce<true>(mx, shared32);
  float s = 0;
  for (int i = threadIdx.x; i < V; i += blockDim.x) s += expf(f32(row[i]) - mx);
  s = block_reduce<false>(s, shared32);
  if (threadIdx.x == 0) {
    const float l = logf(s) + mx;
    lse[n] = l;
    losses[n] = l - f32(row[targets[n]]);
  }
}

// dlogits = (softmax - onehot(target)) * scale, in place on the logits.
template <class T>
__global__ void cross_entropy_backward(T* logits, const float* lse, const std::int32_t* targets, int N, int V,
                                       float scale) {
  DILOCOX_GRID_STRIDE(i, static_cast<std::size_t>(N) * V) {
    const std::size_t n = i / V;
    const int c = static_cast<int>(i % V);
    const float p = expf(f32(logits[i]) - lse[n]);
    logits[i] = from_f32<T>((p - (c == targets[n] ? 1.0f : 0.0f)) * scale);
  }
}

// AdamW (the CPU's rule, AdamWUpdate::apply) on fp32 master weights p; pc receives the
// compute copy.
template <class T>
__global__ void adamw(float* p, T* pc, const float* g, float* m, float* v, std::size_t n, AdamWUpdate u, float wd) {
  DILOCOX_GRID_STRIDE(i, n) {
    float pi = p[i], mi = m[i], vi = v[i];
    u.apply(pi, mi, vi, g[i], wd);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
    if constexpr (!std::is_same_v<T, float>) pc[i] = from_f32<T>(pi);
  }
}

// out[0] += sum of squares of g (n), in double.
__global__ void square_norm(double* out, const float* g, std::size_t n) {
  __shared__ double part[32];
  double s = 0;
  DILOCOX_GRID_STRIDE(i, n) s += static_cast<double>(g[i]) * g[i];
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffU, s, o);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    double t = 0;
    for (unsigned w = 0; w < blockDim.x / 32; ++w) t += part[w];
    atomicAdd(out, t);
  }
}

#undef DILOCOX_GRID_STRIDE

}  // namespace dilocox::trainer::cuda_kernels
