// reference_trainer/checkpoint_folder.hpp: what a run checks of its --checkpoint-dir before
// the first step, and the lock it holds on it for its whole life. A test write under the
// longest file name the run will write (a too-long path fails at start, not at the first
// save); the free space the folder has for the checkpoints the run keeps; an advisory lock
// (flock) on a file in the folder, which the kernel releases when the process ends however
// it ends, so a second run into a folder in use is refused naming the holder (host, pid,
// start time). Not here: the checkpoint files (checkpoint.hpp), the sums over ranks
// (train_main.cpp).
#pragma once

#include "checkpoint.hpp"

#include <dilocox/config.hpp>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <string>

namespace dilocox::trainer {

// The length of the longest file name a run with this prefix writes up to last_step (the
// temporary of its last checkpoint).
inline std::size_t longest_checkpoint_name(const std::string& prefix, std::int64_t last_step) {
  return checkpoint_path("", prefix, last_step).filename().string().size() + 4;  // + ".tmp"
}

// Creates dir if needed and writes, syncs and deletes a small file in it whose name is
// "<prefix>.write-test" padded to name_length (at least that): throws Error naming the
// folder and the reason when checkpoints could not be saved there.
inline void probe_checkpoint_dir(const std::filesystem::path& dir, const std::string& prefix,
                                 std::size_t name_length = 0) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  dilocox::detail::require(!ec, "--checkpoint-dir", dir.string() + ": cannot create the folder: " + ec.message());
  std::string name = prefix + ".write-test";
  if (name.size() < name_length) name.append(name_length - name.size(), '-');
  const auto probe = dir / name;
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  dilocox::detail::require(fd >= 0, "--checkpoint-dir",
                           dir.string() + ": cannot write in it: " + std::strerror(errno) + " (a file name of " +
                               std::to_string(name.size()) + " characters, a path of " +
                               std::to_string(probe.string().size()) + ", as the run's checkpoints will have)");
  const char bytes[8] = {'d', 'i', 'l', 'o', 'c', 'o', 'x', '\n'};
  const bool ok = ::write(fd, bytes, sizeof bytes) == static_cast<ssize_t>(sizeof bytes) && ::fsync(fd) == 0;
  const std::string why = std::strerror(errno);
  ::close(fd);
  ::unlink(probe.c_str());
  dilocox::detail::require(ok, "--checkpoint-dir", dir.string() + ": a test write failed: " + why);
}

// Bytes an unprivileged writer may still add to the filesystem that holds dir.
inline std::uint64_t free_bytes(const std::filesystem::path& dir) {
  struct statvfs st {};
  dilocox::detail::require(::statvfs(dir.c_str(), &st) == 0, "--checkpoint-dir",
                           dir.string() + ": cannot read its free space: " + std::strerror(errno));
  return static_cast<std::uint64_t>(st.f_bavail) * st.f_frsize;
}

// An exclusive advisory lock on dir/name, held until destruction or the process's end.
class FolderLock {
 public:
  FolderLock() = default;
  // Takes the lock and writes the holder's host, pid and start time into the file, or
  // throws Error naming the run that holds it.
  FolderLock(const std::filesystem::path& dir, const std::string& name) {
    const auto path = dir / name;
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    dilocox::detail::require(fd_ >= 0, "--checkpoint-dir",
                             "cannot create the lock " + path.string() + ": " + std::strerror(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      char holder[256] = {};
      const auto n = ::pread(fd_, holder, sizeof holder - 1, 0);
      ::close(fd_);
      fd_ = -1;
      if (err == EWOULDBLOCK)
        throw Error("--checkpoint-dir " + dir.string() + " is in use by another run (" +
                    (n > 0 ? std::string(holder, static_cast<std::size_t>(n)) : std::string("holder unknown")) +
                    "; it holds " + path.string() + "): wait for that run to end, or choose another folder");
      throw Error("--checkpoint-dir " + dir.string() + ": cannot lock " + path.string() + ": " + std::strerror(err));
    }
    char host[128] = {};
    ::gethostname(host, sizeof host - 1);
    char when[64] = {};
    const std::time_t now = std::time(nullptr);
    std::tm utc{};
    ::gmtime_r(&now, &utc);
    std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", &utc);
    const std::string who = "host " + std::string(host) + ", pid " + std::to_string(::getpid()) + ", started " + when;
    if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, who.data(), who.size(), 0) != static_cast<ssize_t>(who.size())) {
      const std::string why = std::strerror(errno);
      ::close(fd_);
      fd_ = -1;
      throw Error("--checkpoint-dir " + dir.string() + ": cannot write the lock " + path.string() + ": " + why);
    }
  }
  FolderLock(FolderLock&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  FolderLock& operator=(FolderLock&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;
  ~FolderLock() {
    if (fd_ >= 0) ::close(fd_);  // closing releases the lock
  }

 private:
  int fd_ = -1;
};

}  // namespace dilocox::trainer
