// reference_trainer/progress.hpp: rank 0's one-line progress display (step, loss,
// tokens/s, ETA), redrawn in place on a terminal and printed every ~5% otherwise,
// and the small formatting helpers it uses. Prints to stderr only.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

namespace dilocox::trainer {

inline std::string format_duration(double seconds) {
  if (!(seconds >= 0) || seconds > 1e8) return "?";
  const auto s = static_cast<long long>(seconds + 0.5);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", s / 3600, s / 60 % 60);
  else if (s >= 60)
    std::snprintf(buf, sizeof buf, "%lldm%02llds", s / 60, s % 60);
  else
    std::snprintf(buf, sizeof buf, "%llds", s);
  return buf;
}

class ProgressLine {
 public:
  ProgressLine(bool enabled, std::int64_t total_steps)
      : enabled_(enabled), tty_(::isatty(2) != 0), total_(total_steps),
        every_(total_steps >= 20 ? total_steps / 20 : 1) {}

  void step(std::int64_t step, double loss, double tokens_per_second, double eta_seconds) {
    if (!enabled_) return;
    char line[160];
    std::snprintf(line, sizeof line, "step %lld/%lld | loss %.4f | %.0f tok/s | ETA %s", static_cast<long long>(step),
                  static_cast<long long>(total_), loss, tokens_per_second, format_duration(eta_seconds).c_str());
    if (tty_) {
      std::fprintf(stderr, "\r%s\033[K", line);
      dirty_ = true;
    } else if (step % every_ == 0 || step == total_) {
      std::fprintf(stderr, "%s\n", line);
    }
    std::fflush(stderr);
  }

  // A line of its own (evaluation, checkpoint), not overwritten by the next step.
  void note(const std::string& text) {
    if (enabled_) warn(text);
  }

  // A line that --quiet does not hide.
  void warn(const std::string& text) {
    if (dirty_) std::fprintf(stderr, "\n");
    dirty_ = false;
    std::fprintf(stderr, "%s\n", text.c_str());
    std::fflush(stderr);
  }

  void finish() {
    if (enabled_ && dirty_) std::fprintf(stderr, "\n");
    dirty_ = false;
  }

 private:
  bool enabled_, tty_;
  std::int64_t total_, every_;
  bool dirty_ = false;
};

}  // namespace dilocox::trainer
