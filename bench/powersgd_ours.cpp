// powersgd_ours: the dilocox side of bench/powersgd_vs_torch.py. Reads a row-major
// float32 matrix, runs `iters` warm-started rank-r PowerIterationProjector::approximate
// calls (one sweep over X, then X_hat = P Q^T: what powerSGD_hook computes on one rank)
// and, interleaved, the two-phase path (left, orthonormalize_left, right, reconstruct);
// prints one JSON line: relative errors after the last call, median CPU and wall time
// of the calls after the first. `--info`: the BLAS library, SIMD and threads used.
//   powersgd_ours FILE ROWS COLS RANK ITERS [SEED]  |  powersgd_ours --info
#include <dilocox/lowrank.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <string>
#include <vector>

namespace dx = dilocox;
using RowM = dx::PowerIterationProjector::RowMatrix;

namespace {

// The first mapped library whose name contains "blas" (none unless built with
// EIGEN_USE_BLAS), so that the script can refuse a reference BLAS on this side too.
std::string mapped_blas() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    const auto slash = line.find('/');
    if (slash == std::string::npos) continue;
    const std::string path = line.substr(slash);
    const std::string name = path.substr(path.rfind('/') + 1);
    if (name.find("blas") != std::string::npos) return path;
  }
  return "";
}

// The SIMD the kernels were compiled for (Eigen names AVX, not AVX2 or FMA).
std::string simd() {
  std::string s = Eigen::SimdInstructionSetsInUse();
#ifdef EIGEN_VECTORIZE_AVX2
  s += ", AVX2";
#endif
#ifdef EIGEN_VECTORIZE_FMA
  s += ", FMA";
#endif
  return s;
}

int print_info() {
  const std::string lib = mapped_blas();
  const std::string blas = lib.empty() ? "Eigen " + std::to_string(EIGEN_WORLD_VERSION) + "." +
                                             std::to_string(EIGEN_MAJOR_VERSION) + "." +
                                             std::to_string(EIGEN_MINOR_VERSION) +
                                             " kernels and dilocox's sweep, no BLAS library"
                                       : "BLAS library " + lib;
  std::printf("{\"blas\": \"%s\", \"blas_library\": \"%s\", \"simd\": \"%s\", \"threads\": %d}\n", blas.c_str(),
              lib.c_str(), simd().c_str(), Eigen::nbThreads());
  return 0;
}

// CPU time of this thread and wall time since construction.
struct Clock {
  static double thread_now() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  }
  double cpu0 = thread_now();
  std::chrono::steady_clock::time_point wall0 = std::chrono::steady_clock::now();
  double cpu() const { return thread_now() - cpu0; }
  double wall() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count(); }
};

double median_after_first(const std::vector<double>& v) {
  std::vector<double> later(v.begin() + 1, v.end());
  std::nth_element(later.begin(), later.begin() + static_cast<long>(later.size() / 2), later.end());
  return later[later.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "--info") == 0) return print_info();
  if (argc != 6 && argc != 7) {
    std::fprintf(stderr, "usage: powersgd_ours FILE ROWS COLS RANK ITERS [SEED] | powersgd_ours --info\n");
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
    const auto um = static_cast<std::size_t>(m), un = static_cast<std::size_t>(n);
    const dx::MatrixView<const float> xv{x.data(), um, un};
    dx::PowerIterationProjector one(um, un, {.rank = r, .seed = seed}), two(um, un, {.rank = r, .seed = seed});
    RowM out_two(m, n);
    std::vector<double> cpu, wall, cpu_two;
    for (int i = 0; i < iters; ++i) {
      Clock c;
      one.approximate(xv, {out.data(), um, un});
      cpu.push_back(c.cpu()), wall.push_back(c.wall());
      Clock c2;
      two.left(xv);
      two.orthonormalize_left();
      two.right(xv);
      two.reconstruct({out_two.data(), um, un});
      cpu_two.push_back(c2.cpu());
    }
    const double norm = x.norm();
    std::printf("{\"error\": %.8g, \"two_sweep_error\": %.8g, \"median_seconds\": %.6g, \"median_wall_seconds\": %.6g, "
                "\"two_sweep_median_seconds\": %.6g, \"second_sweeps\": %llu}\n",
                (x - out).norm() / norm, (x - out_two).norm() / norm, median_after_first(cpu),
                median_after_first(wall), median_after_first(cpu_two),
                static_cast<unsigned long long>(one.second_sweeps()));
  } catch (const dx::Error& e) {
    std::fprintf(stderr, "powersgd_ours: %s\n", e.what());
    return 1;
  }
  return 0;
}
