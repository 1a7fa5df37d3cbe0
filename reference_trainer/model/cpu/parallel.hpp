// reference_trainer/model/cpu/parallel.hpp: the threads of the CPU kernels: one count
// per process (set_threads, default 1) and parallel_ranges, a static split of [0, n)
// into contiguous ranges. Kernels split only work whose arithmetic per element does not
// depend on the split (rows of a product, independent heads, columns of a reduction),
// so results are the same for every thread count and every schedule. OpenMP when the
// compiler has it (-fopenmp), serial otherwise; no work stealing, no atomics.
#pragma once

#include <dilocox/config.hpp>

#include <algorithm>
#include <cstddef>
#include <string>

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace dilocox::trainer::cpu {

namespace detail {
inline int& thread_count() {
  static int n = 1;
  return n;
}
}  // namespace detail

// Threads the kernels use from now on (the trainer's --threads).
inline void set_threads(int n) {
  dilocox::detail::require(n >= 1 && n <= 1024, "set_threads", "thread count " + std::to_string(n) + " outside [1, 1024]");
#if !defined(_OPENMP)
  dilocox::detail::require(n == 1, "set_threads", "this build has no OpenMP: only 1 thread");
#endif
  detail::thread_count() = n;
}
inline int threads() { return detail::thread_count(); }

// body(part, begin, end) over threads() contiguous ranges of [0, n), in parallel; every
// boundary is a multiple of `align` (so a product's tiles fall the same way in every
// split). Inside a parallel region (a kernel already split), one range: body(0, 0, n).
template <class Body>
void parallel_ranges(std::size_t n, std::size_t align, Body&& body) {
  const int t = threads();
  const std::size_t blocks = (n + align - 1) / align;
#if defined(_OPENMP)
  if (t > 1 && blocks > 1 && !omp_in_parallel()) {
    const int parts = static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(t), blocks));
#pragma omp parallel for num_threads(parts) schedule(static, 1)
    for (int i = 0; i < parts; ++i) {
      const std::size_t begin = blocks * static_cast<std::size_t>(i) / static_cast<std::size_t>(parts) * align;
      const std::size_t end = std::min(n, blocks * static_cast<std::size_t>(i + 1) / static_cast<std::size_t>(parts) * align);
      body(i, begin, end);
    }
    return;
  }
#endif
  (void)t;
  (void)blocks;
  if (n > 0) body(0, std::size_t{0}, n);
}

// body(i) for every i in [0, n), the indices split as parallel_ranges does.
template <class Body>
void parallel_for(std::size_t n, Body&& body) {
  parallel_ranges(n, 1, [&](int, std::size_t begin, std::size_t end) {
    for (std::size_t i = begin; i < end; ++i) body(i);
  });
}

}  // namespace dilocox::trainer::cpu
