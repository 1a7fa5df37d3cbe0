// Test helper: runs fn(comm) on K threads, one ThreadCommunicator each, and rethrows
// the first exception (aborting the group so that no other rank waits forever).
#pragma once

#include <dilocox/comm/thread.hpp>

#include <exception>
#include <mutex>
#include <thread>
#include <vector>

template <class F>
void run_ranks(int k, F&& fn) {
  auto comms = dilocox::make_thread_communicators(k);
  std::exception_ptr first;
  std::mutex m;
  std::vector<std::thread> threads;
  for (int r = 0; r < k; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(comms[static_cast<std::size_t>(r)]);
      } catch (...) {
        std::lock_guard lock(m);
        if (!first) first = std::current_exception();
        comms[static_cast<std::size_t>(r)].group().abort("rank " + std::to_string(r) + " failed");
      }
    });
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}
