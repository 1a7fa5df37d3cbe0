// dilocox/sparse_code.hpp: SparseLoCo's tiled top-k code for one tensor, as the
// reference (tplr-ai/templar, compress.py) defines it. The tensor, as the matrix
// (rows, cols) of matrix_shape, is cut into tiles of h x w, h and w the largest divisors
// of rows and cols that are <= `tile` (64): a vector (n) is (1, n), runs of w. Each tile
// keeps its `k` largest magnitudes (k clamped to the tile, made even); the kept values
// of the whole tensor share one 2-bit codebook of 4 bins: shift = their mean, step =
// 6 sigma / 4, bin = round((v - shift) / step + 2) clamped to [0, 3], each bin decoding to
// shift + the mean of its members less the shift. Body of `encode_tiled` (little-endian, bit streams LSB first):
//   [f32 shift] [f32 bin means less the shift, 4] [indices: 12 bits each, per tile ascending, tiles
//   row-major] [bins: 2 bits each, same order]
// Standard library only. Not here: choosing what to keep (compress/sparse.hpp).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "dilocox/config.hpp"
#include "dilocox/tensor.hpp"

namespace dilocox {

inline constexpr std::size_t max_sparse_tile = 64;  // 64 x 64 = 4096 positions: 12-bit indices
inline constexpr int sparse_index_bits = 12;
inline constexpr int sparse_bins = 4;               // 2-bit values
inline constexpr std::size_t tiled_params_bytes = 4 * (1 + sparse_bins);

struct TiledCode {
  std::size_t tile = 64;  // largest tile side (reference: target_chunk 64)
  std::uint32_t k = 64;   // kept per tile before clamping
  float range_sigmas = 6; // the codebook spans this many standard deviations
  friend bool operator==(const TiledCode&, const TiledCode&) = default;
};

inline void validate(const TiledCode& c) {
  detail::require(c.tile >= 1 && c.tile <= max_sparse_tile, "TiledCode",
                  "tile must be in [1, 64] (12-bit indices), got " + std::to_string(c.tile));
  detail::require(c.k >= 1 && c.k <= max_sparse_tile * max_sparse_tile, "TiledCode",
                  "k must be in [1, 4096], got " + std::to_string(c.k));
  detail::require(std::isfinite(c.range_sigmas) && c.range_sigmas > 0, "TiledCode", "range_sigmas must be > 0");
}

// The largest divisor of n that is <= cap (1 for n = 0).
inline std::size_t largest_divisor_at_most(std::size_t n, std::size_t cap) {
  for (std::size_t d = std::min(n, cap); d > 1; --d)
    if (n % d == 0) return d;
  return 1;
}

// How a tensor of this shape is tiled under code c.
struct TileGrid {
  std::size_t rows, cols;  // the tensor as a matrix
  std::size_t h, w;        // tile sides
  std::size_t kept;        // entries kept per tile
  std::size_t tiles() const { return h && w ? (rows / h) * (cols / w) : 0; }
  std::size_t total_kept() const { return tiles() * kept; }
  // Flat position (row-major in the tensor) of position p of tile t.
  std::size_t position(std::size_t t, std::size_t p) const {
    const std::size_t per_row = cols / w, ty = t / per_row, tx = t % per_row;
    return (ty * h + p / w) * cols + tx * w + p % w;
  }
};

inline TileGrid tile_grid(const Shape& shape, const TiledCode& c) {
  auto [rows, cols] = matrix_shape(shape);
  if (shape.ndim == 1) rows = 1, cols = shape.dims[0];  // a vector is one row of runs
  TileGrid g{rows, cols, largest_divisor_at_most(rows, c.tile), largest_divisor_at_most(cols, c.tile), 0};
  const std::size_t t = g.h * g.w;
  // As the reference: min(k, tile), at least 2, even (indices pack in pairs); a tile
  // of one element keeps it.
  std::size_t k = std::min<std::size_t>(c.k, t);
  k = std::max<std::size_t>(k, 2);
  k -= k % 2;
  g.kept = t == 1 ? 1 : k;
  return g;
}

inline std::size_t tiled_encoded_size(const Shape& shape, const TiledCode& c) {
  validate(c);
  const std::size_t n = shape.numel() ? tile_grid(shape, c).total_kept() : 0;
  return tiled_params_bytes + (n * sparse_index_bits + 7) / 8 + (n * 2 + 7) / 8;
}

namespace detail {

// A little-endian bit stream over bytes (writes assume zeroed storage).
struct BitWriter {
  std::byte* out;
  std::size_t bit = 0;
  void put(std::uint32_t v, int bits) {
    for (int b = 0; b < bits; ++b, ++bit)
      if ((v >> b) & 1U) out[bit / 8] |= std::byte{static_cast<unsigned char>(1U << (bit % 8))};
  }
};
struct BitReader {
  const std::byte* in;
  std::size_t bit = 0;
  std::uint32_t get(int bits) {
    std::uint32_t v = 0;
    for (int b = 0; b < bits; ++b, ++bit)
      v |= static_cast<std::uint32_t>((std::to_integer<unsigned>(in[bit / 8]) >> (bit % 8)) & 1U) << b;
    return v;
  }
};

struct TiledLayout {  // the body's sections
  TileGrid grid;
  std::size_t kept, index_at, bin_at;
  TiledLayout(const Shape& shape, const TiledCode& c)
      : grid(tile_grid(shape, c)), kept(shape.numel() ? grid.total_kept() : 0) {
    index_at = tiled_params_bytes;
    bin_at = index_at + (kept * sparse_index_bits + 7) / 8;
  }
};

inline float load_f32(const std::byte* p) {
  float f;
  std::memcpy(&f, p, 4);
  return f;
}

}  // namespace detail

// The 2-bit codebook of a tensor's kept values: shift, the step between bins, and each
// bin's mean of its members less the shift (0 for an empty bin); a bin decodes to
// shift + value[bin].
struct TiledCodebook {
  float shift = 0, step = 1;
  std::array<float, sparse_bins> value{};
  float decode(int b) const { return shift + value[static_cast<std::size_t>(b)]; }
  int bin(float v) const {  // round half to even, as the reference's round()
    const float q = std::nearbyint((v - shift) / step + static_cast<float>(sparse_bins / 2));
    return static_cast<int>(std::clamp(q, 0.0f, static_cast<float>(sparse_bins - 1)));
  }
};

inline TiledCodebook make_codebook(std::span<const float> kept, float range_sigmas) {
  TiledCodebook cb;
  const std::size_t n = kept.size();
  double sum = 0;
  for (float v : kept) sum += v;
  cb.shift = n ? static_cast<float>(sum / static_cast<double>(n)) : 0.0f;
  double ss = 0;
  for (float v : kept) ss += static_cast<double>(v - cb.shift) * static_cast<double>(v - cb.shift);
  // sigma with Bessel's correction; a degenerate step (one value, all equal) is 1.
  const float step = n > 1 ? static_cast<float>(range_sigmas * std::sqrt(ss / static_cast<double>(n - 1)) / sparse_bins)
                           : 0.0f;
  cb.step = std::isfinite(step) && step > 0 ? step : 1.0f;
  std::array<double, sparse_bins> members{}, count{};
  for (float v : kept) {
    const int b = cb.bin(v);
    members[static_cast<std::size_t>(b)] += v - cb.shift;
    count[static_cast<std::size_t>(b)] += 1;
  }
  for (std::size_t b = 0; b < sparse_bins; ++b)
    cb.value[b] = count[b] > 0 ? static_cast<float>(members[b] / count[b]) : 0.0f;
  return cb;
}

// Encodes the entries of x (a tensor of `shape`) given by `picked` (per tile, ascending
// positions inside the tile, grid.kept of them, tiles in order) into out
// (tiled_encoded_size bytes). Throws Error on NaN/Inf among the picked values or a bad
// `picked`.
inline void encode_tiled(std::span<const float> x, const Shape& shape, std::span<const std::uint32_t> picked,
                         const TiledCode& c, std::span<std::byte> out) {
  validate(c);
  const detail::TiledLayout l(shape, c);
  const std::size_t size = tiled_encoded_size(shape, c), tile = l.grid.h * l.grid.w;
  detail::require(x.size() == shape.numel(), "encode_tiled", "x does not have the shape's element count");
  detail::require(out.size() >= size, "encode_tiled", "output buffer too short");
  detail::require(picked.size() == l.kept, "encode_tiled",
                  std::to_string(picked.size()) + " positions given, the code keeps " + std::to_string(l.kept));
  thread_local std::vector<float> kept;  // (kept) the picked values, in order
  kept.resize(l.kept);
  for (std::size_t i = 0; i < l.kept; ++i) {
    const std::size_t t = i / l.grid.kept, slot = i % l.grid.kept;
    detail::require(picked[i] < tile && (slot == 0 || picked[i] > picked[i - 1]), "encode_tiled",
                    "tile " + std::to_string(t) + ": positions must ascend within the tile");
    kept[i] = x[l.grid.position(t, picked[i])];
    detail::require(std::isfinite(kept[i]), "encode_tiled",
                    "element " + std::to_string(l.grid.position(t, picked[i])) + " is not finite");
  }
  const TiledCodebook cb = make_codebook(kept, c.range_sigmas);
  std::fill(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(size), std::byte{0});
  std::memcpy(out.data(), &cb.shift, 4);
  std::memcpy(out.data() + 4, cb.value.data(), 4 * sparse_bins);
  detail::BitWriter idx{out.data() + l.index_at}, bins{out.data() + l.bin_at};
  for (std::size_t i = 0; i < l.kept; ++i) {
    idx.put(picked[i], sparse_index_bits);
    bins.put(static_cast<std::uint32_t>(cb.bin(kept[i])), 2);
  }
}

// Throws Error unless the body is a valid code for `shape`: finite codebook, every
// tile's indices ascending inside the tile.
inline void check_tiled(std::span<const std::byte> in, const Shape& shape, const TiledCode& c) {
  const detail::TiledLayout l(shape, c);
  detail::require(in.size() >= tiled_encoded_size(shape, c), "tiled code", "input too short");
  for (std::size_t b = 0; b <= sparse_bins; ++b)
    detail::require(std::isfinite(detail::load_f32(in.data() + 4 * b)), "tiled code", "codebook value not finite");
  detail::BitReader idx{in.data() + l.index_at};
  const std::size_t tile = l.grid.h * l.grid.w;
  std::uint32_t prev = 0;
  for (std::size_t i = 0; i < l.kept; ++i) {
    const std::uint32_t p = idx.get(sparse_index_bits);
    detail::require(p < tile && (i % l.grid.kept == 0 || p > prev), "tiled code",
                    "tile " + std::to_string(i / l.grid.kept) + ": index " + std::to_string(p) +
                        " out of order or range");
    prev = p;
  }
}

// f(position, value) for each kept entry of a payload, in wire order. Throws Error when
// an index is out of its tile or not ascending.
template <class F>
void visit_tiled(std::span<const std::byte> in, const Shape& shape, const TiledCode& c, F&& f) {
  check_tiled(in, shape, c);
  const detail::TiledLayout l(shape, c);
  TiledCodebook cb;
  std::memcpy(&cb.shift, in.data(), 4);
  std::memcpy(cb.value.data(), in.data() + 4, 4 * sparse_bins);
  detail::BitReader idx{in.data() + l.index_at}, bins{in.data() + l.bin_at};
  for (std::size_t i = 0; i < l.kept; ++i) {
    const std::uint32_t p = idx.get(sparse_index_bits), b = bins.get(2);
    f(l.grid.position(i / l.grid.kept, p), cb.decode(static_cast<int>(b)));
  }
}

// out (the tensor, shape.numel() floats) += the values the code carries.
inline void decode_tiled_add(std::span<const std::byte> in, const Shape& shape, const TiledCode& c,
                             std::span<float> out) {
  detail::require(out.size() == shape.numel(), "decode_tiled_add", "output does not have the shape's element count");
  visit_tiled(in, shape, c, [&](std::size_t p, float v) { out[p] += v; });
}

}  // namespace dilocox
