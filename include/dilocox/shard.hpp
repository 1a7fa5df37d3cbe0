// dilocox/shard.hpp: the outer loop sharded over a data-parallel group (ZeRO-1 for the
// outer optimizer). The D ranks of a group hold the same model; shard_tensors() gives
// each tensor one owner, balanced by bytes, whole tensors only (low rank needs whole
// matrices). Each rank runs an OuterLoop over the tensors it owns, with its peers (the
// same shard) in the other clusters, so a tensor crosses the slow link once per cluster,
// not D times, and each rank holds about 1/D of the outer state. The loops of a group
// agree on H through group_sum(), so they sync at the same steps and, with an adaptive
// compressor, as often as one loop over all the tensors would. After every step,
// share_rewritten() hands the tensors a rank's loop rewrote to the other D - 1 ranks.
//
//   const auto owner = shard_tensors(specs, group.size());
//   const auto mine = owned_tensors(owner, group.rank());   // params[mine[i]] is the loop's tensor i
//   config.group_sum = group_sum(group);
//   OuterLoop loop(peers, {params[mine[0]], params[mine[1]], ...}, compressor, config);
//   each inner step: gradients averaged over the group, the inner optimizer, then
//     loop.step();
//     std::vector<std::size_t> wrote;
//     for (std::size_t i : loop.rewritten()) wrote.push_back(mine[i]);
//     share_rewritten(group, owner, all_tensors, wrote);
//
// Needs the Communicator concept. Not here: the gradient average inside the group.
#pragma once

#include "dilocox/comm/communicator.hpp"
#include "dilocox/comm/cost.hpp"
#include "dilocox/config.hpp"
#include "dilocox/compress/compressor.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <numeric>
#include <span>
#include <string>
#include <vector>

namespace dilocox {

// The owner (0 .. parts - 1) of each tensor: largest first, each to the part holding the
// fewest bytes so far (ties: the lower part, then the earlier tensor), so every rank
// that calls it with the same tensors gets the same answer. Every part gets at least one
// tensor (each rank's loop takes part in the group's agreement on H).
inline std::vector<int> shard_tensors(std::span<const TensorSpec> specs, int parts) {
  detail::require(parts >= 1, "shard_tensors", "parts must be >= 1, got " + std::to_string(parts));
  detail::require(specs.size() >= static_cast<std::size_t>(parts), "shard_tensors",
                  std::to_string(specs.size()) + " tensors cannot be split over " + std::to_string(parts) +
                      " ranks: each needs at least one");
  std::vector<std::size_t> order(specs.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return specs[a].shape.numel() > specs[b].shape.numel(); });
  std::vector<std::uint64_t> load(static_cast<std::size_t>(parts), 0);
  std::vector<int> owner(specs.size(), 0);
  for (std::size_t t : order) {
    const auto least = std::min_element(load.begin(), load.end()) - load.begin();
    owner[t] = static_cast<int>(least);
    load[static_cast<std::size_t>(least)] += specs[t].shape.numel();
  }
  return owner;
}

// The indices of the tensors `rank` owns, in order.
inline std::vector<std::size_t> owned_tensors(std::span<const int> owner, int rank) {
  std::vector<std::size_t> out;
  for (std::size_t t = 0; t < owner.size(); ++t)
    if (owner[t] == rank) out.push_back(t);
  return out;
}

// OuterLoopConfig::group_sum for the loops of `group`: each rank's numbers are
// all-gathered and added in rank order, so every rank gets the same bits. `group` must
// outlive the loop.
template <Communicator C>
std::function<void(std::span<double>)> group_sum(C& group) {
  return [&group](std::span<double> v) {
    const auto n = static_cast<std::size_t>(group.size());
    std::vector<std::byte> all(v.size_bytes() * n);
    group.allgather(std::as_bytes(v), all);
    std::fill(v.begin(), v.end(), 0.0);
    for (std::size_t q = 0; q < n; ++q)
      for (std::size_t i = 0; i < v.size(); ++i) {
        double x;
        std::memcpy(&x, all.data() + (q * v.size() + i) * sizeof(double), sizeof(double));
        v[i] += x;
      }
  };
}

// Every rank of `group` calls it after each step, in the same order: `mine` lists the
// tensors (indices into `tensors`, owned by this rank; repeats allowed) that this rank
// rewrote; afterwards every rank holds the same bits of every tensor any rank rewrote:
// its owner's values. Two sum-reductions: the flags, then the rewritten tensors (zeros
// from the ranks that do not own them, so the sum is the owner's value; the owner takes
// the sum too, so a -0 becomes +0 everywhere). Returns the bytes this
// rank put on the group's link (ring reductions).
template <Communicator C>
std::uint64_t share_rewritten(C& group, std::span<const int> owner, std::span<const std::span<float>> tensors,
                              std::span<const std::size_t> mine) {
  detail::require(owner.size() == tensors.size(), "share_rewritten",
                  std::to_string(owner.size()) + " owners for " + std::to_string(tensors.size()) + " tensors");
  if (group.size() == 1) return 0;
  std::vector<float> flags(tensors.size(), 0.0f);
  for (std::size_t t : mine) {
    detail::require(t < tensors.size() && owner[t] == group.rank(), "share_rewritten",
                    "tensor " + std::to_string(t) + " is not this rank's to share");
    flags[t] = 1.0f;
  }
  group.allreduce_sum(std::span<float>(flags));
  std::uint64_t bytes = ring_allreduce_cost(flags.size() * sizeof(float), group.size()).bytes;
  std::size_t n = 0;
  for (std::size_t t = 0; t < tensors.size(); ++t)
    if (flags[t] != 0.0f) n += tensors[t].size();
  if (n == 0) return bytes;
  std::vector<float> packed(n, 0.0f);
  for (std::size_t t = 0, at = 0; t < tensors.size(); ++t) {
    if (flags[t] == 0.0f) continue;
    if (owner[t] == group.rank()) std::copy(tensors[t].begin(), tensors[t].end(), packed.begin() + static_cast<std::ptrdiff_t>(at));
    at += tensors[t].size();
  }
  group.allreduce_sum(std::span<float>(packed));
  for (std::size_t t = 0, at = 0; t < tensors.size(); ++t) {
    if (flags[t] == 0.0f) continue;
    std::copy_n(packed.begin() + static_cast<std::ptrdiff_t>(at), tensors[t].size(), tensors[t].begin());
    at += tensors[t].size();
  }
  return bytes + ring_allreduce_cost(n * sizeof(float), group.size()).bytes;
}

}  // namespace dilocox
