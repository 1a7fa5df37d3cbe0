// dilocox/quantize.hpp: int8 and int4 block quantizers with absmax scales (fp32 or
// bf16), round-to-nearest-even or stochastic rounding, on the host. Symmetric codes:
// int8 in [-127, 127], int4 in [-7, 7] stored as q + 8, two per byte, low nibble first.
// Encoded layout: [scales: one per block][codes]. The scalar kernels here define the
// format; quantize_avx2.hpp has x86 kernels that write the same bytes, picked at run time.
// Needs only the standard library. Not here: headers and checksums (wire.hpp), device
// kernels (cuda/quantize.cuh).
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <string_view>

#include "dilocox/config.hpp"
#include "dilocox/random.hpp"

namespace dilocox {

static_assert(std::endian::native == std::endian::little, "dilocox encodes little-endian");

enum class Rounding : std::uint8_t { nearest = 0, stochastic = 1 };
enum class ScaleFormat : std::uint8_t { fp32 = 0, bf16 = 1 };

struct QuantConfig {
  int bits = 4;                       // 4 or 8
  std::size_t block = 128;            // elements per scale; even for int4
  Rounding rounding = Rounding::nearest;
  std::uint64_t seed = 0;             // stochastic rounding: same seed, same bytes
  ScaleFormat scale = ScaleFormat::fp32;
  friend bool operator==(const QuantConfig&, const QuantConfig&) = default;
};

inline constexpr std::size_t max_quant_block = std::size_t{1} << 24;

// Throws Error naming the bad field. Messages are built only on failure: this runs on
// every call, and a 4 KiB quantize takes well under a microsecond.
inline void validate(const QuantConfig& c) {
  auto fail = [](const std::string& what) { throw Error("QuantConfig: " + what); };
  if (c.bits != 4 && c.bits != 8) fail("bits must be 4 or 8, got " + std::to_string(c.bits));
  if (c.block < 1 || c.block > max_quant_block) fail("block must be in [1, 2^24], got " + std::to_string(c.block));
  if (c.bits == 4 && c.block % 2 != 0)
    fail("int4 needs an even block (two codes per byte), got " + std::to_string(c.block));
  if (c.rounding != Rounding::nearest && c.rounding != Rounding::stochastic)
    fail("unknown rounding mode " + std::to_string(static_cast<int>(c.rounding)));
  if (c.scale != ScaleFormat::fp32 && c.scale != ScaleFormat::bf16)
    fail("unknown scale format " + std::to_string(static_cast<int>(c.scale)));
}

DILOCOX_HOST_DEVICE constexpr std::size_t num_blocks(std::size_t n, std::size_t block) {
  return (n + block - 1) / block;
}
DILOCOX_HOST_DEVICE constexpr std::size_t scale_bytes(ScaleFormat f) { return f == ScaleFormat::fp32 ? 4 : 2; }
DILOCOX_HOST_DEVICE constexpr std::size_t code_bytes(std::size_t n, int bits) {
  return bits == 8 ? n : (n + 1) / 2;
}
DILOCOX_HOST_DEVICE constexpr int quant_max(int bits) { return bits == 8 ? 127 : 7; }

// Exact size of quantize()'s output for n floats.
inline std::size_t encoded_size(std::size_t n, const QuantConfig& c) {
  validate(c);
  return num_blocks(n, c.block) * scale_bytes(c.scale) + code_bytes(n, c.bits);
}

namespace detail {

// The scale of a block with largest magnitude `absmax`, as it is stored: bf16 is
// rounded up so that |x| / scale never exceeds qmax by more than rounding.
DILOCOX_HOST_DEVICE inline float block_scale(float absmax, int bits, ScaleFormat f) {
  float s = absmax / static_cast<float>(quant_max(bits));
  if (f == ScaleFormat::bf16) {
    std::uint32_t u;
    std::memcpy(&u, &s, 4);
    if (u & 0xffffU) u = (u & 0xffff0000U) + 0x10000U;  // toward +inf; s >= 0
    std::memcpy(&s, &u, 4);
  }
  return s;
}

inline void store_scale(std::byte* p, float s, ScaleFormat f) {
  if (f == ScaleFormat::fp32) {
    std::memcpy(p, &s, 4);
  } else {
    const std::uint32_t u = std::bit_cast<std::uint32_t>(s) >> 16;
    const std::uint16_t h = static_cast<std::uint16_t>(u);
    std::memcpy(p, &h, 2);
  }
}

inline float load_scale(const std::byte* p, ScaleFormat f) {
  if (f == ScaleFormat::fp32) {
    float s;
    std::memcpy(&s, p, 4);
    return s;
  }
  std::uint16_t h;
  std::memcpy(&h, p, 2);
  return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16);
}

// Largest |x| of a block as float bits (non-negative floats order like their
// bits); a value >= 0x7f800000 means the block holds a NaN or an Inf.
inline std::uint32_t absmax_bits(const float* x, std::size_t len) {
  std::uint32_t m = 0;
  for (std::size_t i = 0; i < len; ++i) {
    const std::uint32_t b = std::bit_cast<std::uint32_t>(x[i]) & 0x7fffffffU;
    m = b > m ? b : m;
  }
  return m;
}

[[noreturn]] inline void throw_nonfinite(const float* x, std::size_t len, std::size_t base) {
  for (std::size_t i = 0; i < len; ++i) {
    if (!std::isfinite(x[i])) {
      throw Error("quantize: element " + std::to_string(base + i) + " is " +
                  (std::isnan(x[i]) ? "NaN" : "Inf"));
    }
  }
  throw Error("quantize: non-finite element in block at " + std::to_string(base));
}

// x / scale as the quantizers compute it, clamped to [-qmax, qmax]. A block whose
// scale is subnormal divides (1/scale would overflow); the others multiply by 1/scale.
struct BlockRatio {
  float inv;    // 1 / scale, or 0 when dividing
  float scale;  // as stored
  bool divide;
};

DILOCOX_HOST_DEVICE inline BlockRatio block_ratio(float scale) {
  const bool divide = scale != 0.0f && scale < 0x1p-126f;  // below the smallest normal float
  return {divide || scale == 0.0f ? 0.0f : 1.0f / scale, scale, divide};
}

DILOCOX_HOST_DEVICE inline float clamp_ratio(float v, float qmax) {
  v = v < -qmax ? -qmax : v;  // also maps NaN (denormals flushed to zero) to -qmax
  return v > qmax ? qmax : v;
}

// Round-to-nearest-even of |v| < 2^22: adding 1.5 * 2^23 leaves the rounded integer
// in the low mantissa bits. Bit-identical to rintf / __float2int_rn.
DILOCOX_HOST_DEVICE inline int round_nearest(float v) {
  const float t = v + 12582912.0f;
  std::uint32_t u;
  std::memcpy(&u, &t, 4);
  return static_cast<int>(u) - 0x4B400000;
}

// floor(v + u) for v in [-qmax, qmax] and u in [0, 1): unbiased stochastic rounding of
// v, clamped to qmax. The sum is rounded to float first: at v = qmax it reaches
// qmax + 1 when u is within half an ulp of 1 (one draw in 2^18 for int8, 2^22 for
// int4); for v <= qmax the exact floor(v + u) is at most qmax, so the clamp only
// undoes that rounding (v = qmax always gives qmax). No lower clamp: v + u >= v >= -qmax,
// which is a float. The AVX2 and CUDA kernels round the same way.
DILOCOX_HOST_DEVICE inline int round_stochastic(float v, float u, int qmax) {
  const float w = v + u;
  const int t = static_cast<int>(w);  // toward zero
  const int q = t - (static_cast<float>(t) > w ? 1 : 0);
  return q < qmax ? q : qmax;
}

// The codes of one block, written in simple loops the compiler vectorizes.
template <int Bits, bool Stochastic>
void quantize_block(const float* x, std::size_t len, std::size_t base, const BlockRatio& r,
                    std::uint64_t seed, std::byte* codes) {
  constexpr int iqmax = quant_max(Bits);
  constexpr float qmax = static_cast<float>(iqmax);
  constexpr std::size_t chunk = 256;
  int q[chunk];  // codes of up to `chunk` elements
  const bool one_key = (base >> 32) == ((base + len) >> 32);
  const std::uint32_t key = counter_key(seed, base);
  const float inv = r.inv, scale = r.scale;
  for (std::size_t c0 = 0; c0 < len; c0 += chunk) {
    const std::size_t m = std::min(chunk, len - c0);
    const float* xc = x + c0;
    const std::size_t i0 = base + c0;
    if (r.divide) {  // subnormal scale: rare, scalar is fine
      for (std::size_t i = 0; i < m; ++i) {
        const float v = clamp_ratio(xc[i] / scale, qmax);
        q[i] = Stochastic
                   ? round_stochastic(v, bits_to_unit(counter_bits(counter_key(seed, i0 + i), i0 + i)), iqmax)
                   : round_nearest(v);
      }
    } else if constexpr (!Stochastic) {
      for (std::size_t i = 0; i < m; ++i) q[i] = round_nearest(clamp_ratio(xc[i] * inv, qmax));
    } else if (one_key) {
      for (std::size_t i = 0; i < m; ++i)
        q[i] = round_stochastic(clamp_ratio(xc[i] * inv, qmax), bits_to_unit(counter_bits(key, i0 + i)), iqmax);
    } else {
      for (std::size_t i = 0; i < m; ++i)
        q[i] = round_stochastic(clamp_ratio(xc[i] * inv, qmax),
                                bits_to_unit(counter_bits(counter_key(seed, i0 + i), i0 + i)), iqmax);
    }
    if constexpr (Bits == 8) {
      auto* out = reinterpret_cast<std::int8_t*>(codes) + c0;
      for (std::size_t i = 0; i < m; ++i) out[i] = static_cast<std::int8_t>(q[i]);
    } else {
      // Biased codes as bytes, then each byte pair (as one 16-bit lane) folded into
      // one byte: contiguous lanes vectorize where a stride-2 gather does not.
      std::uint8_t c[chunk + 1];
      for (std::size_t i = 0; i < m; ++i) c[i] = static_cast<std::uint8_t>(q[i] + 8);
      c[m] = 8;  // pads an odd tail with a zero code
      auto* out = reinterpret_cast<std::uint8_t*>(codes) + c0 / 2;
      const std::size_t pairs = (m + 1) / 2;
      for (std::size_t j = 0; j < pairs; ++j) {
        std::uint16_t w;
        std::memcpy(&w, c + 2 * j, 2);
        out[j] = static_cast<std::uint8_t>((w & 0x0f) | ((w >> 4) & 0xf0));
      }
    }
  }
}

template <int Bits, bool Stochastic>
void quantize_all(std::span<const float> in, std::byte* out, const QuantConfig& c) {
  const std::size_t n = in.size(), nb = num_blocks(n, c.block), sb = scale_bytes(c.scale);
  std::byte* codes = out + nb * sb;
  for (std::size_t b = 0; b < nb; ++b) {
    const std::size_t base = b * c.block, len = std::min(c.block, n - base);
    const float* x = in.data() + base;
    const std::uint32_t mb = absmax_bits(x, len);
    if (mb >= 0x7f800000U) throw_nonfinite(x, len, base);
    const float scale = block_scale(std::bit_cast<float>(mb), Bits, c.scale);
    store_scale(out + b * sb, scale, c.scale);
    quantize_block<Bits, Stochastic>(x, len, base, block_ratio(scale), c.seed,
                                     codes + code_bytes(base, Bits));
  }
}

template <int Bits, bool Accumulate>
void dequantize_all(std::span<const std::byte> in, std::span<float> out, const QuantConfig& c) {
  const std::size_t n = out.size(), nb = num_blocks(n, c.block), sb = scale_bytes(c.scale);
  const std::byte* codes = in.data() + nb * sb;
  for (std::size_t b = 0; b < nb; ++b) {
    const std::size_t base = b * c.block, len = std::min(c.block, n - base);
    const float s = load_scale(in.data() + b * sb, c.scale);
    float* y = out.data() + base;
    auto put = [&](std::size_t i, int q) {
      const float v = static_cast<float>(q) * s;
      if constexpr (Accumulate) y[i] += v; else y[i] = v;
    };
    if constexpr (Bits == 8) {
      const auto* q = reinterpret_cast<const std::int8_t*>(codes + base);
      for (std::size_t i = 0; i < len; ++i) put(i, q[i]);
    } else {
      const auto* q = reinterpret_cast<const std::uint8_t*>(codes + base / 2);
      const std::size_t pairs = len / 2;
      for (std::size_t j = 0; j < pairs; ++j) {
        put(2 * j, (q[j] & 0xf) - 8);
        put(2 * j + 1, (q[j] >> 4) - 8);
      }
      if (len % 2) put(len - 1, (q[pairs] & 0xf) - 8);
    }
  }
}

inline void check_sizes(const char* where, std::size_t have, std::size_t need, const char* what) {
  if (have < need)
    throw Error(std::string(where) + ": " + what + " holds " + std::to_string(have) + " bytes, needs " +
                std::to_string(need));
}

}  // namespace detail
}  // namespace dilocox

// The x86 kernels build on the reference above (scales, rounding rules, block tails).
#include "dilocox/quantize_avx2.hpp"

namespace dilocox {
namespace detail {

// Which kernels quantize / dequantize / dequantize_add run: the portable reference
// above, or AVX2 (x86-64 with AVX2 and FMA; also what AVX-512 CPUs run). Picked once,
// at the first call, from the CPU, whatever the compiler flags; the environment
// variable DILOCOX_QUANT_KERNEL=portable|avx2|auto overrides the pick (tests,
// benchmarks; an unknown value, or avx2 where there is none, makes the first call
// throw Error) and set_quant_kernel changes it in-process. Both write the same bytes.
enum class QuantKernel : std::uint8_t { portable = 0, avx2 = 1 };

inline const char* quant_kernel_name(QuantKernel k) { return k == QuantKernel::avx2 ? "avx2" : "portable"; }

inline bool cpu_has_avx2() {
#if DILOCOX_QUANTIZE_AVX2
  __builtin_cpu_init();  // in case we run from another static initializer
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;  // not x86-64, or not GCC/Clang, or nvcc's device pass
#endif
}

inline void require_kernel(QuantKernel k, const char* where) {
  if (k == QuantKernel::avx2 && !cpu_has_avx2())
    throw Error(std::string(where) + ": the avx2 kernel needs an x86-64 CPU with AVX2 and FMA and a GCC or "
                "Clang build; this one has no such kernel");
}

inline QuantKernel initial_quant_kernel() {
  const QuantKernel best = cpu_has_avx2() ? QuantKernel::avx2 : QuantKernel::portable;
  const char* env = std::getenv("DILOCOX_QUANT_KERNEL");
  if (env == nullptr || std::string_view(env) == "auto" || *env == '\0') return best;
  const std::string_view v(env);
  if (v != "portable" && v != "avx2")
    throw Error("DILOCOX_QUANT_KERNEL: unknown kernel '" + std::string(v) + "' (portable, avx2 or auto)");
  const QuantKernel k = v == "avx2" ? QuantKernel::avx2 : QuantKernel::portable;
  require_kernel(k, "DILOCOX_QUANT_KERNEL");
  return k;
}

inline std::atomic<QuantKernel>& quant_kernel_slot() {
  static std::atomic<QuantKernel> k{initial_quant_kernel()};
  return k;
}

// The kernel the next call runs.
inline QuantKernel quant_kernel() { return quant_kernel_slot().load(std::memory_order_relaxed); }

// Runs `k` from now on, in every thread; throws Error where this build or CPU lacks it.
inline void set_quant_kernel(QuantKernel k) {
  require_kernel(k, "set_quant_kernel");
  quant_kernel_slot().store(k, std::memory_order_relaxed);
}

template <int Bits, bool Stochastic>
void quantize_with(QuantKernel k, std::span<const float> in, std::byte* out, const QuantConfig& c) {
#if DILOCOX_QUANTIZE_AVX2
  if (k == QuantKernel::avx2) return avx2::quantize_all<Bits, Stochastic>(in, out, c);
#endif
  (void)k;
  quantize_all<Bits, Stochastic>(in, out, c);
}

template <bool Accumulate>
void dequantize_with(QuantKernel k, std::span<const std::byte> in, std::span<float> out, const QuantConfig& c) {
#if DILOCOX_QUANTIZE_AVX2
  if (k == QuantKernel::avx2) {
    return c.bits == 8 ? avx2::dequantize_all<8, Accumulate>(in, out, c)
                       : avx2::dequantize_all<4, Accumulate>(in, out, c);
  }
#endif
  (void)k;
  c.bits == 8 ? dequantize_all<8, Accumulate>(in, out, c) : dequantize_all<4, Accumulate>(in, out, c);
}

}  // namespace detail

// Quantizes `in` into `out` (at least encoded_size(in.size(), c) bytes). Throws Error
// on a bad config, a short `out`, or a NaN/Inf element (naming its index); on a
// throw the contents of `out` are unspecified.
inline void quantize(std::span<const float> in, std::span<std::byte> out, const QuantConfig& c) {
  detail::check_sizes("quantize", out.size(), encoded_size(in.size(), c), "output buffer");
  const detail::QuantKernel k = detail::quant_kernel();
  const bool st = c.rounding == Rounding::stochastic;
  if (c.bits == 8) {
    st ? detail::quantize_with<8, true>(k, in, out.data(), c) : detail::quantize_with<8, false>(k, in, out.data(), c);
  } else {
    st ? detail::quantize_with<4, true>(k, in, out.data(), c) : detail::quantize_with<4, false>(k, in, out.data(), c);
  }
}

// out = the values `in` encodes; out.size() is the element count.
inline void dequantize(std::span<const std::byte> in, std::span<float> out, const QuantConfig& c) {
  detail::check_sizes("dequantize", in.size(), encoded_size(out.size(), c), "input buffer");
  detail::dequantize_with<false>(detail::quant_kernel(), in, out, c);
}

// out += the values `in` encodes: the inner step of a quantized reduction. The avx2
// kernel fuses the multiply and add (one rounding, as std::fma); the portable one
// fuses them where the compiler does (GCC with -march=native on an FMA CPU): the
// result is deterministic for a given build and kernel, not bit-equal to
// dequantize() then add.
inline void dequantize_add(std::span<const std::byte> in, std::span<float> out, const QuantConfig& c) {
  detail::check_sizes("dequantize_add", in.size(), encoded_size(out.size(), c), "input buffer");
  detail::dequantize_with<true>(detail::quant_kernel(), in, out, c);
}

}  // namespace dilocox
