// reference_trainer/plan_report.hpp: prints a Plan for people (a few aligned tables)
// and as one JSON line for scripts and tests.
#pragma once

#include "plan.hpp"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <string>

namespace dilocox::trainer {

inline std::string human_bytes(double b) {
  char buf[32];
  if (b >= 1e12) std::snprintf(buf, sizeof buf, "%.2f TB", b / 1e12);
  else if (b >= 1e9) std::snprintf(buf, sizeof buf, "%.1f GB", b / 1e9);
  else if (b >= 1e6) std::snprintf(buf, sizeof buf, "%.1f MB", b / 1e6);
  else if (b >= 1e3) std::snprintf(buf, sizeof buf, "%.1f kB", b / 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f B", b);
  return buf;
}

inline std::string human_seconds(double s) {
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%.3f h", s / 3600);
  else if (s >= 1) std::snprintf(buf, sizeof buf, "%.2f s", s);
  else std::snprintf(buf, sizeof buf, "%.1f ms", s * 1e3);
  return buf;
}

inline nlohmann::json outer_json(const OuterMemory& m) {
  return {{"global", m.global}, {"anchor", m.anchor}, {"momentum", m.momentum}, {"workspace", m.workspace},
          {"compressor", m.compressor}, {"total", m.total()}};
}

inline nlohmann::json plan_json(const PlanInput& in, const Plan& p) {
  nlohmann::json modes = nlohmann::json::array(), layouts = nlohmann::json::array();
  for (const auto& m : p.modes)
    modes.push_back({{"sync", m.mode}, {"steps_per_round", m.steps_per_round},
                     {"wire_bytes_per_round", m.wire_bytes_per_round}, {"site_bytes_per_round", m.site_bytes_per_round},
                     {"comm_seconds_per_round", m.comm_seconds_per_round},
                     {"compute_seconds_per_round", m.compute_seconds_per_round}, {"round_seconds", m.round_seconds},
                     {"tokens_per_second", m.tokens_per_second}});
  for (const auto& l : p.layouts)
    layouts.push_back({{"outer", l.outer}, {"at_stages", l.at_stages}, {"found", l.found},
                       {"stages", l.stages}, {"dp", l.dp}, {"ranks_per_cluster", l.ranks()},
                       {"memory_per_rank", l.memory}});
  const double held = static_cast<double>(p.memory.outer.global) / 4;  // the parameters of the largest outer shard
  return {{"model", p.model.name}, {"params", p.params}, {"clusters", in.clusters}, {"stages", in.stages}, {"dp", in.dp},
          {"inner_sharded", in.inner_sharded}, {"stage_params", p.stage_params}, {"memory_per_rank", p.memory.total()},
          {"fits", p.fits},
          {"memory", {{"weights", p.memory.weights}, {"grads", p.memory.grads}, {"adamw", p.memory.adamw},
                      {"outer", outer_json(p.memory.outer)}, {"activations", p.memory.activations}}},
          {"outer_bytes_per_parameter", held > 0 ? static_cast<double>(p.memory.outer.total()) / held : 0.0},
          {"step_compute_seconds", p.step_compute_seconds}, {"modes", modes}, {"layouts", layouts}};
}

inline void print_memory(const PlanInput& in, const Plan& p) {
  std::printf("memory per rank (largest stage, %.3g parameters on %d dp rank(s): inner state %s, outer state sharded "
              "by whole tensors; sync %s):\n",
              p.stage_params, in.dp, in.inner_sharded ? "split over them" : "whole on each", in.sync.mode.c_str());
  const auto& o = p.memory.outer;
  const std::pair<const char*, double> rows[] = {
      {"weights (fp32)", p.memory.weights},
      {"gradients", p.memory.grads},
      {"AdamW m, v", p.memory.adamw},
      {"outer: theta (global copy)", static_cast<double>(o.global)},
      {"outer: anchor", static_cast<double>(o.anchor)},
      {"outer: momentum", static_cast<double>(o.momentum)},
      {"outer: sync workspace", static_cast<double>(o.workspace)},
      {"outer: compressor state (EF)", static_cast<double>(o.compressor)},
      {"activations in flight", p.memory.activations}};
  for (const auto& [name, b] : rows) std::printf("  %-32s %12s\n", name, human_bytes(b).c_str());
  std::printf("  %-32s %12s  (%s %s per rank)\n\n", "total", human_bytes(p.memory.total()).c_str(),
              p.fits ? "fits in" : "DOES NOT FIT in", human_bytes(in.gpu_memory).c_str());
}

inline std::string layout_cell(const LayoutFit& l) {
  if (!l.found) return "none";
  char buf[96];
  std::snprintf(buf, sizeof buf, "%d x %d = %d ranks, %s", l.stages, l.dp, l.ranks(), human_bytes(l.memory).c_str());
  return buf;
}

inline void print_layouts(const PlanInput& in, const Plan& p) {
  std::printf("smallest layouts that fit %s per rank, stages x dp per cluster (inner state %s):\n",
              human_bytes(in.gpu_memory).c_str(), in.inner_sharded ? "split over dp" : "whole on each rank");
  std::printf("  %-32s %-34s %s\n", "", "any stages", ("at " + std::to_string(in.stages) + " stages").c_str());
  const std::size_t half = p.layouts.size() / 2;  // every stage count, then the plan's
  for (std::size_t i = 0; i < half; ++i) {
    const auto& l = p.layouts[i];
    const char* what = l.outer == "sharded" ? "outer state sharded over dp"
                       : l.outer == "whole" ? "outer state whole on each rank"
                                            : "no outer state (allreduce)";
    std::printf("  %-32s %-34s %s\n", what, layout_cell(l).c_str(), layout_cell(p.layouts[half + i]).c_str());
  }
  std::printf("\n");
}

inline void print_plan(const PlanInput& in, const Plan& p) {
  std::printf("plan: %s, %.3g parameters; %d cluster(s) x %d stage(s) x %d dp = %d ranks per cluster\n",
              p.model.name.c_str(), static_cast<double>(p.params), in.clusters, in.stages, in.dp,
              RankLayout{.clusters = 1, .dp = in.dp, .stages = in.stages}.world());
  std::printf("site link %s, latency %s (shared by a cluster's ranks); batch %d x %d tokens per replica; %.3g FLOP/s "
              "per rank\n\n",
              (human_bytes(in.sync.link.bits_per_second / 8) + "/s").c_str(),
              human_seconds(in.sync.link.latency_seconds).c_str(), in.batch, in.seq_len, in.rank_flops);
  print_memory(in, p);
  print_layouts(in, p);
  std::printf("%-10s %6s %16s %16s %14s %14s %14s %14s\n", "sync", "H", "wire/round/rank", "site/round", "comm/round",
              "compute/round", "round", "tokens/s");
  for (const auto& m : p.modes)
    std::printf("%-10s %6d %16s %16s %14s %14s %14s %14.1f\n", m.mode.c_str(), m.steps_per_round,
                human_bytes(m.wire_bytes_per_round).c_str(), human_bytes(m.site_bytes_per_round).c_str(),
                human_seconds(m.comm_seconds_per_round).c_str(), human_seconds(m.compute_seconds_per_round).c_str(),
                human_seconds(m.round_seconds).c_str(), m.tokens_per_second);
  std::printf("\n");
}

}  // namespace dilocox::trainer
