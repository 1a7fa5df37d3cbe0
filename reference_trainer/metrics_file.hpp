// reference_trainer/metrics_file.hpp: the --metrics JSONL file across restarts. A run
// resumed from step N first cuts the file back to the lines of steps <= N (a crashed
// run may have logged steps after its last checkpoint, and the resumed run logs them
// again), atomically (temporary file and rename), dropping a torn last line; then it
// appends. Not here: what the lines hold (train_main.cpp writes them).
#pragma once

#include <dilocox/config.hpp>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

namespace dilocox::trainer {

// Keeps the lines of path whose "step" is <= step; returns how many were dropped (lines
// that are not JSON objects with a step, such as a line cut short by a kill, are dropped).
// A missing file is left missing.
inline std::size_t cut_metrics_after(const std::string& path, std::int64_t step) {
  std::ifstream in(path);
  if (!in) return 0;
  const std::string tmp = path + ".tmp";
  std::ofstream out(tmp, std::ios::trunc);
  dilocox::detail::require(static_cast<bool>(out), "--metrics", "cannot write " + tmp);
  std::size_t dropped = 0;
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("step") && j["step"].is_number_integer() && j["step"].get<std::int64_t>() <= step)
      out << line << '\n';
    else
      ++dropped;
  }
  out.flush();
  dilocox::detail::require(static_cast<bool>(out), "--metrics", "cannot write " + tmp);
  out.close();
  std::filesystem::rename(tmp, path);
  return dropped;
}

}  // namespace dilocox::trainer
