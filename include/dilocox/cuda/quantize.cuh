// dilocox/cuda/quantize.cuh: the int8/int4 block quantizers on the device, byte for byte
// the host format of quantize.hpp (same scales, same round-to-nearest-even, the same
// counter-based RNG for stochastic rounding, so host and device encodings are equal).
// Overloads of quantize / dequantize / dequantize_add for TensorView<_, cuda_space>,
// enqueued on an optional stream without host synchronization; a non-finite input is
// recorded in a FaultFlag that the caller reads after its own synchronization.
// One warp per quantization block: 16-byte loads, up to four in flight per lane, the
// block held in registers between the absmax and the rounding pass (blocks <= 512).
// Not here: host encodings (quantize.hpp), headers and checksums (wire.hpp).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "dilocox/cuda/check.hpp"
#include "dilocox/cuda/memory.hpp"
#include "dilocox/quantize.hpp"
#include "dilocox/random.hpp"
#include "dilocox/tensor.hpp"

namespace dilocox {
namespace cuda {

// The first (lowest-index) non-finite element that quantize calls met since reset():
// one 64-bit word on the device, (index << 1) | is_inf, and its page-locked mirror.
class FaultFlag {
 public:
  FaultFlag() : word_(1), host_(1) {
    host_.data()[0] = none;
    check(cudaMemset(word_.data(), 0xff, sizeof(std::uint64_t)), "FaultFlag", "cudaMemset");
  }

  void reset(cudaStream_t s = nullptr) {
    check(cudaMemsetAsync(word_.data(), 0xff, sizeof(std::uint64_t), s), "FaultFlag::reset", "cudaMemsetAsync");
  }
  // Enqueues the copy to the host mirror; read it after `s` has synchronized.
  void fetch(cudaStream_t s = nullptr) {
    copy_to_host(host_.span(1), word_.data(), s, "FaultFlag::fetch");
  }
  bool raised() const { return host_.data()[0] != none; }
  // After fetch() and a synchronization: throws Error naming the element, if any.
  void throw_if_raised(const char* where) const {
    const std::uint64_t w = host_.data()[0];
    if (w == none) return;
    throw Error(std::string(where) + ": element " + std::to_string(w >> 1) + " is " + ((w & 1) ? "Inf" : "NaN"));
  }
  unsigned long long* device() { return reinterpret_cast<unsigned long long*>(word_.data()); }

 private:
  static constexpr std::uint64_t none = ~std::uint64_t{0};
  DeviceBuffer<std::uint64_t> word_;  // (1) device
  PinnedBuffer<std::uint64_t> host_;  // (1) pinned host
};

namespace kernels {

inline constexpr int warps_per_cta = 8;
inline constexpr int max_register_vectors = 4;  // float4 per lane held in registers: blocks <= 512

__device__ inline std::uint32_t abs_bits(float v) { return __float_as_uint(v) & 0x7fffffffU; }

template <bool Stochastic, int Bits>
__device__ inline int code_of(float x, const detail::BlockRatio& r, std::uint64_t seed, std::size_t i) {
  constexpr float qmax = static_cast<float>(quant_max(Bits));
  const float v = detail::clamp_ratio(r.divide ? x / r.scale : __fmul_rn(x, r.inv), qmax);
  if constexpr (Stochastic) {
    return detail::round_stochastic(v, bits_to_unit(counter_bits(counter_key(seed, i), i)), quant_max(Bits));
  } else {
    return detail::round_nearest(v);
  }
}

// Writes the codes of elements [i, i + 4) (all inside the block) from four values.
template <int Bits, bool Stochastic>
__device__ inline void put_four(std::byte* codes, float4 v, const detail::BlockRatio& r, std::uint64_t seed,
                                std::size_t i) {
  const int q0 = code_of<Stochastic, Bits>(v.x, r, seed, i), q1 = code_of<Stochastic, Bits>(v.y, r, seed, i + 1);
  const int q2 = code_of<Stochastic, Bits>(v.z, r, seed, i + 2), q3 = code_of<Stochastic, Bits>(v.w, r, seed, i + 3);
  if constexpr (Bits == 8) {
    const std::uint32_t w = (static_cast<std::uint32_t>(q0) & 0xffU) | ((static_cast<std::uint32_t>(q1) & 0xffU) << 8) |
                            ((static_cast<std::uint32_t>(q2) & 0xffU) << 16) | (static_cast<std::uint32_t>(q3) << 24);
    std::byte* p = codes + i;
    if ((reinterpret_cast<std::uintptr_t>(p) & 3) == 0) *reinterpret_cast<std::uint32_t*>(p) = w;
    else std::memcpy(p, &w, 4);
  } else {
    const auto w = static_cast<std::uint16_t>((q0 + 8) | ((q1 + 8) << 4) | ((q2 + 8) << 8) | ((q3 + 8) << 12));
    std::byte* p = codes + i / 2;  // i is even: blocks are even for int4
    if ((reinterpret_cast<std::uintptr_t>(p) & 1) == 0) *reinterpret_cast<std::uint16_t*>(p) = w;
    else std::memcpy(p, &w, 2);
  }
}

// The codes of elements [i, end) one at a time; i is even for int4 (pairs share a byte,
// an odd tail pads its high nibble with the zero code 8, as the host does).
template <int Bits, bool Stochastic>
__device__ inline void put_scalar(std::byte* codes, const float* x, std::size_t i, std::size_t end,
                                  const detail::BlockRatio& r, std::uint64_t seed) {
  if constexpr (Bits == 8) {
    for (; i < end; ++i) codes[i] = static_cast<std::byte>(static_cast<std::int8_t>(code_of<Stochastic, 8>(x[i], r, seed, i)));
  } else {
    for (; i < end; i += 2) {
      const int lo = code_of<Stochastic, 4>(x[i], r, seed, i) + 8;
      const int hi = i + 1 < end ? code_of<Stochastic, 4>(x[i + 1], r, seed, i + 1) + 8 : 8;
      codes[i / 2] = static_cast<std::byte>(lo | (hi << 4));
    }
  }
}

// One warp per block. `vec`: x is 16-byte aligned and block % 4 == 0 (float4 loads).
template <int Bits, bool Stochastic>
__global__ void __launch_bounds__(32 * warps_per_cta)
    quantize_blocks(const float* __restrict__ x, std::size_t n, std::size_t block, ScaleFormat fmt, std::uint64_t seed,
                    std::byte* __restrict__ out, bool vec, unsigned long long* fault) {
  const std::size_t nb = num_blocks(n, block), sb = scale_bytes(fmt);
  std::byte* codes = out + nb * sb;
  const unsigned lane = threadIdx.x & 31U;
  const std::size_t warps = static_cast<std::size_t>(gridDim.x) * warps_per_cta;
  for (std::size_t b = blockIdx.x * static_cast<std::size_t>(warps_per_cta) + (threadIdx.x >> 5); b < nb; b += warps) {
    const std::size_t base = b * block, len = min(block, n - base), end = base + len;
    const std::size_t nv = vec ? len / 4 : 0;  // float4 vectors, then a scalar tail
    const bool in_registers = nv <= 32 * max_register_vectors;
    float4 held[max_register_vectors];
    std::uint32_t m = 0;
    if (in_registers) {
#pragma unroll
      for (int k = 0; k < max_register_vectors; ++k) {  // independent 16-byte loads in flight
        const std::size_t j = lane + 32U * k;
        held[k] = j < nv ? reinterpret_cast<const float4*>(x + base)[j] : make_float4(0, 0, 0, 0);
      }
#pragma unroll
      for (int k = 0; k < max_register_vectors; ++k)
        m = max(m, max(max(abs_bits(held[k].x), abs_bits(held[k].y)), max(abs_bits(held[k].z), abs_bits(held[k].w))));
    } else {
      for (std::size_t j = lane; j < nv; j += 32) {
        const float4 v = reinterpret_cast<const float4*>(x + base)[j];
        m = max(m, max(max(abs_bits(v.x), abs_bits(v.y)), max(abs_bits(v.z), abs_bits(v.w))));
      }
    }
    for (std::size_t i = base + 4 * nv + lane; i < end; i += 32) m = max(m, abs_bits(x[i]));
    m = __reduce_max_sync(0xffffffffU, m);
    if (m >= 0x7f800000U) {  // a NaN or an Inf: record the first, write nothing more
      for (std::size_t i = base + lane; i < end; i += 32) {
        const std::uint32_t a = abs_bits(x[i]);
        if (a >= 0x7f800000U) {
          atomicMin(fault, static_cast<unsigned long long>((i << 1) | (a == 0x7f800000U ? 1U : 0U)));
          break;
        }
      }
      continue;
    }
    const float scale = detail::block_scale(__uint_as_float(m), Bits, fmt);
    if (lane == 0) {
      if (fmt == ScaleFormat::fp32) {
        std::memcpy(out + b * 4, &scale, 4);
      } else {
        const auto h = static_cast<std::uint16_t>(__float_as_uint(scale) >> 16);
        std::memcpy(out + b * 2, &h, 2);
      }
    }
    const detail::BlockRatio r = detail::block_ratio(scale);
    if (in_registers) {
#pragma unroll
      for (int k = 0; k < max_register_vectors; ++k) {
        const std::size_t j = lane + 32U * k;
        if (j < nv) put_four<Bits, Stochastic>(codes, held[k], r, seed, base + 4 * j);
      }
    } else {
      for (std::size_t j = lane; j < nv; j += 32)
        put_four<Bits, Stochastic>(codes, reinterpret_cast<const float4*>(x + base)[j], r, seed, base + 4 * j);
    }
    // The scalar tail: one lane, elements [base + 4 nv, end) (at most 3 when vectorized).
    const std::size_t tail = base + 4 * nv;
    if (vec) {
      if (lane == 0) put_scalar<Bits, Stochastic>(codes, x, tail, end, r, seed);
    } else {
      const std::size_t step = Bits == 8 ? 1 : 2;  // int4: a lane owns a byte (two elements)
      for (std::size_t i = tail + lane * step; i < end; i += 32 * step)
        put_scalar<Bits, Stochastic>(codes, x, i, min(i + step, end), r, seed);
    }
  }
}

// Four elements per thread per step, two steps in flight; writes (or adds) floats.
template <int Bits, bool Accumulate>
__global__ void dequantize_elements(const std::byte* __restrict__ in, std::size_t n, std::size_t block,
                                    ScaleFormat fmt, float* __restrict__ y) {
  const std::size_t nb = num_blocks(n, block), sb = scale_bytes(fmt);
  const std::byte* codes = in + nb * sb;
  const std::size_t groups = (n + 3) / 4;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  auto scale_of = [&](std::size_t i) {
    const std::size_t b = i / block;
    if (fmt == ScaleFormat::fp32) {
      float s;
      std::memcpy(&s, in + b * 4, 4);
      return s;
    }
    std::uint16_t h;
    std::memcpy(&h, in + b * 2, 2);
    return __uint_as_float(static_cast<std::uint32_t>(h) << 16);
  };
  auto code_at = [&](std::size_t i) -> int {
    if constexpr (Bits == 8) return static_cast<int>(static_cast<std::int8_t>(codes[i]));
    const auto byte = static_cast<std::uint32_t>(codes[i / 2]);
    return static_cast<int>((i & 1) ? (byte >> 4) : (byte & 0xfU)) - 8;
  };
  for (std::size_t g = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; g < groups; g += stride) {
    const std::size_t i0 = 4 * g, end = min(i0 + 4, n);
    float v[4];
    const std::size_t b0 = i0 / block;
    const bool one_block = (end - 1) / block == b0;
    const float s0 = scale_of(i0);
    for (std::size_t i = i0; i < end; ++i) v[i - i0] = static_cast<float>(code_at(i)) * (one_block ? s0 : scale_of(i));
    float* dst = y + i0;
    if (end - i0 == 4 && (reinterpret_cast<std::uintptr_t>(dst) & 15) == 0) {
      float4 w = make_float4(v[0], v[1], v[2], v[3]);
      if constexpr (Accumulate) {
        const float4 o = *reinterpret_cast<const float4*>(dst);
        w.x += o.x, w.y += o.y, w.z += o.z, w.w += o.w;
      }
      *reinterpret_cast<float4*>(dst) = w;
    } else {
      for (std::size_t i = i0; i < end; ++i) {
        if constexpr (Accumulate) dst[i - i0] += v[i - i0];
        else dst[i - i0] = v[i - i0];
      }
    }
  }
}

template <bool Accumulate>
void launch_dequantize(const std::byte* in, std::size_t n, float* out, const QuantConfig& c, cudaStream_t s) {
  if (n == 0) return;
  const unsigned threads = 256, grid = grid_size((n + 3) / 4, threads);
  if (c.bits == 8) dequantize_elements<8, Accumulate><<<grid, threads, 0, s>>>(in, n, c.block, c.scale, out);
  else dequantize_elements<4, Accumulate><<<grid, threads, 0, s>>>(in, n, c.block, c.scale, out);
  check_launch(Accumulate ? "dequantize_add (cuda)" : "dequantize (cuda)");
}

}  // namespace kernels
}  // namespace cuda

// Quantizes device memory `in` into device memory `out` (at least encoded_size bytes),
// enqueued on `stream`. Bad configs and short buffers throw here; a NaN/Inf element is
// recorded in `fault` (when given) and its block is left unwritten.
inline void quantize(TensorView<const float, cuda_space> in, TensorView<std::byte, cuda_space> out,
                     const QuantConfig& c, cudaStream_t stream = nullptr, cuda::FaultFlag* fault = nullptr) {
  const std::size_t n = in.shape.numel();
  detail::check_sizes("quantize (cuda)", out.shape.numel(), encoded_size(n, c), "output buffer");
  if (n == 0) return;
  cuda::FaultFlag* f = fault;
  thread_local std::unique_ptr<cuda::FaultFlag> scratch;  // a sink when the caller passes none
  if (!f) {
    if (!scratch) scratch = std::make_unique<cuda::FaultFlag>();
    f = scratch.get();
  }
  const bool vec = c.block % 4 == 0 && (reinterpret_cast<std::uintptr_t>(in.data) & 15) == 0;
  const unsigned threads = 32 * cuda::kernels::warps_per_cta;
  const unsigned grid = cuda::grid_size(num_blocks(n, c.block), cuda::kernels::warps_per_cta);
  const bool st = c.rounding == Rounding::stochastic;
  using namespace cuda::kernels;
  if (c.bits == 8) {
    st ? quantize_blocks<8, true><<<grid, threads, 0, stream>>>(in.data, n, c.block, c.scale, c.seed, out.data, vec, f->device())
       : quantize_blocks<8, false><<<grid, threads, 0, stream>>>(in.data, n, c.block, c.scale, c.seed, out.data, vec, f->device());
  } else {
    st ? quantize_blocks<4, true><<<grid, threads, 0, stream>>>(in.data, n, c.block, c.scale, c.seed, out.data, vec, f->device())
       : quantize_blocks<4, false><<<grid, threads, 0, stream>>>(in.data, n, c.block, c.scale, c.seed, out.data, vec, f->device());
  }
  cuda::check_launch("quantize (cuda)");
}

// out = the values `in` encodes (device memory both), enqueued on `stream`.
inline void dequantize(TensorView<const std::byte, cuda_space> in, TensorView<float, cuda_space> out,
                       const QuantConfig& c, cudaStream_t stream = nullptr) {
  detail::check_sizes("dequantize (cuda)", in.shape.numel(), encoded_size(out.shape.numel(), c), "input buffer");
  cuda::kernels::launch_dequantize<false>(in.data, out.shape.numel(), out.data, c, stream);
}

// out += the values `in` encodes (the inner step of a quantized reduction).
inline void dequantize_add(TensorView<const std::byte, cuda_space> in, TensorView<float, cuda_space> out,
                           const QuantConfig& c, cudaStream_t stream = nullptr) {
  detail::check_sizes("dequantize_add (cuda)", in.shape.numel(), encoded_size(out.shape.numel(), c), "input buffer");
  cuda::kernels::launch_dequantize<true>(in.data, out.shape.numel(), out.data, c, stream);
}

}  // namespace dilocox
