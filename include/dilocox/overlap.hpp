// dilocox/overlap.hpp: BackgroundReductions, the one-step-delay scheduler's engine:
// reductions run one after another on a background thread while the caller computes,
// and wait() reports how long the caller was blocked versus how long the reduction
// ran, which is how much communication was hidden behind compute.
// Not here: the round protocol (diloco.hpp).
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <memory>

#include "dilocox/comm/communicator.hpp"

namespace dilocox {

struct ReductionTiming {
  double ran_seconds = 0;     // the reduction's own duration, on the background thread
  double waited_seconds = 0;  // how long wait() blocked the caller
  double hidden_seconds() const { return ran_seconds > waited_seconds ? ran_seconds - waited_seconds : 0.0; }
};

class BackgroundReductions {
 public:
  // Queues `task` after any reduction started earlier.
  void start(std::function<void()> task) {
    auto ran = std::make_shared<double>(0.0);
    Request r = exec_.submit([task = std::move(task), ran] {
      const auto t0 = std::chrono::steady_clock::now();
      task();
      *ran = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    });
    inflight_.push_back({std::move(r), std::move(ran)});
  }

  std::size_t pending() const { return inflight_.size(); }

  // Waits for the oldest reduction; rethrows what it threw.
  ReductionTiming wait() {
    Entry e = std::move(inflight_.front());
    inflight_.pop_front();
    const auto t0 = std::chrono::steady_clock::now();
    e.request.wait();
    ReductionTiming t;
    t.waited_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    t.ran_seconds = *e.ran;
    return t;
  }

  // Waits for everything, discarding errors (for destruction paths).
  void drain() noexcept {
    while (!inflight_.empty()) {
      try {
        wait();
      } catch (...) {
      }
    }
  }
  ~BackgroundReductions() { drain(); }

 private:
  struct Entry {
    Request request;
    std::shared_ptr<double> ran;
  };
  SerialExecutor exec_;
  std::deque<Entry> inflight_;
};

}  // namespace dilocox
