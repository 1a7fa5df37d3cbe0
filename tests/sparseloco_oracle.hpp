// Test oracle: SparseLoCo's compressor as its reference (tplr-ai/templar, compress.py
// and neurons.py) describes it, restated plainly in double precision for the tests to
// compare the library against. One tensor, one replica, one round:
//   tiles: sides are the largest divisors <= 64 of rows and cols (a vector: one row);
//   per tile, the k largest |values| (k clamped to the tile, at least 2, even);
//   the kept values of the tensor: shift = mean, step = 6 sigma / 4 (sigma with n - 1),
//   bin = round-half-even((v - shift) / step + 2) clamped to [0, 3],
//   decoded = shift + the mean of (member - shift) over the bin.
// The one case the reference cannot run (a tile of one element: top-2 of 1) keeps it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace oracle {

inline std::size_t tile_side(std::size_t n) {
  for (std::size_t d = 64; d > 1; --d)
    if (d <= n && n % d == 0) return d;
  return 1;
}

struct SparseLoCoRound {
  std::vector<std::size_t> kept;  // flat positions, ascending
  std::vector<double> decoded;    // dense, zeros where nothing was kept
};

// x is the tensor as a (rows, cols) matrix, row-major.
inline SparseLoCoRound sparseloco_round(const std::vector<float>& x, std::size_t rows, std::size_t cols,
                                        std::size_t k) {
  const std::size_t h = tile_side(rows), w = tile_side(cols);
  std::size_t keep = std::min(k, h * w);
  if (keep < 2) keep = 2;
  keep -= keep % 2;
  if (h * w == 1) keep = 1;
  SparseLoCoRound out;
  for (std::size_t r0 = 0; r0 < rows; r0 += h)
    for (std::size_t c0 = 0; c0 < cols; c0 += w) {
      std::vector<std::size_t> members;  // tile order: row by row
      for (std::size_t r = r0; r < r0 + h; ++r)
        for (std::size_t c = c0; c < c0 + w; ++c) members.push_back(r * cols + c);
      std::stable_sort(members.begin(), members.end(),
                       [&](std::size_t a, std::size_t b) { return std::fabs(x[a]) > std::fabs(x[b]); });
      out.kept.insert(out.kept.end(), members.begin(), members.begin() + static_cast<long>(keep));
    }
  std::sort(out.kept.begin(), out.kept.end());
  const double n = static_cast<double>(out.kept.size());
  double shift = 0;
  for (std::size_t p : out.kept) shift += x[p];
  shift /= n;
  double ss = 0;
  for (std::size_t p : out.kept) ss += (x[p] - shift) * (x[p] - shift);
  double step = n > 1 ? 6.0 * std::sqrt(ss / (n - 1)) / 4.0 : 0.0;
  if (!(step > 0) || !std::isfinite(step)) step = 1.0;
  auto bin = [&](double v) {
    const double q = std::nearbyint((v - shift) / step + 2.0);
    return static_cast<int>(std::clamp(q, 0.0, 3.0));
  };
  double sum[4] = {0, 0, 0, 0}, count[4] = {0, 0, 0, 0};
  for (std::size_t p : out.kept) sum[bin(x[p])] += x[p] - shift, count[bin(x[p])] += 1;
  out.decoded.assign(x.size(), 0.0);
  for (std::size_t p : out.kept) {
    const int b = bin(x[p]);
    out.decoded[p] = shift + sum[b] / count[b];
  }
  return out;
}

}  // namespace oracle
