// dilocox/quantize_avx2.hpp: AVX2 kernels behind quantize / dequantize / dequantize_add,
// byte for byte the scalar reference of quantize.hpp (which they call for block tails
// and rare blocks), compiled with target attributes (no -mavx2 needed) and run only on
// CPUs that have AVX2 and FMA. Not here: an AVX-512 kernel (AVX-512 CPUs run this one),
// non-x86 SIMD. Part of quantize.hpp, which includes it after its reference kernels.
#pragma once

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDA_ARCH__)
#define DILOCOX_QUANTIZE_AVX2 1
#else
#define DILOCOX_QUANTIZE_AVX2 0  // other CPUs and compilers, and nvcc's device pass
#endif

#if DILOCOX_QUANTIZE_AVX2
#include <immintrin.h>

#define DILOCOX_TARGET_AVX2 __attribute__((target("avx2,fma")))
// The helpers: inlined at every optimization level (at -O2 GCC leaves some as calls and
// their arrays in memory: int4 quantize in cache ran at half speed). Callable only from
// code compiled for AVX2, as the kernels below are. Sanitizer builds check behaviour, not
// speed: there the forced inlining would only cost compile time (about a third of a unit's).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define DILOCOX_AVX2_INLINE __attribute__((target("avx2,fma"))) inline
#else
#define DILOCOX_AVX2_INLINE __attribute__((target("avx2,fma"), always_inline)) inline
#endif
// Unrolls the next loop at every optimization level (at -O2 GCC leaves a fixed-count
// loop, and the array it fills, in memory). nvcc's front end knows no such pragma.
#if defined(__CUDACC__)
#define DILOCOX_UNROLL(n)
#else
#define DILOCOX_PRAGMA(x) _Pragma(#x)
#define DILOCOX_UNROLL(n) DILOCOX_PRAGMA(GCC unroll n)
#endif

namespace dilocox::detail::avx2 {

DILOCOX_AVX2_INLINE __m256i abs_bits(const float* x) {
  return _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)), _mm256_set1_epi32(0x7fffffff));
}

// |x| bits of x[0, len) folded into eight lanes: the largest lane is absmax_bits.
DILOCOX_AVX2_INLINE __m256i absmax_lanes(const float* x, std::size_t len) {
  __m256i m0 = _mm256_setzero_si256(), m1 = m0, m2 = m0, m3 = m0;
  std::size_t i = 0;
  for (; i + 32 <= len; i += 32) {
    m0 = _mm256_max_epu32(m0, abs_bits(x + i));
    m1 = _mm256_max_epu32(m1, abs_bits(x + i + 8));
    m2 = _mm256_max_epu32(m2, abs_bits(x + i + 16));
    m3 = _mm256_max_epu32(m3, abs_bits(x + i + 24));
  }
  for (; i + 8 <= len; i += 8) m0 = _mm256_max_epu32(m0, abs_bits(x + i));
  std::uint32_t tail = 0;
  for (; i < len; ++i) tail = std::max(tail, std::bit_cast<std::uint32_t>(x[i]) & 0x7fffffffU);
  m0 = _mm256_max_epu32(m0, _mm256_set1_epi32(static_cast<int>(tail)));
  return _mm256_max_epu32(_mm256_max_epu32(m0, m1), _mm256_max_epu32(m2, m3));
}

// Lane k of the result: the largest lane of m[k], k < 4 (a transpose folded with max).
DILOCOX_AVX2_INLINE __m128i max_of_each(const __m256i* m) {
  const __m256i m01 = _mm256_max_epu32(_mm256_unpacklo_epi32(m[0], m[1]), _mm256_unpackhi_epi32(m[0], m[1]));
  const __m256i m23 = _mm256_max_epu32(_mm256_unpacklo_epi32(m[2], m[3]), _mm256_unpackhi_epi32(m[2], m[3]));
  const __m256i h = _mm256_max_epu32(_mm256_unpacklo_epi64(m01, m23), _mm256_unpackhi_epi64(m01, m23));
  return _mm_max_epu32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

// Round-to-nearest-even of x * inv as int32. cvtps rounds as the 1.5 * 2^23 addition
// of round_nearest does (both under the current rounding mode, exact for |v| < 2^22;
// |x * inv| <= qmax (1 + 2^-21) since |x| <= absmax). So no clamp: the ratio rounds to
// at most qmax, as clamp_ratio then round_nearest do, for any block with a normal scale
// (a bf16 scale, rounded up, only lowers the ratio); blocks that divide go to the reference.
DILOCOX_AVX2_INLINE __m256i round_scaled(const float* x, __m256 inv) {
  return _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x), inv));
}

// mix32 of random.hpp, eight lanes.
DILOCOX_AVX2_INLINE __m256i mix32(__m256i x) {
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32(0x7feb352d));
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32(static_cast<int>(0x846ca68bU)));
  return _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
}

// Stochastic codes of eight elements: clamp_ratio(x * inv) then round_stochastic with
// u = bits_to_unit(counter_bits(key, i)); `h` holds i * 0x9e3779b9 + key per lane and
// moves on by eight elements. As in the reference, v is clamped before the addition
// and floor(v + u) after it (v + u rounds, and at v = qmax can reach qmax + 1), so the
// codes are in [-qmax, qmax].
template <int Bits>
DILOCOX_AVX2_INLINE __m256i round_stochastic8(const float* x, __m256 inv, __m256i& h) {
  constexpr float qmax = static_cast<float>(quant_max(Bits));
  __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x), inv);
  v = _mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps(-qmax)), _mm256_set1_ps(qmax));
  const __m256i bits = mix32(h);
  h = _mm256_add_epi32(h, _mm256_set1_epi32(static_cast<int>(8U * 0x9e3779b9U)));
  const __m256 u = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(bits, 8)), _mm256_set1_ps(0x1p-24f));
  // min(floor(v + u), qmax): what round_stochastic's truncation, correction and clamp compute.
  const __m256 q = _mm256_round_ps(_mm256_add_ps(v, u), _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  return _mm256_cvttps_epi32(_mm256_min_ps(q, _mm256_set1_ps(qmax)));
}

// Four int32 vectors of int4 codes (32 elements in order) as nibble-pair bytes in
// int16 lanes, in the order the packs leave them: lane 0 holds the pairs of elements
// 0-3, 8-11, 16-19, 24-27 and lane 1 those of 4-7, 12-15, ... (pairs stay whole).
// Codes are in [-7, 7] (round_scaled, round_stochastic8).
DILOCOX_AVX2_INLINE __m256i nibble_pairs(__m256i a, __m256i b, __m256i c, __m256i d) {
  __m256i q = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
  q = _mm256_add_epi8(q, _mm256_set1_epi8(8));
  return _mm256_maddubs_epi16(q, _mm256_set1_epi16(0x1001));  // c[2j] + 16 c[2j + 1]
}

// The bytes of nibble_pairs w0 (elements 0-31) then w1 (32-63) in element order.
DILOCOX_AVX2_INLINE __m256i ordered_nibbles(__m256i w0, __m256i w1) {
  // As 16-bit units (four elements each), lane 0 of the packed bytes holds units
  // 0, 2, 4, ..., 14 and lane 1 units 1, 3, ..., 15: bring the halves together, then
  // interleave the units inside each lane.
  const __m256i halves = _mm256_permute4x64_epi64(_mm256_packus_epi16(w0, w1), 0xd8);
  const __m256i order = _mm256_setr_epi8(0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15,  //
                                         0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15);
  return _mm256_shuffle_epi8(halves, order);
}

// Stores the int4 codes of 64 elements (eight int32 vectors in element order): 32 bytes.
DILOCOX_AVX2_INLINE void store_codes64(const __m256i* v, std::byte* dst) {
  const __m256i w0 = nibble_pairs(v[0], v[1], v[2], v[3]);
  const __m256i w1 = nibble_pairs(v[4], v[5], v[6], v[7]);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), ordered_nibbles(w0, w1));
}

// Stores the codes of 32 elements (int32 lanes a, b, c, d in element order), each in
// [-qmax, qmax].
template <int Bits>
DILOCOX_AVX2_INLINE void store_codes32(__m256i a, __m256i b, __m256i c, __m256i d, std::byte* dst) {
  if constexpr (Bits == 4) {
    const __m256i w = nibble_pairs(a, b, c, d);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm256_castsi256_si128(ordered_nibbles(w, w)));
  } else {
    const __m256i ab = _mm256_packs_epi32(a, b), cd = _mm256_packs_epi32(c, d);  // int16: a0-3 b0-3 | a4-7 b4-7
    __m256i q = _mm256_packs_epi16(ab, cd);
    q = _mm256_permutevar8x32_epi32(q, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));  // element order
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), q);
  }
}

// store_codes32 for 8 elements (8 bytes of int8, 4 bytes of int4).
template <int Bits>
DILOCOX_AVX2_INLINE void store_codes8(__m256i a, std::byte* dst) {
  __m128i q = _mm_packs_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));  // int16
  q = _mm_packs_epi16(q, q);
  if constexpr (Bits == 8) {
    _mm_storel_epi64(reinterpret_cast<__m128i*>(dst), q);
  } else {
    q = _mm_add_epi8(q, _mm_set1_epi8(8));
    const __m128i w = _mm_maddubs_epi16(q, _mm_set1_epi16(0x1001));
    const auto four = static_cast<std::uint32_t>(_mm_cvtsi128_si32(_mm_packus_epi16(w, w)));
    std::memcpy(dst, &four, 4);
  }
}

// The int32 codes of x[0, 8): h as for round_stochastic8, unused for nearest.
template <int Bits, bool Stochastic>
DILOCOX_AVX2_INLINE __m256i codes8(const float* x, __m256 inv, __m256i& h) {
  if constexpr (Stochastic) return round_stochastic8<Bits>(x, inv, h);
  (void)h;
  return round_scaled(x, inv);
}

// The codes of x[0, m) for the largest m <= len that is a multiple of 8 (m is
// returned); `index` is the element index of x[0] and `key` its counter_key
// (stochastic rounding only).
template <int Bits, bool Stochastic>
DILOCOX_AVX2_INLINE std::size_t quantize_codes(const float* x, std::size_t len, float inv, std::uint64_t index,
                                               std::uint32_t key, std::byte* codes) {
  constexpr std::size_t per_byte = Bits == 8 ? 1 : 2;
  const __m256 s = _mm256_set1_ps(inv);
  __m256i h = _mm256_setzero_si256();
  if constexpr (Stochastic) {  // counter_bits' i * 0x9e3779b9 + key for i = index + lane
    const __m256i i0 =
        _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(index)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    h = _mm256_add_epi32(_mm256_mullo_epi32(i0, _mm256_set1_epi32(static_cast<int>(0x9e3779b9U))),
                         _mm256_set1_epi32(static_cast<int>(key)));
  }
  std::size_t i = 0;
  if constexpr (Bits == 4) {
    for (; i + 64 <= len; i += 64) {
      __m256i v[8];
      DILOCOX_UNROLL(8)
      for (int k = 0; k < 8; ++k) v[k] = codes8<Bits, Stochastic>(x + i + 8 * k, s, h);
      store_codes64(v, codes + i / 2);
    }
  }
  for (; i + 32 <= len; i += 32) {
    const __m256i a = codes8<Bits, Stochastic>(x + i, s, h), b = codes8<Bits, Stochastic>(x + i + 8, s, h);
    const __m256i c = codes8<Bits, Stochastic>(x + i + 16, s, h), d = codes8<Bits, Stochastic>(x + i + 24, s, h);
    store_codes32<Bits>(a, b, c, d, codes + i / per_byte);
  }
  for (; i + 8 <= len; i += 8)
    store_codes8<Bits>(codes8<Bits, Stochastic>(x + i, s, h), codes + i / per_byte);
  return i;
}

// The scales of up to four consecutive blocks, found together: block_scale and
// block_ratio of quantize.hpp in four lanes (the same IEEE divisions).
struct GroupScales {
  static constexpr std::size_t blocks = 4;
  alignas(16) float inv[blocks];    // block_ratio(scale).inv
  alignas(16) float scale[blocks];  // as stored
  unsigned divide = 0;              // bit k: block k's scale is subnormal (it divides)
  BlockRatio ratio(std::size_t k) const { return {inv[k], scale[k], ((divide >> k) & 1U) != 0}; }
};

// Scales of blocks [first, first + count), count <= 4, stored into `scales_out` (the
// first one's slot); throws Error naming the first NaN/Inf element among them.
// Block: the block size when known at compile time and every block is whole, else 0.
// Inlined (GCC leaves it a call otherwise, which costs ~20% of a 4 KiB quantize).
template <int Bits, std::size_t Block>
DILOCOX_AVX2_INLINE void scale_group(std::span<const float> in, std::size_t block, std::size_t first,
                                     std::size_t count, ScaleFormat f, std::byte* scales_out, GroupScales& g) {
  __m256i lanes[GroupScales::blocks];
  DILOCOX_UNROLL(4)
  for (std::size_t k = 0; k < GroupScales::blocks; ++k) {
    const std::size_t base = (first + k) * block, len = Block != 0 ? Block : std::min(block, in.size() - base);
    lanes[k] = k < count ? absmax_lanes(in.data() + base, len) : _mm256_setzero_si256();
  }
  const __m128i m = max_of_each(lanes);
  const int bad = _mm_movemask_ps(_mm_castsi128_ps(_mm_cmpgt_epi32(m, _mm_set1_epi32(0x7f7fffff))));
  if (bad != 0) {
    const std::size_t base = (first + static_cast<std::size_t>(std::countr_zero(static_cast<unsigned>(bad)))) * block;
    throw_nonfinite(in.data() + base, std::min(block, in.size() - base), base);
  }
  __m128 s = _mm_div_ps(_mm_castsi128_ps(m), _mm_set1_ps(static_cast<float>(quant_max(Bits))));
  __m128i u = _mm_castps_si128(s);
  if (f == ScaleFormat::bf16) {  // round up to bf16 where any of the low 16 bits is set
    const __m128i exact = _mm_cmpeq_epi32(_mm_and_si128(u, _mm_set1_epi32(0xffff)), _mm_setzero_si128());
    const __m128i up = _mm_add_epi32(_mm_and_si128(u, _mm_set1_epi32(static_cast<int>(0xffff0000U))),
                                     _mm_set1_epi32(0x10000));
    u = _mm_blendv_epi8(up, u, exact);
    s = _mm_castsi128_ps(u);
  }
  const __m128 tiny = _mm_cmplt_ps(s, _mm_set1_ps(0x1p-126f));  // zero or subnormal
  _mm_store_ps(g.inv, _mm_andnot_ps(tiny, _mm_div_ps(_mm_set1_ps(1.0f), s)));
  _mm_store_ps(g.scale, s);
  g.divide = static_cast<unsigned>(_mm_movemask_ps(_mm_and_ps(tiny, _mm_cmpneq_ps(s, _mm_setzero_ps()))));
  if (f == ScaleFormat::bf16) u = _mm_packus_epi32(_mm_srli_epi32(u, 16), u);  // four bf16 first
  alignas(16) std::uint8_t stored[16];  // (4) fp32 or (4) bf16 scales
  _mm_store_si128(reinterpret_cast<__m128i*>(stored), u);
  if (count == GroupScales::blocks) {  // a whole group: a fixed-size copy the compiler inlines
    f == ScaleFormat::fp32 ? std::memcpy(scales_out, stored, 16) : std::memcpy(scales_out, stored, 8);
  } else {
    std::memcpy(scales_out, stored, count * scale_bytes(f));
  }
}

// Blocks [begin, end) of quantize_all. Scales go four blocks at a time, one group
// ahead of the codes, so that their divisions overlap other work, and the group after
// that is prefetched. Blocks with a subnormal scale (they divide) and stochastic blocks
// that straddle a 2^32 index boundary (two RNG keys) go to the reference's
// quantize_block whole, and every block's last len % 8 elements too. nb: the number of blocks; Block: as for scale_group.
template <int Bits, bool Stochastic, std::size_t Block>
DILOCOX_TARGET_AVX2 void quantize_blocks(std::span<const float> in, std::byte* out, const QuantConfig& c,
                                         std::size_t nb, std::size_t begin, std::size_t end) {
  constexpr std::size_t group = GroupScales::blocks;
  const std::size_t sb = scale_bytes(c.scale), block = Block != 0 ? Block : c.block;
  std::byte* codes = out + nb * sb;
  GroupScales groups[2];  // this group's, the next one's
  if (begin < end)
    scale_group<Bits, Block>(in, block, begin, std::min(end - begin, group), c.scale, out + begin * sb, groups[0]);
  for (std::size_t first = begin; first < end; first += group) {
    const GroupScales& g = groups[((first - begin) / group) % 2];
    if (first + 2 * group < end) {  // the group after next: without it a stream from memory loses ~25%
      const std::size_t from = (first + 2 * group) * block;
      const char* ahead = reinterpret_cast<const char*>(in.data() + from);
      const std::size_t bytes = std::min(group * block, in.size() - from) * sizeof(float);
      for (std::size_t o = 0; o < bytes; o += 64) _mm_prefetch(ahead + o, _MM_HINT_T0);
    }
    if (first + group < end)
      scale_group<Bits, Block>(in, block, first + group, std::min(end - first - group, group), c.scale,
                               out + (first + group) * sb, groups[((first - begin) / group + 1) % 2]);
    for (std::size_t k = 0; k < group && first + k < end; ++k) {
      const std::size_t base = (first + k) * block, len = Block != 0 ? Block : std::min(block, in.size() - base);
      const float* x = in.data() + base;  // (len) host, any alignment
      std::byte* dst = codes + code_bytes(base, Bits);
      const BlockRatio r = g.ratio(k);
      const bool one_key = (base >> 32) == ((base + len) >> 32);
      std::size_t done = 0;
      if (!r.divide && (!Stochastic || one_key))
        done = quantize_codes<Bits, Stochastic>(x, len, r.inv, base, Stochastic ? counter_key(c.seed, base) : 0, dst);
      if (done < len)
        detail::quantize_block<Bits, Stochastic>(x + done, len - done, base + done, r, c.seed,
                                                 dst + code_bytes(done, Bits));
    }
  }
}

// n / block, with a shift for the usual power-of-two blocks: a 64-bit division costs
// a few percent of a 4 KiB quantize.
inline std::size_t whole_blocks(std::size_t n, std::size_t block) {
  return std::has_single_bit(block) ? n >> std::countr_zero(block) : n / block;
}

// quantize_all of quantize.hpp: the whole blocks of the common sizes with the size
// known to the compiler (straight-line loops), the rest with any size.
template <int Bits, bool Stochastic>
DILOCOX_TARGET_AVX2 void quantize_all(std::span<const float> in, std::byte* out, const QuantConfig& c) {
  std::size_t whole = whole_blocks(in.size(), c.block);
  const std::size_t nb = whole + (whole * c.block < in.size() ? 1 : 0);
  switch (c.block) {
    case 32: quantize_blocks<Bits, Stochastic, 32>(in, out, c, nb, 0, whole); break;
    case 64: quantize_blocks<Bits, Stochastic, 64>(in, out, c, nb, 0, whole); break;
    case 128: quantize_blocks<Bits, Stochastic, 128>(in, out, c, nb, 0, whole); break;
    case 256: quantize_blocks<Bits, Stochastic, 256>(in, out, c, nb, 0, whole); break;
    default: whole = 0;
  }
  if (whole < nb) quantize_blocks<Bits, Stochastic, 0>(in, out, c, nb, whole, nb);
}

// y[0, 8) = q * s, or y += q * s fused (one rounding).
template <bool Accumulate>
DILOCOX_AVX2_INLINE void put8(float* y, __m256i q, __m256 s) {
  const __m256 v = _mm256_cvtepi32_ps(q);
  if constexpr (Accumulate) _mm256_storeu_ps(y, _mm256_fmadd_ps(v, s, _mm256_loadu_ps(y)));
  else _mm256_storeu_ps(y, _mm256_mul_ps(v, s));
}

template <bool Accumulate>
DILOCOX_AVX2_INLINE void put1(float* y, int q, float s) {
  if constexpr (Accumulate) *y = std::fma(static_cast<float>(q), s, *y);
  else *y = static_cast<float>(q) * s;
}

// Eight int8 codes as int32 lanes.
DILOCOX_AVX2_INLINE __m256i widen8(const std::uint8_t* q) {
  return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q)));
}

// Int4 codes of elements 8K..8K+7 as int32 lanes, from `b`: the 16 code bytes of 32
// elements in both 128-bit lanes, xor 0x88. Each lane takes its element's byte, shifts
// the element's nibble to the top and back down arithmetically: (c ^ 8) read as a
// signed nibble is c - 8.
template <int K>
DILOCOX_AVX2_INLINE __m256i widen_nibbles8(__m256i b) {
  constexpr char z = -1, b0 = 4 * K, b1 = 4 * K + 1, b2 = 4 * K + 2, b3 = 4 * K + 3;
  const __m256i pick = _mm256_setr_epi8(b0, z, z, z, b0, z, z, z, b1, z, z, z, b1, z, z, z,  //
                                        b2, z, z, z, b2, z, z, z, b3, z, z, z, b3, z, z, z);
  const __m256i up = _mm256_setr_epi32(28, 24, 28, 24, 28, 24, 28, 24);  // low nibble, high nibble
  return _mm256_srai_epi32(_mm256_sllv_epi32(_mm256_shuffle_epi8(b, pick), up), 28);
}

// One block of `len` elements: codes q (int8, or int4 pairs) times scale s into y.
template <int Bits, bool Accumulate>
DILOCOX_AVX2_INLINE void dequantize_block(const std::uint8_t* q, std::size_t len, float s, float* y) {
  const __m256 sv = _mm256_set1_ps(s);
  std::size_t i = 0;
  if constexpr (Bits == 8) {
    for (; i + 32 <= len; i += 32) {
      put8<Accumulate>(y + i, widen8(q + i), sv);
      put8<Accumulate>(y + i + 8, widen8(q + i + 8), sv);
      put8<Accumulate>(y + i + 16, widen8(q + i + 16), sv);
      put8<Accumulate>(y + i + 24, widen8(q + i + 24), sv);
    }
    for (; i + 8 <= len; i += 8) put8<Accumulate>(y + i, widen8(q + i), sv);
    for (; i < len; ++i) put1<Accumulate>(y + i, static_cast<std::int8_t>(q[i]), s);
  } else {
    const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x88));
    for (; i + 32 <= len; i += 32) {
      const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + i / 2));
      const __m256i b = _mm256_xor_si256(_mm256_broadcastsi128_si256(bytes), flip);
      put8<Accumulate>(y + i, widen_nibbles8<0>(b), sv);
      put8<Accumulate>(y + i + 8, widen_nibbles8<1>(b), sv);
      put8<Accumulate>(y + i + 16, widen_nibbles8<2>(b), sv);
      put8<Accumulate>(y + i + 24, widen_nibbles8<3>(b), sv);
    }
    for (; i + 8 <= len; i += 8) {
      std::uint32_t four;
      std::memcpy(&four, q + i / 2, 4);
      put8<Accumulate>(y + i, widen_nibbles8<0>(_mm256_set1_epi32(static_cast<int>(four ^ 0x88888888U))), sv);
    }
    for (; i + 1 < len; i += 2) {  // i is even: a whole byte
      put1<Accumulate>(y + i, (q[i / 2] & 0xf) - 8, s);
      put1<Accumulate>(y + i + 1, (q[i / 2] >> 4) - 8, s);
    }
    if (i < len) put1<Accumulate>(y + i, (q[i / 2] & 0xf) - 8, s);
  }
}

// Blocks [begin, end) of dequantize_all; nb and Block as for quantize_blocks.
template <int Bits, bool Accumulate, std::size_t Block>
DILOCOX_TARGET_AVX2 void dequantize_blocks(std::span<const std::byte> in, std::span<float> out, const QuantConfig& c,
                                           std::size_t nb, std::size_t begin, std::size_t end) {
  const std::size_t n = out.size(), sb = scale_bytes(c.scale), block = Block != 0 ? Block : c.block;
  const std::byte* codes = in.data() + nb * sb;
  for (std::size_t b = begin; b < end; ++b) {
    const std::size_t base = b * block, len = Block != 0 ? Block : std::min(block, n - base);
    const auto* q = reinterpret_cast<const std::uint8_t*>(codes + code_bytes(base, Bits));
    dequantize_block<Bits, Accumulate>(q, len, load_scale(in.data() + b * sb, c.scale), out.data() + base);
  }
}

// dequantize_all of quantize.hpp, with the common block sizes known to the compiler.
template <int Bits, bool Accumulate>
DILOCOX_TARGET_AVX2 void dequantize_all(std::span<const std::byte> in, std::span<float> out, const QuantConfig& c) {
  std::size_t whole = whole_blocks(out.size(), c.block);
  const std::size_t nb = whole + (whole * c.block < out.size() ? 1 : 0);
  switch (c.block) {
    case 32: dequantize_blocks<Bits, Accumulate, 32>(in, out, c, nb, 0, whole); break;
    case 64: dequantize_blocks<Bits, Accumulate, 64>(in, out, c, nb, 0, whole); break;
    case 128: dequantize_blocks<Bits, Accumulate, 128>(in, out, c, nb, 0, whole); break;
    case 256: dequantize_blocks<Bits, Accumulate, 256>(in, out, c, nb, 0, whole); break;
    default: whole = 0;
  }
  if (whole < nb) dequantize_blocks<Bits, Accumulate, 0>(in, out, c, nb, whole, nb);
}

}  // namespace dilocox::detail::avx2

#undef DILOCOX_TARGET_AVX2
#undef DILOCOX_AVX2_INLINE
#undef DILOCOX_UNROLL
#undef DILOCOX_PRAGMA
#endif  // DILOCOX_QUANTIZE_AVX2
