// dilocox/comm/cost.hpp: what a collective costs on a link: the bytes each rank
// sends and the sequential hops under the algorithm real transports use (rings),
// and the time that takes at a given bandwidth and latency. Pure arithmetic, shared
// by ThrottledLink (which enforces it), the reducers (which report it) and planning.
#pragma once

#include <cstdint>

namespace dilocox {

struct LinkConfig {
  double bits_per_second = 1e9;  // per rank, each direction
  double latency_seconds = 0.0;  // per hop
};

// Bytes and hops of one collective under its real algorithm, for K ranks.
struct WireCost {
  std::uint64_t bytes = 0;
  int hops = 0;
};
inline WireCost ring_allreduce_cost(std::uint64_t bytes, int k) {
  if (k <= 1) return {};
  return {2 * (static_cast<std::uint64_t>(k) - 1) * bytes / static_cast<std::uint64_t>(k), 2 * (k - 1)};
}
inline WireCost ring_allgather_cost(std::uint64_t bytes_per_rank, int k) {
  if (k <= 1) return {};
  return {(static_cast<std::uint64_t>(k) - 1) * bytes_per_rank, k - 1};
}
inline WireCost barrier_cost(int k) {
  int hops = 0;
  while ((1 << hops) < k) ++hops;
  return {0, hops};
}
inline WireCost sendrecv_cost(std::uint64_t bytes, int k) { return k <= 1 ? WireCost{} : WireCost{bytes, 1}; }
inline WireCost& operator+=(WireCost& a, const WireCost& b) {
  a.bytes += b.bytes;
  a.hops += b.hops;
  return a;
}
inline double link_seconds(const WireCost& c, const LinkConfig& l) {
  return l.latency_seconds * c.hops + static_cast<double>(c.bytes) * 8.0 / l.bits_per_second;
}

}  // namespace dilocox
