// reference_trainer/metrics_file.hpp: the --metrics JSONL file across restarts and faults.
// A run resumed from step N first cuts the file back to the lines of steps <= N (a crashed
// run may have logged steps after its last checkpoint, and the resumed run logs them
// again), atomically (temporary file and rename), dropping a torn last line; then it
// appends. Every line written is checked: a failed or short write (a full filesystem) is
// cut back off the file, so it never ends in half a line, and counted; a file removed or
// replaced under the run (deleted, rotated) is created anew. A lost line costs that line,
// not the run: the caller warns and the summary counts them. Not here: what the lines hold
// (train_main.cpp writes them).
#pragma once

#include <dilocox/config.hpp>

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
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

// The open --metrics file of rank 0.
class MetricsFile {
 public:
  MetricsFile() = default;
  MetricsFile(const MetricsFile&) = delete;
  MetricsFile& operator=(const MetricsFile&) = delete;
  ~MetricsFile() { close(); }

  // Opens path to append (or truncated): throws Error when it cannot.
  void open(const std::string& path, bool append) {
    close();
    path_ = path;
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (append ? 0 : O_TRUNC), 0644);
    dilocox::detail::require(fd_ >= 0, "--metrics", "cannot write " + path + ": " + std::strerror(errno));
  }
  bool is_open() const { return !path_.empty(); }

  // Appends line and a newline. Returns what the caller should tell the operator (empty:
  // nothing): the first lost line and why, or that the file was created anew.
  std::string write(const std::string& line) {
    if (!is_open()) return "";
    std::string note = reopen_if_gone();
    if (fd_ < 0 || !write_whole(line + '\n')) {
      if (lost_++ == 0) {
        first_error_ = std::strerror(errno);
        note += (note.empty() ? "" : "; ") + std::string("writing --metrics ") + path_ + " failed (" + first_error_ +
                "): lines are lost until writes succeed again; training goes on";
      }
    }
    return note;
  }

  std::size_t lost_lines() const { return lost_; }
  const std::string& first_error() const { return first_error_; }
  const std::string& path() const { return path_; }

 private:
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  // The path no longer names the open file: open a new one there.
  std::string reopen_if_gone() {
    struct stat named {}, open_file {};
    if (fd_ >= 0 && ::stat(path_.c_str(), &named) == 0 && ::fstat(fd_, &open_file) == 0 &&
        named.st_ino == open_file.st_ino && named.st_dev == open_file.st_dev)
      return "";
    close();
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd_ < 0) return "";
    return "--metrics " + path_ + " was removed or replaced during the run: writing a new file there from here on";
  }

  // All of text, or nothing: a short or failed write is cut back off the file.
  bool write_whole(const std::string& text) {
    const off_t before = ::lseek(fd_, 0, SEEK_END);
    std::size_t done = 0;
    while (done < text.size()) {
      const auto n = ::write(fd_, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const int err = n < 0 ? errno : ENOSPC;
        [[maybe_unused]] const int cut = before >= 0 ? ::ftruncate(fd_, before) : 0;  // best effort
        errno = err;
        return false;
      }
      done += static_cast<std::size_t>(n);
    }
    return true;
  }

  std::string path_;
  int fd_ = -1;
  std::size_t lost_ = 0;
  std::string first_error_;
};

}  // namespace dilocox::trainer
