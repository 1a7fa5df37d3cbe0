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

inline nlohmann::json plan_json(const PlanInput& in, const Plan& p) {
  nlohmann::json modes = nlohmann::json::array();
  for (const auto& m : p.modes)
    modes.push_back({{"sync", m.mode}, {"steps_per_round", m.steps_per_round},
                     {"wire_bytes_per_round", m.wire_bytes_per_round}, {"comm_seconds_per_round", m.comm_seconds_per_round},
                     {"compute_seconds_per_round", m.compute_seconds_per_round}, {"round_seconds", m.round_seconds},
                     {"tokens_per_second", m.tokens_per_second}});
  return {{"model", p.model.name}, {"params", p.params}, {"clusters", in.clusters}, {"stages", in.stages}, {"shards", p.shards},
          {"stage_params", p.stage_params}, {"memory_per_rank", p.memory.total()}, {"fits", p.fits},
          {"memory", {{"weights", p.memory.weights}, {"grads", p.memory.grads}, {"adamw", p.memory.adamw},
                      {"outer", p.memory.outer}, {"error_feedback", p.memory.error_feedback},
                      {"workspace", p.memory.workspace}, {"activations", p.memory.activations}}},
          {"step_compute_seconds", p.step_compute_seconds}, {"modes", modes}};
}

inline void print_plan(const PlanInput& in, const Plan& p) {
  std::printf("plan: %s, %.3g parameters; %d cluster(s) x %d stage(s) x %d shard(s) = %d ranks per cluster\n",
              p.model.name.c_str(), static_cast<double>(p.params), in.clusters, in.stages, p.shards,
              RankLayout{.clusters = 1, .dp = p.shards, .stages = in.stages}.world());
  std::printf("link %s, latency %s; batch %d x %d tokens per replica; %.3g FLOP/s per rank\n\n",
              (human_bytes(in.sync.link.bits_per_second / 8) + "/s").c_str(),
              human_seconds(in.sync.link.latency_seconds).c_str(), in.batch, in.seq_len, in.rank_flops);
  std::printf("memory per rank (largest stage, %.3g parameters / %d shards, sync %s):\n", p.stage_params, p.shards,
              in.sync.mode.c_str());
  const std::pair<const char*, double> rows[] = {
      {"weights (fp32)", p.memory.weights},       {"gradients", p.memory.grads},
      {"AdamW m, v", p.memory.adamw},             {"outer: theta, anchor, momentum", p.memory.outer},
      {"compressor state (error feedback)", p.memory.error_feedback}, {"workspace: sync slots", p.memory.workspace},
      {"activations in flight", p.memory.activations}};
  for (const auto& [name, b] : rows) std::printf("  %-32s %12s\n", name, human_bytes(b).c_str());
  std::printf("  %-32s %12s  (%s %s per rank)\n\n", "total", human_bytes(p.memory.total()).c_str(),
              p.fits ? "fits in" : "DOES NOT FIT in", human_bytes(in.gpu_memory).c_str());
  std::printf("%-10s %6s %16s %14s %14s %14s %14s\n", "sync", "H", "wire/round/rank", "comm/round", "compute/round",
              "round", "tokens/s");
  for (const auto& m : p.modes)
    std::printf("%-10s %6d %16s %14s %14s %14s %14.1f\n", m.mode.c_str(), m.steps_per_round,
                human_bytes(m.wire_bytes_per_round).c_str(), human_seconds(m.comm_seconds_per_round).c_str(),
                human_seconds(m.compute_seconds_per_round).c_str(), human_seconds(m.round_seconds).c_str(),
                m.tokens_per_second);
  std::printf("\n");
}

}  // namespace dilocox::trainer
