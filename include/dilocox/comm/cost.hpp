// dilocox/comm/cost.hpp: what a collective costs on a link: the bytes each rank
// sends and the sequential hops under the algorithm real transports use (rings),
// and the time that takes at a given bandwidth and latency. Pure arithmetic, shared
// by ThrottledLink (which enforces it), the reducers (which report it) and planning,
// plus the parsing of link figures written the usual way ("1Gbps", "20ms").
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

#include "dilocox/config.hpp"

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

namespace detail {
// "<number><unit>" with a unit from the table (case-sensitive), e.g. "1.5Gbps".
template <std::size_t N>
double parse_with_unit(const std::string& text, const char* what, const std::pair<const char*, double> (&units)[N]) {
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string allowed;
  for (const auto& [name, scale] : units) {
    allowed += std::string(allowed.empty() ? "" : ", ") + name;
    if (used > 0 && text.substr(used) == name) {
      require(std::isfinite(v) && v >= 0, what, "'" + text + "' must be a non-negative number");
      return v * scale;
    }
  }
  throw Error(std::string(what) + ": cannot read '" + text + "' (a number and one of: " + allowed + ")");
}
}  // namespace detail

// "1Gbps", "20Mbps", "500kbps", "100bps" -> bits per second (must be > 0).
inline double parse_bits_per_second(const std::string& text) {
  static const std::pair<const char*, double> units[] = {
      {"Tbps", 1e12}, {"Gbps", 1e9}, {"Mbps", 1e6}, {"kbps", 1e3}, {"bps", 1.0}};
  const double v = detail::parse_with_unit(text, "bandwidth", units);
  detail::require(v > 0, "bandwidth", "'" + text + "' must be more than 0");
  return v;
}

// "20ms", "1.5s", "300us", "0" -> seconds.
inline double parse_seconds(const std::string& text) {
  if (text == "0") return 0.0;
  static const std::pair<const char*, double> units[] = {{"ms", 1e-3}, {"us", 1e-6}, {"ns", 1e-9}, {"s", 1.0}};
  return detail::parse_with_unit(text, "latency", units);
}

}  // namespace dilocox
