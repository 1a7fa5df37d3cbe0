// powersgd_ours: the dilocox side of bench/powersgd_vs_torch.py. Reads a row-major
// float32 matrix, runs `iters` warm-started rank-r approximations (P = X Q,
// orthonormalize, Q = X^T P, X_hat = P Q^T: what powerSGD_hook computes on one rank)
// and prints one JSON line: relative error after the last call and the median time
// of the calls after the first.
//   powersgd_ours FILE ROWS COLS RANK ITERS [SEED]
#include <dilocox/lowrank.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <vector>

namespace dx = dilocox;
using RowM = dx::PowerIterationProjector::RowMatrix;

int main(int argc, char** argv) {
  if (argc != 6 && argc != 7) {
    std::fprintf(stderr, "usage: powersgd_ours FILE ROWS COLS RANK ITERS [SEED]\n");
    return 2;
  }
  const long m = std::atol(argv[2]), n = std::atol(argv[3]);
  const int r = std::atoi(argv[4]), iters = std::atoi(argv[5]);
  const std::uint64_t seed = argc == 7 ? std::strtoull(argv[6], nullptr, 10) : 0;
  if (m <= 0 || n <= 0 || r <= 0 || iters < 2) {
    std::fprintf(stderr, "powersgd_ours: ROWS, COLS, RANK must be > 0 and ITERS >= 2\n");
    return 2;
  }
  RowM x(m, n), out(m, n);
  std::ifstream f(argv[1], std::ios::binary);
  if (!f.read(reinterpret_cast<char*>(x.data()), static_cast<std::streamsize>(x.size() * 4))) {
    std::fprintf(stderr, "powersgd_ours: cannot read %ld x %ld floats from %s\n", m, n, argv[1]);
    return 1;
  }
  try {
    dx::PowerIterationProjector proj(static_cast<std::size_t>(m), static_cast<std::size_t>(n), {.rank = r, .seed = seed});
    std::vector<double> seconds;
    for (int i = 0; i < iters; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      proj.approximate({x.data(), static_cast<std::size_t>(m), static_cast<std::size_t>(n)},
                       {out.data(), static_cast<std::size_t>(m), static_cast<std::size_t>(n)});
      seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::vector<double> later(seconds.begin() + 1, seconds.end());
    std::nth_element(later.begin(), later.begin() + static_cast<long>(later.size() / 2), later.end());
    const double err = (x - out).norm() / x.norm();
    std::printf("{\"error\": %.8g, \"median_seconds\": %.6g}\n", err, later[later.size() / 2]);
  } catch (const dx::Error& e) {
    std::fprintf(stderr, "powersgd_ours: %s\n", e.what());
    return 1;
  }
  return 0;
}
