// reference_trainer/model/cpu/parallel.hpp: the threads of the CPU kernels: one count
// per process (set_threads, default 1) and parallel_ranges, a static split of [0, n)
// into contiguous parts. Kernels split only work whose arithmetic per element does not
// depend on the split (rows of a product, independent heads, columns of a reduction), so
// results are the same for every thread count and every schedule. The parts are claimed
// from a counter, not dealt to threads: a worker the OS has not scheduled yet leaves its
// part to the others instead of stalling them (on a shared machine OpenMP's fixed teams
// ran 2 threads 8x slower than 1). No work stealing inside a part, no atomics on data.
#pragma once

#include <dilocox/config.hpp>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace dilocox::trainer::cpu {

namespace detail {

// threads - 1 workers; run(parts, job) lets the caller and the workers claim parts
// 0..parts-1 and returns when every part is done. Bodies must not throw.
class ClaimPool {
 public:
  using Job = void (*)(const void* ctx, int part);

  explicit ClaimPool(int threads) {
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { work(); });
  }
  ~ClaimPool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& w : workers_) w.join();
  }
  ClaimPool(const ClaimPool&) = delete;
  ClaimPool& operator=(const ClaimPool&) = delete;

  void run(int parts, Job job, const void* ctx) {
    std::uint32_t gen;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      gen = ++generation_;  // wraps after 2^32 jobs, harmlessly: only equality is asked
      job_ = job, ctx_ = ctx, parts_ = parts;
      done_.store(0, std::memory_order_relaxed);
      ticket_.store(std::uint64_t{gen} << 32, std::memory_order_release);  // (generation, next part)
    }
    wake_.notify_all();
    claim_and_run(gen, parts, job, ctx);
    while (done_.load(std::memory_order_acquire) < parts) std::this_thread::yield();  // claimed parts only
  }

 private:
  // Claims parts of generation gen until none is left (or a newer job has started).
  void claim_and_run(std::uint32_t gen, int parts, Job job, const void* ctx) {
    std::uint64_t t = ticket_.load(std::memory_order_acquire);
    while ((t >> 32) == gen && static_cast<int>(t & 0xffffffffu) < parts) {
      if (!ticket_.compare_exchange_weak(t, t + 1, std::memory_order_acq_rel)) continue;
      job(ctx, static_cast<int>(t & 0xffffffffu));
      done_.fetch_add(1, std::memory_order_release);
      t = ticket_.load(std::memory_order_acquire);
    }
  }

  void work() {
    std::uint32_t seen = 0;
    for (;;) {
      // Spin a little, yielding (the next kernel usually follows within microseconds), then sleep.
      for (int i = 0; i < 1000 && generation_seen() == seen; ++i) std::this_thread::yield();
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      const Job job = job_;
      const void* ctx = ctx_;
      const int parts = parts_;
      lock.unlock();
      claim_and_run(seen, parts, job, ctx);
    }
  }
  std::uint32_t generation_seen() const {
    return static_cast<std::uint32_t>(ticket_.load(std::memory_order_relaxed) >> 32);
  }

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::uint32_t generation_ = 0;  // under mutex_
  Job job_ = nullptr;             // under mutex_, with ctx_ and parts_
  const void* ctx_ = nullptr;
  int parts_ = 0;
  std::atomic<std::uint64_t> ticket_{0};
  std::atomic<int> done_{0};
};

struct Threads {
  int count = 1;
  std::unique_ptr<ClaimPool> pool;
};
inline Threads& threads_state() {
  static Threads t;
  return t;
}
inline thread_local bool inside_part = false;  // a kernel called from a part runs serially

}  // namespace detail

// Threads the kernels use from now on (the trainer's --threads). Not while kernels run.
inline void set_threads(int n) {
  dilocox::detail::require(n >= 1 && n <= 1024, "set_threads", "thread count " + std::to_string(n) + " outside [1, 1024]");
  auto& t = detail::threads_state();
  if (n == t.count) return;
  t.pool.reset();
  t.count = n;
  if (n > 1) t.pool = std::make_unique<detail::ClaimPool>(n);
}
inline int threads() { return detail::threads_state().count; }

// body(part, begin, end) over min(threads(), blocks) contiguous parts of [0, n), in
// parallel; every boundary is a multiple of `align` (so a product's tiles fall the same
// way in every split). part indexes per-part scratch. From inside a part: body(0, 0, n).
template <class Body>
void parallel_ranges(std::size_t n, std::size_t align, Body&& body) {
  const std::size_t blocks = (n + align - 1) / align;
  const int parts = static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(threads()), blocks));
  if (parts <= 1 || detail::inside_part) {
    if (n > 0) body(0, std::size_t{0}, n);
    return;
  }
  struct Ctx {
    std::size_t n, align, blocks;
    int parts;
    Body* body;
  } ctx{n, align, blocks, parts, &body};
  detail::threads_state().pool->run(parts, [](const void* p, int part) {
    const auto& c = *static_cast<const Ctx*>(p);
    const auto i = static_cast<std::size_t>(part), k = static_cast<std::size_t>(c.parts);
    const std::size_t begin = c.blocks * i / k * c.align, end = std::min(c.n, c.blocks * (i + 1) / k * c.align);
    detail::inside_part = true;
    (*c.body)(part, begin, end);
    detail::inside_part = false;
  }, &ctx);
}

// body(i) for every i in [0, n), the indices split as parallel_ranges does.
template <class Body>
void parallel_for(std::size_t n, Body&& body) {
  parallel_ranges(n, 1, [&](int, std::size_t begin, std::size_t end) {
    for (std::size_t i = begin; i < end; ++i) body(i);
  });
}

}  // namespace dilocox::trainer::cpu
