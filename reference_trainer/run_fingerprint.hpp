// reference_trainer/run_fingerprint.hpp: which flags shape a run, as one table. Every
// flag of train_options.hpp has a row (checked at every start: a new flag without one
// stops the program with a message naming it) saying where it must agree:
//   outcome: the numbers depend on it: equal on every rank, and equal to the checkpoint's
//            on --resume (stored in its meta);
//   ranks:   every rank must run with the same value (collectives would not match), but
//            --resume may change it (eval and checkpoint cadence, timeouts, ...);
//   local:   each rank's own business (paths, --quiet, --gpu, --threads, planning inputs).
// Values are the effective ones (a default spelled out or not gives the same string); a
// flag the run does not use (--rank under --sync diloco) has none and is not compared.
// Also the comparisons and their one-line messages. Not here: MPI (run_agreement.hpp).
#pragma once

#include "train_options.hpp"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace dilocox::trainer {

enum class FlagScope { outcome, ranks, local };

struct FlagRow {
  const char* flag;
  FlagScope scope;
  std::function<std::optional<std::string>(const TrainOptions&)> value;  // nullopt: not used by this run
};

namespace detail {
// The shortest text that reads back as the same value (float flags as float: 0.001, not
// 0.00100000005).
inline std::string num(double v) {
  char buf[32];
  for (int digits = 6; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}
inline std::string num(float v) {
  char buf[32];
  for (int digits = 6; digits <= 9; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, static_cast<double>(v));
    if (std::strtof(buf, nullptr) == v) break;
  }
  return buf;
}
inline bool across_clusters(const TrainOptions& o) { return o.clusters > 1; }
inline bool outer_loop(const TrainOptions& o) { return o.clusters > 1 && o.sync != "allreduce"; }
inline std::optional<std::string> when(bool used, std::string v) {
  return used ? std::optional<std::string>(std::move(v)) : std::nullopt;
}
inline int bits_in_effect(const TrainOptions& o) {
  for (const auto& m : sync_modes())
    if (m.name == o.sync) {
      const Knob* bits = m.knob("bits");
      return o.bits ? o.bits : bits ? static_cast<int>(bits->value) : 0;
    }
  return o.bits;
}
inline std::string knobs_in_effect(const TrainOptions& o) {
  auto k = o.knobs;
  std::sort(k.begin(), k.end());
  std::string s;
  for (const auto& v : k) s += (s.empty() ? "" : " ") + v;
  return s.empty() ? "none" : s;
}
inline bool overlap_in_effect(const TrainOptions& o) {
  for (const auto& m : sync_modes())
    if (m.name == o.sync) return o.overlap_given ? o.overlap : m.overlap;
  return o.overlap;
}
inline GptConfig preset_or_empty(const std::string& name) {
  try {
    return gpt_preset(name);
  } catch (const std::exception&) {
    return GptConfig{};
  }
}

// The rows of the flags that change the numbers a run produces.
inline std::vector<FlagRow> outcome_flag_rows() {
  using O = const TrainOptions&;
  constexpr auto outcome = FlagScope::outcome;
  return {
      {"--model", outcome, [](O o) { return o.model; }},
      {"--layers", outcome, [](O o) { return std::to_string(o.layers ? o.layers : detail::preset_or_empty(o.model).n_layer); }},
      {"--embd", outcome, [](O o) { return std::to_string(o.embd ? o.embd : detail::preset_or_empty(o.model).n_embd); }},
      {"--heads", outcome, [](O o) { return std::to_string(o.heads ? o.heads : detail::preset_or_empty(o.model).n_head); }},
      {"--vocab", outcome, [](O o) { return std::to_string(o.vocab ? o.vocab : detail::preset_or_empty(o.model).vocab); }},
      {"--stages", outcome, [](O o) { return std::to_string(o.stages); }},
      {"--clusters", outcome, [](O o) { return std::to_string(o.clusters); }},
      {"--dp", outcome, [](O o) { return std::to_string(o.dp); }},
      {"--tokens", outcome, [](O o) { return std::to_string(o.tokens); }},
      {"--batch", outcome, [](O o) { return std::to_string(o.batch); }},
      {"--micro-batches", outcome,
       [](O o) {
         return std::to_string(o.micro_batches ? o.micro_batches
                                               : (o.stages == 1 ? 1 : std::min(o.batch, 2 * o.stages)));
       }},
      {"--seq-len", outcome,
       [](O o) { return std::to_string(o.seq_len ? o.seq_len : detail::preset_or_empty(o.model).max_seq); }},
      {"--schedule", outcome, [](O o) { return when(o.stages > 1, o.schedule); }},
      {"--device", outcome, [](O o) { return o.device; }},
      {"--precision", outcome, [](O o) { return when(o.device == "cuda", o.precision); }},
      {"--lr", outcome, [](O o) { return num(o.adamw.lr); }},
      {"--warmup", outcome, [](O o) { return std::to_string(o.adamw.warmup_steps); }},
      {"--weight-decay", outcome, [](O o) { return num(o.adamw.weight_decay); }},
      {"--grad-clip", outcome, [](O o) { return num(o.adamw.grad_clip); }},
      {"--seed", outcome, [](O o) { return std::to_string(o.seed); }},
      {"--sync", outcome, [](O o) { return when(detail::across_clusters(o), o.sync); }},
      {"--bits", outcome, [](O o) { return when(detail::outer_loop(o), std::to_string(detail::bits_in_effect(o))); }},
      {"--rank", outcome, [](O o) { return when(detail::outer_loop(o) && o.sync == "dilocox", std::to_string(o.rank)); }},
      {"--max-rank", outcome,
       [](O o) { return when(detail::outer_loop(o) && o.sync == "dilocox" && !o.no_adaptive, std::to_string(o.max_rank)); }},
      {"--no-adaptive", outcome,
       [](O o) { return when(detail::outer_loop(o) && o.sync == "dilocox", o.no_adaptive ? "yes" : "no"); }},
      {"--knob", outcome, [](O o) { return when(detail::outer_loop(o), detail::knobs_in_effect(o)); }},
      {"--local-steps", outcome, [](O o) { return when(detail::outer_loop(o), std::to_string(o.local_steps)); }},
      {"--max-local-steps", outcome, [](O o) { return when(detail::outer_loop(o), std::to_string(o.max_local_steps)); }},
      {"--overlap", outcome,
       [](O o) { return when(detail::outer_loop(o), detail::overlap_in_effect(o) ? "on" : "off (--no-overlap)"); }},
      {"--fragments", outcome, [](O o) { return when(detail::outer_loop(o), std::to_string(o.fragments)); }},
      {"--rebase", outcome, [](O o) { return when(detail::outer_loop(o), o.rebase.empty() ? "the mode's" : o.rebase); }},
      {"--overlap-steps", outcome,
       [](O o) { return when(detail::outer_loop(o), o.overlap_steps >= 0 ? std::to_string(o.overlap_steps) : "the mode's"); }},
      {"--momentum-storage", outcome, [](O o) { return when(detail::outer_loop(o), o.momentum_storage); }},
      {"--momentum-at", outcome,
       [](O o) { return when(detail::outer_loop(o), o.momentum_at.empty() ? "the mode's" : o.momentum_at); }},
      {"--outer-lr", outcome,
       [](O o) { return when(detail::outer_loop(o), o.outer_lr > 0 ? num(o.outer_lr) : "the mode's"); }},
      {"--outer-momentum", outcome,
       [](O o) { return when(detail::outer_loop(o), o.outer_momentum >= 0 ? num(o.outer_momentum) : "the mode's"); }},
      {"--step-seconds", outcome, [](O o) { return when(detail::outer_loop(o), num(o.step_seconds)); }},
      // The link changes numbers only through the overlap floor of H (with --step-seconds).
      {"--wan-bandwidth", outcome,
       [](O o) { return when(detail::outer_loop(o) && o.step_seconds > 0, num(link_of(o).bits_per_second)); }},
      {"--wan-latency", outcome,
       [](O o) { return when(detail::outer_loop(o) && o.step_seconds > 0, num(link_of(o).latency_seconds)); }},
      {"--inject-nan", outcome, [](O o) { return o.inject_nan.empty() ? "none" : o.inject_nan; }},
  };
}
}  // namespace detail

// The table, in the order messages list flags: the outcome rows, then the flags every
// rank must agree on, then those each rank may set for itself.
inline const std::vector<FlagRow>& flag_table() {
  using detail::num;
  using O = const TrainOptions&;
  constexpr auto ranks = FlagScope::ranks, local = FlagScope::local;
  static const std::vector<FlagRow> rows = [] {
    std::vector<FlagRow> r = detail::outcome_flag_rows();
    r.insert(r.end(), {
        {"--eval-every", ranks, [](O o) { return std::to_string(o.eval_every); }},
        {"--eval-sequences", ranks, [](O o) { return std::to_string(o.eval_sequences); }},
        {"--checkpoint-dir", ranks, [](O o) { return o.checkpoint_dir.empty() ? "none" : "given"; }},
        {"--checkpoint-every", ranks, [](O o) { return std::to_string(o.checkpoint_every); }},
        {"--checkpoint-minutes", ranks, [](O o) { return num(o.checkpoint_minutes); }},
        {"--resume", ranks, [](O o) { return o.resume ? "yes" : "no"; }},
        {"--resume-if-present", ranks, [](O o) { return o.resume_if_present ? "yes" : "no"; }},
        {"--stop-after", ranks, [](O o) { return std::to_string(o.stop_after); }},
        {"--collective-timeout", ranks, [](O o) { return num(o.collective_timeout); }},
        {"--progress-timeout", ranks, [](O o) { return num(o.progress_timeout); }},
        {"--max-nonfinite-steps", ranks, [](O o) { return std::to_string(o.max_nonfinite_steps); }},
        {"--dump-pseudo-gradients", ranks, [](O o) { return o.dump_pseudo_gradients.empty() ? "none" : "given"; }},
        {"--plan", ranks, [](O o) { return o.plan ? "yes" : "no"; }},
        {"--run-id", ranks, [](O o) { return o.run_id.empty() ? "none" : o.run_id; }},
        {"--elastic", ranks, [](O o) { return std::to_string(o.elastic); }},
        // Where each site is and how it reaches the others; a run may resume in either layout.
        {"--site", local, nullptr},
        {"--rendezvous", local, nullptr},
        {"--gloo-interface", local, nullptr},
        // The data's contents are outcome (the "data" entry, from the shards' checksums).
        {"--data-dir", local, nullptr},
        {"--metrics", local, nullptr},
        {"--quiet", local, nullptr},
        {"--gpu", local, nullptr},
        {"--threads", local, nullptr},  // the same numbers for any count
        {"--params", local, nullptr},
        {"--rank-flops", local, nullptr},
        {"--gpu-memory", local, nullptr},
        {"--inner-state", local, nullptr},
        {"--help", local, nullptr},
    });
    return r;
  }();
  return rows;
}

// The flags defined in train_options.hpp that have no row: empty, or the program stops.
inline std::vector<std::string> unclassified_flags() {
  std::vector<std::string> missing;
  for (const auto& name : train_flag_names()) {
    bool found = false;
    for (const auto& r : flag_table()) found = found || name == r.flag;
    if (!found) missing.push_back(name);
  }
  return missing;
}

// {flag: value} of the rows of these scopes that this run uses.
inline nlohmann::json flag_values(const TrainOptions& o, bool outcome_only) {
  nlohmann::json v = nlohmann::json::object();
  for (const auto& r : flag_table()) {
    if (r.scope == FlagScope::local || (outcome_only && r.scope != FlagScope::outcome)) continue;
    if (auto s = r.value(o)) v[r.flag] = *s;
  }
  return v;
}

// "0-1, 4, 6-7": sorted ranks as ranges.
inline std::string rank_ranges(const std::vector<int>& ranks) {
  std::string out;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    out += (out.empty() ? "" : ", ") + std::to_string(ranks[i]) + (j > i ? "-" + std::to_string(ranks[j]) : "");
    i = j + 1;
  }
  return out;
}

// Across ranks: values[r] is rank r's flag_values (null: unknown, skipped). Returns one
// clause per differing flag ("--sync: allreduce on ranks 0-1, dilocox on ranks 2-3"),
// in table order, then "data" (ranks without it, whose data failed, are left out); empty
// when every rank agrees. A flag some rank does not use is skipped: another one differs.
inline std::string describe_rank_mismatches(const std::vector<nlohmann::json>& values) {
  std::vector<std::string> keys;
  for (const auto& r : flag_table()) keys.push_back(r.flag);
  keys.push_back("data");
  std::string out;
  for (const auto& key : keys) {
    std::vector<std::pair<std::string, std::vector<int>>> by_value;  // in the order of their first rank
    bool absent = false;
    for (std::size_t r = 0; r < values.size(); ++r) {
      if (!values[r].is_object()) continue;
      if (!values[r].contains(key)) {
        absent = absent || key != "data";
        continue;
      }
      const auto v = values[r][key].get<std::string>();
      auto it = std::find_if(by_value.begin(), by_value.end(), [&](const auto& e) { return e.first == v; });
      if (it == by_value.end()) it = by_value.insert(by_value.end(), {v, {}});
      it->second.push_back(static_cast<int>(r));
    }
    if (by_value.size() < 2 || absent) continue;
    std::string clause = (key == "data" ? std::string("--data-dir contents") : key) + ":";
    bool first = true;
    for (const auto& [value, who] : by_value) {
      clause += std::string(first ? " " : ", ") + value + " on rank" + (who.size() > 1 ? "s " : " ") + rank_ranges(who);
      first = false;
    }
    out += (out.empty() ? "" : "; ") + clause;
  }
  return out;
}

// On --resume: the checkpoint's outcome flags against this run's. Returns one clause per
// flag that differs ("--rank: 8 in the checkpoint, 16 now"); empty when they match.
inline std::string describe_resume_mismatches(const nlohmann::json& saved, const nlohmann::json& now) {
  std::string out;
  std::vector<std::string> keys;
  for (const auto& r : flag_table())
    if (r.scope == FlagScope::outcome) keys.push_back(r.flag);
  keys.push_back("data");
  for (const auto& key : keys) {
    if (!saved.contains(key) || !now.contains(key)) continue;  // unused on one side: another flag differs
    const std::string a = saved[key].get<std::string>(), b = now[key].get<std::string>();
    if (a == b) continue;
    out += (out.empty() ? "" : "; ") + (key == "data" ? std::string("--data-dir contents") : key) + ": " + a +
           " in the checkpoint, " + b + " now";
  }
  return out;
}

}  // namespace dilocox::trainer
