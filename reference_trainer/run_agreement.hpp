// reference_trainer/run_agreement.hpp: one collective before any work. Every rank checks
// its own inputs (flags, data, checkpoint folder, checkpoints) and catches what fails;
// then all exchange one report each (JSON, over the run's world: world.hpp) and reach
// the same verdict from the same reports: go, or stop with one exit code and the lines
// rank 0 prints, each naming the rank (stage, replica) whose input failed and quoting
// its own message. A rank that never arrives is the watchdog's (watchdog.hpp).
// Report fields: "code" (0 ok, 2 bad input, 1 other), "message", "parsed" (the flags
// were read), "help" (--help: exit 0), "where" ("stage 0, replica 1"), "flags"
// (flag_values + "data"), and whatever the caller adds (the checkpoint steps it holds).
#pragma once

#include "run_fingerprint.hpp"
#include "world.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace dilocox::trainer {

struct Verdict {
  int code = 0;                     // the exit code of every rank when stop
  bool stop = false;
  std::vector<std::string> lines;   // for rank 0's stderr, without the "dilocox-train: " prefix
};

// Every rank's report, in world rank order, on every rank.
inline std::vector<nlohmann::json> gather_reports(World& world, const nlohmann::json& mine) {
  std::vector<nlohmann::json> out;
  for (const auto& text : world.allgather(mine.dump())) out.push_back(nlohmann::json::parse(text));
  return out;
}

namespace detail {
inline std::string who(const std::vector<nlohmann::json>& reports, int r) {
  const auto& w = reports[static_cast<std::size_t>(r)].value("where", std::string());
  return "rank " + std::to_string(r) + (w.empty() ? "" : " (" + w + ")");
}

// One line per distinct message of the failed reports: "rank 2 (stage 0, replica 1):
// <message> [also ranks 3]"; without ranks in a run of one.
inline std::vector<std::string> failure_lines(const std::vector<nlohmann::json>& reports,
                                              const std::vector<int>& failed) {
  std::vector<std::string> order;
  std::map<std::string, std::vector<int>> by_message;
  for (int r : failed) {
    const auto m = reports[static_cast<std::size_t>(r)].value("message", std::string("failed"));
    if (!by_message.count(m)) order.push_back(m);
    by_message[m].push_back(r);
  }
  std::vector<std::string> lines;
  for (const auto& m : order) {
    const auto& ranks = by_message[m];
    if (reports.size() == 1) {
      lines.push_back(m);
      continue;
    }
    std::vector<int> others(ranks.begin() + 1, ranks.end());
    lines.push_back(who(reports, ranks.front()) + ": " + m +
                    (others.empty() ? "" : " [also rank" + std::string(others.size() > 1 ? "s " : " ") +
                                               rank_ranges(others) + "]"));
  }
  return lines;
}
}  // namespace detail

// The verdict, the same on every rank: a flag that did not parse first (the flags of
// that rank are unknown), then --help, then flags that differ between ranks (the likely
// cause of anything else), then the failed checks.
inline Verdict judge(const std::vector<nlohmann::json>& reports) {
  Verdict v;
  std::vector<int> unparsed, failed;
  std::vector<nlohmann::json> flags;
  bool help = false;
  for (std::size_t r = 0; r < reports.size(); ++r) {
    const auto& rep = reports[r];
    const bool parsed = rep.value("parsed", false);
    help = help || rep.value("help", false);
    if (!parsed && rep.value("code", 0) != 0) unparsed.push_back(static_cast<int>(r));
    if (parsed && rep.value("code", 0) != 0) failed.push_back(static_cast<int>(r));
    flags.push_back(parsed && rep.contains("flags") ? rep["flags"] : nlohmann::json());
  }
  if (!unparsed.empty()) {
    v.stop = true;
    v.code = reports[static_cast<std::size_t>(unparsed.front())].value("code", 2);
    v.lines = detail::failure_lines(reports, unparsed);
    return v;
  }
  if (help) {
    v.stop = true;
    return v;
  }
  const std::string differ = describe_rank_mismatches(flags);
  if (!differ.empty()) {
    v.stop = true;
    v.code = 2;
    v.lines.push_back("flags differ between ranks (every rank must run the same configuration): " + differ);
    return v;
  }
  if (!failed.empty()) {
    v.stop = true;
    v.code = reports[static_cast<std::size_t>(failed.front())].value("code", 1);
    v.lines = detail::failure_lines(reports, failed);
  }
  return v;
}

}  // namespace dilocox::trainer
