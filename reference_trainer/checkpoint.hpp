// reference_trainer/checkpoint.hpp: one rank's training state on disk. A file is a
// list of named sections (bytes) behind a header and before a 64-bit checksum of
// everything that precedes it. Writing is atomic: a temporary file beside the target,
// rename, then fsync of the file and of the folder; a process killed at any moment
// leaves the old file or the new one, never a mix (the rename comes before the slow
// fsyncs, so a save cut short by SIGKILL is usually already complete); a machine crash
// before the fsyncs return can leave a new file that read() refuses, so callers delete
// older files only after every rank's write returned. Reading checks magic, version,
// every length and the checksum, and names the file and the fault. Files are
// "<prefix>-step<8 digits>.ckpt"; also here: the folder's layouts and stale temporaries.
// Not here: what goes into a checkpoint (the trainer's), what a run checks of its folder
// before it starts (checkpoint_folder.hpp).
#pragma once

#include <dilocox/checksum.hpp>
#include <dilocox/config.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace dilocox::trainer {

class Checkpoint {
 public:
  template <class T>
  void put(const std::string& name, std::span<const T> data) {
    const auto b = std::as_bytes(data);
    sections_[name].assign(b.begin(), b.end());
  }
  void put_text(const std::string& name, const std::string& text) {
    put(name, std::span<const char>(text.data(), text.size()));
  }
  bool has(const std::string& name) const { return sections_.count(name) != 0; }

  // Copies section `name` into out, which must have exactly its size.
  template <class T>
  void get(const std::string& name, std::span<T> out) const {
    const auto& s = section(name);
    dilocox::detail::require(s.size() == out.size_bytes(), "Checkpoint",
                    "section '" + name + "' holds " + std::to_string(s.size()) + " bytes, this run expects " +
                        std::to_string(out.size_bytes()) + " (a different model or layout?)");
    std::memcpy(out.data(), s.data(), s.size());
  }
  std::string get_text(const std::string& name) const {
    const auto& s = section(name);
    return std::string(reinterpret_cast<const char*>(s.data()), s.size());
  }

  // The size of the file write_atomically writes.
  std::size_t file_bytes() const {
    std::size_t n = 8 + 4 + 4 + 8;  // magic, version, count, checksum
    for (const auto& [name, bytes] : sections_) n += 4 + name.size() + 8 + bytes.size();
    return n;
  }

  // The file's bytes (also what an elastic site sends a joining one).
  std::vector<std::byte> bytes() const {
    std::vector<std::byte> out;
    auto append = [&](const void* p, std::size_t n) {
      const auto* b = static_cast<const std::byte*>(p);
      out.insert(out.end(), b, b + n);
    };
    append(magic, 8);
    const std::uint32_t version = 1, count = static_cast<std::uint32_t>(sections_.size());
    append(&version, 4);
    append(&count, 4);
    for (const auto& [name, bytes] : sections_) {
      const auto name_len = static_cast<std::uint32_t>(name.size());
      const auto len = static_cast<std::uint64_t>(bytes.size());
      append(&name_len, 4);
      append(name.data(), name.size());
      append(&len, 8);
      append(bytes.data(), bytes.size());
    }
    const std::uint64_t sum = checksum64(out);
    append(&sum, 8);
    return out;
  }

  void write_atomically(const std::filesystem::path& path) const {
    const std::vector<std::byte> out = bytes();
    const auto tmp = path.string() + ".tmp";
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dilocox::detail::require(fd >= 0, "Checkpoint", "cannot create " + tmp + ": " + std::strerror(errno));
    std::size_t done = 0;
    while (done < out.size()) {
      const auto n = ::write(fd, out.data() + done, out.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const std::string why = std::strerror(errno);
        ::close(fd);
        ::unlink(tmp.c_str());
        throw Error("Checkpoint: writing " + tmp + " failed: " + why);
      }
      done += static_cast<std::size_t>(n);
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      ::unlink(tmp.c_str());
      throw Error("Checkpoint: renaming " + tmp + " failed: " + why);
    }
    const bool synced = ::fsync(fd) == 0;
    ::close(fd);
    dilocox::detail::require(synced, "Checkpoint", "fsync of " + path.string() + " failed: " + std::strerror(errno));
    const auto dir = path.parent_path().empty() ? std::filesystem::path(".") : path.parent_path();
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) {
      ::fsync(dfd);
      ::close(dfd);
    }
  }

  static Checkpoint read(const std::filesystem::path& path) {
    const std::string p = path.string();
    std::ifstream f(path, std::ios::binary);
    dilocox::detail::require(static_cast<bool>(f), "Checkpoint", "cannot open " + p);
    f.seekg(0, std::ios::end);
    std::vector<std::byte> in(static_cast<std::size_t>(std::max<std::streamoff>(0, f.tellg())));
    f.seekg(0);
    f.read(reinterpret_cast<char*>(in.data()), static_cast<std::streamsize>(in.size()));
    dilocox::detail::require(static_cast<bool>(f), "Checkpoint", "cannot read " + p);
    return parse(in, "checkpoint " + p);
  }
  // A checkpoint from bytes() (`what` names them in the errors).
  static Checkpoint parse(std::span<const std::byte> in, const std::string& what) {
    auto fail = [&](const std::string& why) { throw Error(what + " refused: " + why); };
    if (in.size() < 24) fail("truncated (" + std::to_string(in.size()) + " bytes)");
    if (std::memcmp(in.data(), magic, 8) != 0) fail("not a dilocox checkpoint (bad magic)");
    std::uint64_t stored = 0;
    std::memcpy(&stored, in.data() + in.size() - 8, 8);
    if (checksum64(std::span<const std::byte>(in.data(), in.size() - 8)) != stored)
      fail("checksum mismatch (truncated or corrupted)");
    std::uint32_t version = 0, count = 0;
    std::memcpy(&version, in.data() + 8, 4);
    std::memcpy(&count, in.data() + 12, 4);
    if (version != 1) fail("version " + std::to_string(version) + ", this build reads version 1");
    Checkpoint c;
    std::size_t at = 16;
    const std::size_t end = in.size() - 8;
    for (std::uint32_t i = 0; i < count; ++i) {
      std::uint32_t name_len = 0;
      std::uint64_t len = 0;
      if (end - at < 4) fail("section table runs past the end");
      std::memcpy(&name_len, in.data() + at, 4);
      at += 4;
      if (end - at < name_len + 8ull) fail("section name runs past the end");
      std::string name(reinterpret_cast<const char*>(in.data() + at), name_len);
      at += name_len;
      std::memcpy(&len, in.data() + at, 8);
      at += 8;
      if (end - at < len) fail("section '" + name + "' runs past the end");
      const auto from = in.subspan(at, static_cast<std::size_t>(len));
      c.sections_[name].assign(from.begin(), from.end());
      at += len;
    }
    if (at != end) fail("trailing bytes after the sections");
    return c;
  }

 private:
  const std::vector<std::byte>& section(const std::string& name) const {
    auto it = sections_.find(name);
    dilocox::detail::require(it != sections_.end(), "Checkpoint", "no section '" + name + "'");
    return it->second;
  }
  static constexpr char magic[8] = {'D', 'L', 'X', 'C', 'K', 'P', 'T', '\0'};
  std::map<std::string, std::vector<std::byte>> sections_;
};

inline std::filesystem::path checkpoint_path(const std::filesystem::path& dir, const std::string& prefix,
                                             std::int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "-step%08lld.ckpt", static_cast<long long>(step));
  return dir / (prefix + buf);
}

// Steps of the checkpoints with this prefix in dir, newest first.
inline std::vector<std::int64_t> list_checkpoints(const std::filesystem::path& dir, const std::string& prefix) {
  std::vector<std::int64_t> steps;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const auto name = e.path().filename().string();
    const std::string head = prefix + "-step";
    if (name.size() == head.size() + 8 + 5 && name.starts_with(head) && name.ends_with(".ckpt")) {
      const auto digits = name.substr(head.size(), 8);
      if (std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
        steps.push_back(std::stoll(digits));
    }
  }
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}


namespace detail {
// "<prefix>-step<8 digits><suffix>" -> prefix (empty when the name has another form).
inline std::string checkpoint_prefix_of(const std::string& name, const std::string& suffix) {
  const std::size_t n = name.size(), tail = 5 + 8 + suffix.size();  // "-step" + digits + suffix
  if (n <= tail || !name.ends_with(suffix) || name.compare(n - tail, 5, "-step") != 0) return "";
  for (std::size_t i = n - 8 - suffix.size(); i < n - suffix.size(); ++i)
    if (name[i] < '0' || name[i] > '9') return "";
  return name.substr(0, n - tail);
}
}  // namespace detail

// The prefixes (layouts: "stage0of2-replica1of2", ...) of every checkpoint in dir, sorted.
inline std::vector<std::string> checkpoint_layouts(const std::filesystem::path& dir) {
  std::vector<std::string> found;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const auto p = detail::checkpoint_prefix_of(e.path().filename().string(), ".ckpt");
    if (!p.empty() && std::find(found.begin(), found.end(), p) == found.end()) found.push_back(p);
  }
  std::sort(found.begin(), found.end());
  return found;
}

// Deletes this prefix's temporaries ("<prefix>-step*.ckpt.tmp": a save cut short by a
// kill) and its test-write file; returns how many files went.
inline int remove_stale_temporaries(const std::filesystem::path& dir, const std::string& prefix) {
  int removed = 0;
  std::error_code ec;
  std::vector<std::filesystem::path> doomed;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const auto name = e.path().filename().string();
    if (detail::checkpoint_prefix_of(name, ".ckpt.tmp") == prefix || name.starts_with(prefix + ".write-test"))
      doomed.push_back(e.path());
  }
  for (const auto& p : doomed) removed += std::filesystem::remove(p, ec) ? 1 : 0;
  return removed;
}

}  // namespace dilocox::trainer
